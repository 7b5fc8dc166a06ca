package profiles

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"gopkg.in/yaml.v3"
)

//go:embed builtin/*.yaml bindings/*.yaml
var shipped embed.FS

// Catalog holds the profiles and bindings one server knows: the shipped
// ones and those of the configured directory. It is built at start and
// read-only afterwards, so it needs no lock.
type Catalog struct {
	profiles map[string][]*Profile // by name, newest version first
	bindings map[string]*Binding
}

// Builtin returns a catalog of the profiles and bindings shipped in the
// binary. They are tested to load, so a failure is a build defect.
func Builtin() *Catalog {
	c := &Catalog{profiles: map[string][]*Profile{}, bindings: map[string]*Binding{}}
	for _, dir := range []string{"builtin", "bindings"} {
		entries, err := shipped.ReadDir(dir)
		if err != nil {
			panic(err)
		}
		for _, e := range entries {
			path := dir + "/" + e.Name()
			data, err := shipped.ReadFile(path)
			if err == nil {
				err = c.add(path, data)
			}
			if err != nil {
				panic(fmt.Sprintf("profiles: shipped %v", err))
			}
		}
	}
	return c
}

// LoadDir adds every *.yaml, *.yml and *.json file of dir: a file with a
// top-level "profile" is a profile, one with "binding" a binding. The
// first bad file is an error naming its path. Profiles are added before
// bindings, so a binding may name a profile whichever file sorts first.
func (c *Catalog) LoadDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("profiles: read directory: %w", err)
	}
	var bindings []string
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".yaml" && ext != ".yml" && ext != ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("profiles: %w", err)
		}
		if isBinding(data) {
			bindings = append(bindings, path)
			continue
		}
		if err := c.add(path, data); err != nil {
			return err
		}
	}
	for _, path := range bindings {
		data, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("profiles: %w", err)
		}
		if err := c.add(path, data); err != nil {
			return err
		}
	}
	return nil
}

// isBinding reports whether a file's top level names a binding (a file
// that does not decode is left to add, which reports it).
func isBinding(data []byte) bool {
	var head map[string]any
	if decodeLoose(data, &head) != nil {
		return false
	}
	_, ok := head["binding"]
	return ok
}

func (c *Catalog) add(path string, data []byte) error {
	var head map[string]any
	if err := decodeLoose(data, &head); err != nil {
		return &FileError{Path: path, Problems: []Problem{{Message: err.Error()}}}
	}
	if _, ok := head["binding"]; ok {
		b, err := ParseBinding(path, data, c)
		if err != nil {
			return err
		}
		if _, dup := c.bindings[b.Name]; dup {
			return &FileError{Path: path, Problems: []Problem{{Pointer: "/binding", Message: fmt.Sprintf("binding %q is defined twice", b.Name)}}}
		}
		c.bindings[b.Name] = b
		return nil
	}
	p, err := Parse(path, data)
	if err != nil {
		return err
	}
	for _, q := range c.profiles[p.Name] {
		if q.Version.Equal(p.Version) {
			return &FileError{Path: path, Problems: []Problem{{Pointer: "/version", Message: fmt.Sprintf("%s is already defined by %s", p.ID(), q.Source)}}}
		}
	}
	list := append(c.profiles[p.Name], p)
	slices.SortFunc(list, func(a, b *Profile) int { return b.Version.Compare(a.Version) })
	c.profiles[p.Name] = list
	return nil
}

func decodeLoose(data []byte, v any) error { return yaml.Unmarshal(data, v) }

// Known reports whether any version of the named profile is defined.
func (c *Catalog) Known(name string) bool { return len(c.profiles[name]) > 0 }

// Names lists the defined profiles as name@version, for errors and docs.
func (c *Catalog) Names() []string {
	var out []string
	for _, name := range sortedKeys(c.profiles) {
		for _, p := range c.profiles[name] {
			out = append(out, p.ID())
		}
	}
	return out
}

// Match returns the newest definition of name within cons.
func (c *Catalog) Match(name string, cons *semver.Constraints) (*Profile, bool) {
	for _, p := range c.profiles[name] {
		if cons == nil || cons.Check(p.Version) {
			return p, true
		}
	}
	return nil, false
}

// ForVersion returns the definition to check a server implementing
// name@v against: the newest one of the same major version not newer than
// v (a minor version only adds), else the oldest of that major.
func (c *Catalog) ForVersion(name string, v *semver.Version) (*Profile, bool) {
	var oldest *Profile
	for _, p := range c.profiles[name] {
		if p.Version.Major() != v.Major() {
			continue
		}
		if !p.Version.GreaterThan(v) {
			return p, true
		}
		oldest = p
	}
	return oldest, oldest != nil
}

// BindingNames lists the defined bindings, for errors.
func (c *Catalog) BindingNames() []string { return sortedKeys(c.bindings) }

// Binding returns the named binding.
func (c *Catalog) Binding(name string) (*Binding, bool) {
	b, ok := c.bindings[name]
	return b, ok
}

// ParseRef splits "browser@^1.2" into its name and range.
func ParseRef(s string) (string, *semver.Constraints, error) {
	name, rng, ok := strings.Cut(s, "@")
	if !ok || !profileName.MatchString(name) || rng == "" {
		return "", nil, fmt.Errorf("must be \"<profile>@<version range>\", e.g. \"browser@^1.2\", got %q", s)
	}
	cons, err := semver.NewConstraint(rng)
	if err != nil {
		return "", nil, fmt.Errorf("%q is not a version range: %w", rng, err)
	}
	return name, cons, nil
}

// Tool is what Check needs of a server's tool.
type Tool struct {
	Name        string
	InputSchema json.RawMessage
}

// Check compares a declaring server's tools with the profile it declares
// and returns every contradiction, in operation order: a required
// operation with no tool of its name; a property the profile requires that
// the tool's schema does not take; a property the tool requires that the
// profile does not define (a caller written against the profile would
// never send it); a property both define with different types.
func Check(p *Profile, tools []Tool) error {
	byName := map[string]Tool{}
	for _, t := range tools {
		byName[t.Name] = t
	}
	var errs []error
	for _, name := range p.OperationNames() {
		op := p.Operations[name]
		t, ok := byName[name]
		if !ok {
			if !op.Optional {
				errs = append(errs, fmt.Errorf("missing operation %s", name))
			}
			continue
		}
		errs = append(errs, compatible(name, op.Input, t.InputSchema)...)
	}
	if len(errs) > 0 {
		return fmt.Errorf("server contradicts %s: %w", p.ID(), errors.Join(errs...))
	}
	return nil
}

func compatible(op string, profile, tool json.RawMessage) []error {
	pp, tp := properties(profile), properties(tool)
	var errs []error
	if tp != nil {
		for _, f := range required(profile) {
			if _, ok := tp[f]; !ok {
				errs = append(errs, fmt.Errorf("operation %s: the tool does not take %q, which the profile requires", op, f))
			}
		}
	}
	for _, f := range required(tool) {
		if _, ok := pp[f]; !ok {
			errs = append(errs, fmt.Errorf("operation %s: the tool requires %q, which the profile does not define", op, f))
		}
	}
	for _, f := range sortedKeys(pp) {
		pt, tt := typeOf(pp[f]), typeOf(tp[f])
		if pt != "" && tt != "" && pt != tt {
			errs = append(errs, fmt.Errorf("operation %s: %q is %s in the tool and %s in the profile", op, f, tt, pt))
		}
	}
	return errs
}

func typeOf(prop any) string {
	m, _ := prop.(map[string]any)
	t, _ := m["type"].(string)
	return t
}
