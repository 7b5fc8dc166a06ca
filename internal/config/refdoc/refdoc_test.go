package main

import (
	"bytes"
	"errors"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
)

var update = flag.Bool("update", false, "rewrite docs/configuration-reference.md")

// Paths from this package's directory.
const (
	configDir = ".."
	serverDir = "../../../cmd/server"
	refPath   = "../../../docs/configuration-reference.md"
)

// bundle is what the tests read: the reference as generated now.
type bundle struct {
	doc string
}

func setup(t *testing.T) bundle {
	t.Helper()
	doc, err := generate(configDir)
	if err != nil {
		t.Fatal(err)
	}
	return bundle{doc: string(doc)}
}

// keyCells are the first cells of the rows of the part of the reference
// under heading (## Environment, ## Config file), unquoted.
func (b bundle) keyCells(t *testing.T, heading string) map[string]bool {
	t.Helper()
	_, part, ok := strings.Cut(b.doc, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("the reference has no %q", heading)
	}
	if end := strings.Index(part, "\n## "); end >= 0 {
		part = part[:end]
	}
	cells := map[string]bool{}
	for _, line := range strings.Split(part, "\n") {
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			key, _, _ := strings.Cut(rest, "` |")
			cells[key] = true
		}
	}
	return cells
}

// TestReferenceCurrent fails while the committed reference differs from
// what the config package's source says now: run make generate (or this
// test with -update).
func TestReferenceCurrent(t *testing.T) {
	b := setup(t)
	if *update {
		if err := os.WriteFile(refPath, []byte(b.doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(refPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte(b.doc)) {
		t.Errorf("docs/configuration-reference.md is not what internal/config says now: run make generate and commit it (first difference at line %d)", firstDiffLine(string(got), b.doc))
	}
}

func firstDiffLine(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}

var envNameRE = regexp.MustCompile(`^(?:PATCHBAY_[A-Z0-9_]+|REDIS_URL)$`)

// envLiterals are the environment variable names spelled as string
// literals in the non-test Go files of dir: the names the loader reads
// (getenv("PATCHBAY_…")) and reports problems at.
func envLiterals(t *testing.T, dir string) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil && envNameRE.MatchString(s) {
					names[s] = true
				}
			}
			return true
		})
	}
	return names
}

// TestEnvVarsListed: every variable package config or cmd/server names in
// its code is in the reference, and every variable the reference lists is
// one package config reads (not a comment gone stale).
func TestEnvVarsListed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listed := b.keyCells(t, "## Environment")
	read := envLiterals(t, configDir)
	if !read["PATCHBAY_ADDR"] || !read["REDIS_URL"] {
		t.Fatalf("found %d variables in %s, not PATCHBAY_ADDR and REDIS_URL: the scan is broken", len(read), configDir)
	}
	named := envLiterals(t, serverDir)
	maps.Copy(named, read)
	for _, name := range slices.Sorted(maps.Keys(named)) {
		if !listed[name] {
			t.Errorf("%s is read but not in the reference: document it on its Config field as (%s, default …)", name, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(listed)) {
		if !read[name] {
			t.Errorf("the reference lists %s, which package config never reads", name)
		}
	}
}

// yamlKeys walks t as the YAML decoder does, by reflection (not by the
// source the generator reads), and returns every key path.
func yamlKeys(t reflect.Type, prefix string, out map[string]bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for f := range t.Fields() {
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		switch {
		case !f.IsExported() || tag == "-":
			continue
		case slices.Contains(strings.Split(opts, ","), "inline"):
			yamlKeys(f.Type, prefix, out)
			continue
		case name == "":
			name = strings.ToLower(f.Name)
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		out[path] = true
		ft := f.Type
		for {
			switch ft.Kind() {
			case reflect.Pointer:
				ft = ft.Elem()
				continue
			case reflect.Map:
				ft, path = ft.Elem(), path+".<name>"
				continue
			case reflect.Slice:
				ft, path = ft.Elem(), path+"[]"
				continue
			}
			break
		}
		if ft.Kind() == reflect.Struct && ft.PkgPath() == t.PkgPath() {
			yamlKeys(ft, path, out)
		}
	}
}

// TestYAMLKeysListed: every key of the config file, as the decoder reads
// it, is a row of the reference, and the reference lists no other.
func TestYAMLKeysListed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	listed := b.keyCells(t, "## Config file")
	keys := map[string]bool{}
	yamlKeys(reflect.TypeFor[config.File](), "", keys)
	if !keys["connections.<name>.mcp.command"] || !keys["triggers[].workflow"] {
		t.Fatalf("walked %d keys of config.File, not the ones every config has: the walk is broken", len(keys))
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if !listed[k] {
			t.Errorf("config file key %s is not in the reference", k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(listed)) {
		if !keys[k] {
			t.Errorf("the reference lists %s, which the config file does not have", k)
		}
	}
}

func TestParseEnvComment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text     string
		env, def, desc string
		err            error
	}{
		{name: "line", text: "PATCHBAY_ADDR, default 127.0.0.1:8080: the listen address",
			env: "PATCHBAY_ADDR", def: "127.0.0.1:8080", desc: "The listen address"},
		{name: "doc", text: "ClaimTimeout (PATCHBAY_CLAIM_TIMEOUT, default 10s) is how long a claim lasts.",
			env: "PATCHBAY_CLAIM_TIMEOUT", def: "10s", desc: "ClaimTimeout is how long a claim lasts."},
		{name: "doc, parentheses in the default", text: "PublicURL (PATCHBAY_PUBLIC_URL, default http://<PATCHBAY_ADDR> (as listened)) is where browsers reach it.",
			env: "PATCHBAY_PUBLIC_URL", def: "http://<PATCHBAY_ADDR> (as listened)", desc: "PublicURL is where browsers reach it."},
		{name: "doc, clause after", text: "StartTriggers starts them at boot (PATCHBAY_START_TRIGGERS, default true); when false, a request does.",
			env: "PATCHBAY_START_TRIGGERS", def: "true", desc: "StartTriggers starts them at boot; when false, a request does."},
		{name: "no variable", text: "Limits bound what one client can hold.", err: errNoEnv},
		{name: "no default", text: "PATCHBAY_SECRET_KEY", err: errNoDefault},
		{name: "default elsewhere", text: "ProfilesDir (PATCHBAY_PROFILES_DIR) is a directory. Default none.", err: errNoDefault},
		{name: "variable mid-sentence", text: "Keys come from PATCHBAY_API_KEYS, default none: keys", err: errNoDefault},
		{name: "no description", text: "PATCHBAY_ADDR, default 127.0.0.1:8080", err: errNoDesc},
		{name: "unclosed", text: "Addr (PATCHBAY_ADDR, default x is it.", err: errNoDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env, def, desc, err := parseEnvComment(tc.text)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if tc.err != nil {
				return
			}
			if env != tc.env || def != tc.def || desc != tc.desc {
				t.Errorf("got (%q, %q, %q), want (%q, %q, %q)", env, def, desc, tc.env, tc.def, tc.desc)
			}
		})
	}
}

