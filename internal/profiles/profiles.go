// Package profiles owns connection profiles: shared, versioned vocabularies
// (browser@1, chat@1) that a connection may speak, defined as data. It
// parses and validates profile and binding files, ships the built-in ones
// (embedded in the binary), resolves "name@range" references, checks a
// server's tools against a profile it declares, and maps a profile's
// operations onto the tools of a server that declares nothing (a binding).
//
// # A profile file
//
// YAML (JSON is valid YAML), one profile per file:
//
//	profile: chat                 # a lower-case name: letters, digits, '-'
//	version: 1.0.0                # semver
//	description: …
//	determinism: unsafe           # replayable | costly | unsafe: what a resumed run does after the server was replaced
//	refs:                         # opaque handles the profile's values carry
//	  chat.thread: { description: … }
//	operations:
//	  chat.post:                  # dotted lower-case words
//	    description: …
//	    input:  { JSON Schema }   # the arguments (required)
//	    output: { JSON Schema }   # the result, checked after every call (optional)
//	    effects: true             # it changes the world
//	    once: true                # a repeated idempotency key must not act again
//	    guarded: false            # needs approval unless the connection's policy allows it
//	    readOnly: false
//	    optional: false           # a declaring server may leave it out
//	eager: [chat.post, chat.reply] # the common operations: a model is given each as a tool of
//	                              # its own; the rest it reaches through <connection>_call (absent:
//	                              # every operation; []: none). See Profile.IsEager.
//	reads:                        # state worth showing the model
//	  chat.thread.recent:
//	    output: { JSON Schema }
//	    look: turn                # turn | effect | ask: when it is read by default
//	    render: 'expression'      # a brief text of the read, an expression over `value`
//	    sensitive: [/data]        # JSON Pointers of blob fields never shown to a model
//	events:
//	  chat.message.created:
//	    payload: { JSON Schema }
//	    thread: payload.thread    # the event's natural thread, an expression over `payload`
//	setup:                        # what a pool's fresh connection is set up with
//	  schema: { JSON Schema }
//	  hostOnly: [executable]      # fields only the pool's own setup may give
//	  sensitive: [/storageState]
//
// Schemas are compiled with the JSON Schema library the gates use
// (santhosh-tekuri/jsonschema, draft 2020-12 by default) and expressions with
// package sandbox, when the file is loaded: a bad file is an error naming
// its path and the JSON Pointer of the problem, so a server refuses to start
// with it.
//
// # Declaring a profile
//
// An MCP server declares the profiles it speaks in its initialize result,
// under capabilities.experimental["io.patchbay/profiles"], as a map of
// profile name to the version it implements: {"chat": "1.0.0"}. Its tools
// are then named as the profile's operations (chat.post). See Check for what
// counts as a contradiction.
//
// # A binding file
//
// A server that declares nothing is mapped onto a profile by a binding (see
// Binding): `binding: <name>` instead of `profile:`.
package profiles

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/expr-lang/expr/types"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"

	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// DeclarationKey is the experimental capability an MCP server declares its
// profiles under.
const DeclarationKey = "io.patchbay/profiles"

// Look timings of a read.
const (
	LookTurn   = "turn"   // before every model round
	LookEffect = "effect" // after a round whose calls had effects
	LookAsk    = "ask"    // only when the model asks
)

// Profile is one version of a vocabulary.
type Profile struct {
	Name        string
	Version     *semver.Version
	Description string
	Determinism string
	Refs        map[string]Ref
	Operations  map[string]*Operation
	Reads       map[string]*Read
	Events      map[string]*Event
	Setup       *Setup
	// Eager lists the operations a model is offered as tools of their own
	// by default (a connection's expose setting left out); nil means every
	// operation. See IsEager.
	Eager []string
	// Source is the file it was loaded from ("builtin/chat.yaml" for the
	// shipped ones), for errors and the admin UI.
	Source string
}

// ID is "name@version".
func (p *Profile) ID() string { return p.Name + "@" + p.Version.String() }

// OperationNames lists the operations in name order.
func (p *Profile) OperationNames() []string { return sortedKeys(p.Operations) }

// IsEager reports whether op is in the profile's eager set: its common
// operations, which a model gets as tools of their own while the rest wait
// behind <connection>_call. A profile that lists no eager set has every
// operation eager, so a small profile needs no list.
func (p *Profile) IsEager(op string) bool {
	if _, ok := p.Operations[op]; !ok {
		return false
	}
	return p.Eager == nil || slices.Contains(p.Eager, op)
}

// Ref is a kind of opaque handle the profile's values carry.
type Ref struct {
	Description string `json:"description,omitempty"`
}

// Operation is one callable thing of a profile.
type Operation struct {
	Description string          `json:"description,omitempty"`
	Input       json.RawMessage `json:"input"`
	Output      json.RawMessage `json:"output,omitempty"`
	Effects     bool            `json:"effects,omitempty"`
	Once        bool            `json:"once,omitempty"`
	Guarded     bool            `json:"guarded,omitempty"`
	ReadOnly    bool            `json:"readOnly,omitempty"`
	Optional    bool            `json:"optional,omitempty"`

	input, output *jsonschema.Schema
}

// CheckInput validates arguments against the operation's input schema.
func (o *Operation) CheckInput(args any) error { return validate(o.input, args) }

// CheckOutput validates a result against the output schema (nil: anything).
func (o *Operation) CheckOutput(out any) error { return validate(o.output, out) }

// Read is a piece of state worth showing the model.
type Read struct {
	Description string          `json:"description,omitempty"`
	Output      json.RawMessage `json:"output"`
	Look        string          `json:"look"`
	Render      string          `json:"render,omitempty"`
	Sensitive   []string        `json:"sensitive,omitempty"`

	output *jsonschema.Schema
	render *sandbox.Program
}

// CheckOutput validates a read's value against its output schema.
func (r *Read) CheckOutput(v any) error { return validate(r.output, v) }

// Text is the brief text of a read's value the model is shown: the render
// expression's result (a string as is, anything else as JSON), or the
// value as JSON when the read has no render. Callers withhold sensitive
// fields from v first; the expression sees only what it is given.
func (r *Read) Text(ctx context.Context, v any) (string, error) {
	out := v
	if r.render != nil {
		var err error
		if out, err = r.render.Run(ctx, map[string]any{"value": v}); err != nil {
			return "", fmt.Errorf("render: %w", err)
		}
	}
	if s, ok := out.(string); ok {
		return s, nil
	}
	b, err := json.Marshal(out)
	if err != nil {
		return "", fmt.Errorf("render: %w", err)
	}
	return string(b), nil
}

// Event is something a connection of the profile reports.
type Event struct {
	Description string          `json:"description,omitempty"`
	Payload     json.RawMessage `json:"payload"`
	Thread      string          `json:"thread,omitempty"`

	payload *jsonschema.Schema
	thread  *sandbox.Program
}

// CheckPayload validates an event's payload against the payload schema.
func (e *Event) CheckPayload(payload any) error { return validate(e.payload, payload) }

// ThreadOf is the event's natural thread: its thread expression over
// payload, as a string; "" when the event defines none or the payload
// names none.
func (e *Event) ThreadOf(ctx context.Context, payload any) (string, error) {
	if e.thread == nil {
		return "", nil
	}
	v, err := e.thread.Run(ctx, map[string]any{"payload": payload})
	if err != nil {
		return "", fmt.Errorf("thread of the event: %w", err)
	}
	if v == nil {
		return "", nil
	}
	return fmt.Sprint(v), nil
}

// Setup describes what a pool's fresh connection is set up with.
type Setup struct {
	Schema    json.RawMessage `json:"schema"`
	HostOnly  []string        `json:"hostOnly,omitempty"`
	Sensitive []string        `json:"sensitive,omitempty"`
}

type file struct {
	Profile     string                `json:"profile"`
	Version     any                   `json:"version"` // a string; any, so a YAML number is reported at /version
	Description string                `json:"description,omitempty"`
	Determinism string                `json:"determinism,omitempty"`
	Refs        map[string]Ref        `json:"refs,omitempty"`
	Operations  map[string]*Operation `json:"operations"`
	Reads       map[string]*Read      `json:"reads,omitempty"`
	Events      map[string]*Event     `json:"events,omitempty"`
	Setup       *Setup                `json:"setup,omitempty"`
	Eager       []string              `json:"eager,omitempty"`
}

// Problem is one thing wrong with a file, at a JSON Pointer.
type Problem struct {
	Pointer string
	Message string
}

// FileError is a profile or binding file that cannot be used.
type FileError struct {
	Path     string
	Problems []Problem
}