func TestFindDefault(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]string{
		"connect timeout, default 30000":                                 "30000",
		"bounds one message, default 16 MiB, so a runaway server cannot": "16 MiB",
		"is remembered. Default 168h (senders retry for days).":          "168h",
		"Default 5.": "5",
		"bounds one node run (default 10 minutes).":                        "10 minutes",
		"is the root; default https://api.github.com.":                     "https://api.github.com",
		"Determinism: replayable | costly | unsafe (default), what it is":  "unsafe",
		"none, same-origin (the default: GET and HEAD) or any":             "same-origin",
		"all (default, at most MaxCatchUp of the latest), latest, or none": "all",
		"A property's default is used when a document leaves it out.":      "",
		"is refused, unless Default is set.":                               "",
		"0 means DefaultPoolWait.":                                         "",
		"in JSON values and bytes (defaults 10,000 and 1 MiB)":             "",
		"Default, when set, is the allowlist":                              "",
	} {
		if got := findDefault(text); got != want {
			t.Errorf("findDefault(%q) = %q, want %q", text, got, want)
		}
	}
}

// TestSharedComment: fields one comment documents together each get the
// default its clauses give them, and a pointer to the comment.
func TestSharedComment(t *testing.T) {
	t.Parallel()
	fs := []field{
		{name: "MaxManifestBytes", key: "maxManifestBytes", doc: "MaxManifestBytes bounds all operations (default 32 MiB) and MaxOperations their number (default 5,000).", first: 1, last: 1},
		{name: "MaxOperations", key: "maxOperations", first: 2, last: 2},
		{name: "Unrelated", key: "unrelated", first: 3, last: 3},
	}
	for i, want := range [][2]string{
		{"32 MiB", "`maxManifestBytes` bounds all operations (default 32 MiB) and MaxOperations their number (default 5,000)."},
		{"5,000", "See `maxManifestBytes`."},
		{"", ""},
	} {
		if def, desc := describe(fs, i); def != want[0] || desc != want[1] {
			t.Errorf("describe(%s) = (%q, %q), want (%q, %q)", fs[i].name, def, desc, want[0], want[1])
		}
	}
}

func TestHeaderSaysGenerated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	head, _, _ := strings.Cut(b.doc, "\n\n- [")
	for _, want := range []string{"generated by `make generate`", "`internal/config`", "do not edit it by hand"} {
		if !strings.Contains(oneLine(head), want) {
			t.Errorf("the header does not say %q:\n%s", want, head)
		}
	}
}