func (e *FileError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		ptr := p.Pointer
		if ptr == "" {
			ptr = "/"
		}
		parts[i] = ptr + ": " + p.Message
	}
	return "profile file " + e.Path + ": " + strings.Join(parts, "; ")
}

var (
	profileName = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	dottedName  = regexp.MustCompile(`^[a-z][a-zA-Z0-9_]*(\.[a-z][a-zA-Z0-9_]*)*$`)
)

// decode reads YAML or JSON into v, refusing unknown fields. YAML is read
// as a generic value first and re-encoded, so schemas (maps of anything)
// come through as JSON.
func decode(data []byte, v any) error {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return err
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return fmt.Errorf("not JSON-compatible (keys must be strings): %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// Parse parses and validates one profile file; path names it in errors.
func Parse(path string, data []byte) (*Profile, error) {
	var f file
	if err := decode(data, &f); err != nil {
		return nil, &FileError{Path: path, Problems: []Problem{{Message: err.Error()}}}
	}
	v := &checker{path: path}
	p := v.profile(&f)
	if len(v.problems) > 0 {
		return nil, &FileError{Path: path, Problems: v.problems}
	}
	p.Source = path
	return p, nil
}

type checker struct {
	path     string
	problems []Problem
}

func (c *checker) fail(ptr, format string, args ...any) {
	c.problems = append(c.problems, Problem{Pointer: ptr, Message: fmt.Sprintf(format, args...)})
}

func (c *checker) profile(f *file) *Profile {
	p := &Profile{Name: f.Profile, Description: f.Description, Determinism: f.Determinism, Refs: f.Refs,
		Operations: f.Operations, Reads: f.Reads, Events: f.Events, Setup: f.Setup, Eager: f.Eager}
	if !profileName.MatchString(f.Profile) {
		c.fail("/profile", "must be a lower-case name (letters, digits, '-'), got %q", f.Profile)
	}
	s, isString := f.Version.(string)
	v, err := semver.StrictNewVersion(s)
	if !isString {
		c.fail("/version", "must be a semantic version written as a string (\"1.0.0\")")
		v = semver.MustParse("0.0.0")
	} else if err != nil {
		c.fail("/version", "must be a semantic version (1.2.0): %v", err)
		v = semver.MustParse("0.0.0")
	}
	p.Version = v
	switch f.Determinism {
	case "", "replayable", "costly", "unsafe":
	default:
		c.fail("/determinism", "must be replayable, costly or unsafe")
	}
	if len(f.Operations) == 0 {
		c.fail("/operations", "must define at least one operation")
	}
	for _, name := range sortedKeys(f.Refs) {
		c.name("/refs/"+escape(name), name)
	}
	for _, name := range sortedKeys(f.Operations) {
		c.operation(name, f.Operations[name])
	}
	for _, name := range sortedKeys(f.Reads) {
		c.read(name, f.Reads[name])
	}
	for _, name := range sortedKeys(f.Events) {
		c.event(name, f.Events[name])
	}
	if f.Setup != nil {
		c.setup(f.Setup)
	}
	c.eager(f.Eager, f.Operations)
	return p
}

func (c *checker) name(at, name string) {
	if !dottedName.MatchString(name) {
		c.fail(at, "%q is not a name of dotted lower-case words (ui.click)", name)
	}
}

func (c *checker) operation(name string, op *Operation) {
	at := "/operations/" + escape(name)
	c.name(at, name)
	if op == nil {
		c.fail(at, "must be an object")
		return
	}
	if len(op.Input) == 0 {
		c.fail(at+"/input", "is required (a JSON Schema of the arguments)")
	}
	op.input = c.schema(at+"/input", op.Input, true)
	op.output = c.schema(at+"/output", op.Output, false)
	if op.ReadOnly && (op.Effects || op.Once) {
		c.fail(at+"/readOnly", "a read-only operation has no effects and nothing to do once")
	}
}

// eager checks the eager set: operations of the profile, each once.
func (c *checker) eager(names []string, ops map[string]*Operation) {
	seen := map[string]bool{}
	for i, name := range names {
		at := fmt.Sprintf("/eager/%d", i)
		if _, ok := ops[name]; !ok {
			c.fail(at, "%q is not an operation of this profile", name)
		} else if seen[name] {
			c.fail(at, "%q is listed twice", name)
		}
		seen[name] = true
	}
}

func (c *checker) read(name string, r *Read) {
	at := "/reads/" + escape(name)
	c.name(at, name)
	if r == nil {
		c.fail(at, "must be an object")
		return
	}
	switch r.Look {
	case LookTurn, LookEffect, LookAsk:
	default:
		c.fail(at+"/look", "must be turn, effect or ask")
	}
	if len(r.Output) == 0 {
		c.fail(at+"/output", "is required (a JSON Schema of the read)")
	}
	r.output = c.schema(at+"/output", r.Output, false)
	c.pointers(at+"/sensitive", r.Sensitive, r.Output)
	if r.Render != "" {
		r.render = c.expr(at+"/render", r.Render, "value")
	}
}

func (c *checker) event(name string, e *Event) {
	at := "/events/" + escape(name)
	c.name(at, name)
	if e == nil {
		c.fail(at, "must be an object")
		return
	}
	if len(e.Payload) == 0 {
		c.fail(at+"/payload", "is required (a JSON Schema of the payload)")
	}
	e.payload = c.schema(at+"/payload", e.Payload, false)
	if e.Thread != "" {
		e.thread = c.expr(at+"/thread", e.Thread, "payload")
	}
}

func (c *checker) setup(s *Setup) {
	if len(s.Schema) == 0 {
		c.fail("/setup/schema", "is required")
		return
	}
	c.schema("/setup/schema", s.Schema, false)
	props := properties(s.Schema)
	for i, f := range s.HostOnly {
		if _, ok := props[f]; !ok {
			c.fail(fmt.Sprintf("/setup/hostOnly/%d", i), "%q is not a property of the setup schema", f)
		}
	}
	c.pointers("/setup/sensitive", s.Sensitive, s.Schema)
}

// pointers checks that each sensitive pointer names a top-level property
// of schema: blobs are fields of a value, and deeper ones are not withheld
// reliably by the renderers that read this list.
func (c *checker) pointers(at string, ptrs []string, schema json.RawMessage) {
	props := properties(schema)
	for i, p := range ptrs {
		field, ok := strings.CutPrefix(p, "/")
		if _, known := props[unescape(field)]; !ok || strings.Contains(field, "/") || !known {
			c.fail(fmt.Sprintf("%s/%d", at, i), "%q must be a JSON Pointer to a top-level property of the schema", p)
		}
	}
}

func (c *checker) schema(at string, raw json.RawMessage, required bool) *jsonschema.Schema {
	if len(raw) == 0 {
		return nil
	}
	sch, err := compile(c.path+"#"+at, raw)
	if err != nil {
		c.fail(at, "%v", err)
		return nil
	}
	if required {
		var top map[string]any
		if json.Unmarshal(raw, &top) != nil || top["type"] != "object" {
			c.fail(at, "must be an object schema (type: object)")
		}
	}
	return sch
}

func (c *checker) expr(at, src, variable string) *sandbox.Program {
	prog, err := sandbox.Compile(src, types.Map{variable: types.Any})
	if err != nil {
		c.fail(at, "expression does not compile: %v", err)
		return nil
	}
	return prog
}

// compile compiles one schema; url only names it in errors.
func compile(url string, raw json.RawMessage) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	comp := jsonschema.NewCompiler()
	url = "mem:///" + strings.NewReplacer(" ", "_", "#", "/").Replace(url)
	if err := comp.AddResource(url, doc); err != nil {
		return nil, err
	}
	sch, err := comp.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("schema does not compile: %w", err)
	}
	return sch, nil
}

func validate(sch *jsonschema.Schema, v any) error {
	if sch == nil {
		return nil
	}
	// The validator wants JSON values (float64, map[string]any); a round
	// trip gives them whatever Go types v holds.
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return err
	}
	return sch.Validate(doc)
}

// properties returns a schema's top-level properties, nil when it has none.
func properties(raw json.RawMessage) map[string]any {
	var s struct {
		Properties map[string]any `json:"properties"`
	}
	_ = json.Unmarshal(raw, &s)
	return s.Properties
}

func required(raw json.RawMessage) []string {
	var s struct {
		Required []string `json:"required"`
	}
	_ = json.Unmarshal(raw, &s)
	return s.Required
}

// The JSON Pointer token escapers, built once.
var (
	pointerEscaper   = strings.NewReplacer("~", "~0", "/", "~1")
	pointerUnescaper = strings.NewReplacer("~1", "/", "~0", "~")
)

func escape(s string) string   { return pointerEscaper.Replace(s) }
func unescape(s string) string { return pointerUnescaper.Replace(s) }

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
