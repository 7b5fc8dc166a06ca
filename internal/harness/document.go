package harness

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Node kinds.
const (
	KindSequence = "sequence"
	KindCall     = "call"
)

// kinds that later issues add; refused by name so the message is useful.
var laterKinds = []string{"wait", "verify", "parallel", "model"}

// Later manifest entry fields: refused as not yet supported rather than
// unknown, since the document format defines them.
var laterEntryFields = []string{"profile", "extensions", "events", "from", "fresh", "setup", "mcp"}

// Document is a parsed and validated workflow document, ready to run.
type Document struct {
	Version     int
	Connections []string
	Root        *Node
}

// Node is one step of a document.
type Node struct {
	Kind       string
	ID         string
	Path       string // JSON Pointer of the node in the document
	Steps      []*Node
	Connection string
	Op         string
	Args       map[string]value
}

// ParseDocument parses raw as a workflow document and validates it against
// the connections of reg. Every problem is reported, as a *ValidationError
// whose paths are JSON Pointers prefixed with base (the document's place in
// the request body, e.g. "/workflow").
func ParseDocument(raw []byte, reg *Registry, base string) (*Document, error) {
	var doc any
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&doc); err != nil {
		return nil, &ValidationError{Problems: []FieldError{{Path: base, Code: CodeValidationFailed, Message: "not valid JSON: " + err.Error()}}}
	}
	p := &parser{reg: reg, ids: map[string]string{}, done: map[string]bool{}}
	d := p.document(doc, base)
	if len(p.problems) > 0 {
		return nil, &ValidationError{Problems: p.problems}
	}
	return d, nil
}

type parser struct {
	reg      *Registry
	declared map[string]bool
	ids      map[string]string // step id → path where first seen
	done     map[string]bool   // ids whose output is available to later steps
	problems []FieldError
}

func (p *parser) fail(path string, code Code, format string, args ...any) {
	p.problems = append(p.problems, FieldError{Path: path, Code: code, Message: fmt.Sprintf(format, args...)})
}

func (p *parser) document(v any, path string) *Document {
	obj, ok := p.object(v, path, "version", "connections", "root")
	if !ok {
		return nil
	}
	d := &Document{}
	switch ver, ok := obj["version"].(float64); {
	case obj["version"] == nil:
		p.fail(path+"/version", CodeValidationFailed, "is required and must be 1")
	case !ok || ver != 1:
		p.fail(path+"/version", CodeValidationFailed, "must be 1")
	default:
		d.Version = 1
	}
	d.Connections = p.connections(obj["connections"], path+"/connections")
	p.declared = map[string]bool{}
	for _, name := range d.Connections {
		p.declared[name] = true
	}
	if obj["root"] == nil {
		p.fail(path+"/root", CodeValidationFailed, "is required")
		return d
	}
	d.Root = p.node(obj["root"], path+"/root")
	return d
}

func (p *parser) connections(v any, path string) []string {
	if v == nil {
		return nil
	}
	obj, ok := v.(map[string]any)
	if !ok {
		p.fail(path, CodeValidationFailed, "must be an object mapping connection names to entries")
		return nil
	}
	names := make([]string, 0, len(obj))
	for _, name := range sortedKeys(obj) {
		at := path + "/" + escape(name)
		names = append(names, name)
		switch _, err := p.reg.Get(name); {
		case !ValidName(name):
			p.fail(at, CodeConnectionInvalid, "%q is not a valid connection name", name)
		case err != nil:
			p.fail(at, CodeConnectionUnknown, "no connection named %q", name)
		}
		entry, ok := obj[name].(map[string]any)
		if !ok {
			p.fail(at, CodeValidationFailed, "must be an object")
			continue
		}
		for _, f := range sortedKeys(entry) {
			if slices.Contains(laterEntryFields, f) {
				p.fail(at+"/"+escape(f), CodeNotSupported, "%q is not yet supported", f)
			} else {
				p.fail(at+"/"+escape(f), CodeValidationFailed, "unknown field %q", f)
			}
		}
	}
	return names
}

func (p *parser) node(v any, path string) *Node {
	obj, ok := v.(map[string]any)
	if !ok {
		p.fail(path, CodeValidationFailed, "must be an object")
		return nil
	}
	kind, _ := obj["kind"].(string)
	switch {
	case kind == KindSequence:
		return p.sequence(obj, path)
	case kind == KindCall:
		return p.call(obj, path)
	case slices.Contains(laterKinds, kind):
		p.fail(path+"/kind", CodeNotSupported, "kind %q is not yet supported", kind)
	case obj["kind"] == nil:
		p.fail(path+"/kind", CodeValidationFailed, "is required (sequence or call)")
	default:
		p.fail(path+"/kind", CodeValidationFailed, "unknown kind %v (sequence or call)", obj["kind"])
	}
	return nil
}

func (p *parser) sequence(obj map[string]any, path string) *Node {
	p.checkFields(obj, path, "kind", "id", "steps")
	n := &Node{Kind: KindSequence, ID: p.id(obj["id"], path), Path: path}
	steps, ok := obj["steps"].([]any)
	if !ok || len(steps) == 0 {
		p.fail(path+"/steps", CodeValidationFailed, "must be a non-empty array of steps")
	}
	for i, s := range steps {
		if child := p.node(s, path+"/steps/"+strconv.Itoa(i)); child != nil {
			n.Steps = append(n.Steps, child)
		}
	}
	p.done[n.ID] = true
	return n
}

func (p *parser) call(obj map[string]any, path string) *Node {
	p.checkFields(obj, path, "kind", "id", "connection", "op", "args")
	n := &Node{Kind: KindCall, ID: p.id(obj["id"], path), Path: path}
	n.Connection, _ = obj["connection"].(string)
	n.Op, _ = obj["op"].(string)
	p.target(n, obj, path)
	if a, ok := obj["args"]; ok {
		args, ok := a.(map[string]any)
		if !ok {
			p.fail(path+"/args", CodeValidationFailed, "must be an object")
		}
		n.Args = map[string]value{}
		for _, k := range sortedKeys(args) {
			n.Args[k] = p.value(args[k], path+"/args/"+escape(k))
		}
	}
	p.done[n.ID] = true
	return n
}

// target checks that a call names a declared connection and an operation
// its manifest has.
func (p *parser) target(n *Node, obj map[string]any, path string) {
	if n.Connection == "" {
		p.fail(path+"/connection", CodeValidationFailed, "is required and must be a connection name")
		return
	}
	conn, err := p.reg.Get(n.Connection)
	switch {
	case err != nil:
		p.fail(path+"/connection", CodeConnectionUnknown, "no connection named %q", n.Connection)
		return
	case !p.declared[n.Connection]:
		p.fail(path+"/connection", CodeValidationFailed, "connection %q is not declared in the document's connections", n.Connection)
		return
	}
	if n.Op == "" {
		p.fail(path+"/op", CodeValidationFailed, "is required and must be an operation name")
		return
	}
	if st := conn.Status(); st.State != StateReady {
		p.fail(path+"/op", CodeConnectionUnavailable, "connection %q is %s, so operation %q cannot be checked", n.Connection, st.State, n.Op)
		return
	}
	if _, ok := conn.Manifest().Operation(n.Op); !ok {
		p.fail(path+"/op", CodeOperationUnknown, "connection %q has no operation %q", n.Connection, n.Op)
	}
}

func (p *parser) id(v any, path string) string {
	id, ok := v.(string)
	switch {
	case !ok || id == "":
		p.fail(path+"/id", CodeValidationFailed, "is required and must be a non-empty string")
	case len(id) > 128:
		p.fail(path+"/id", CodeValidationFailed, "must be at most 128 characters")
	case p.ids[id] != "":
		p.fail(path+"/id", CodeStepIDDuplicate, "step id %q is already used at %s", id, p.ids[id])
	default:
		p.ids[id] = path
	}
	return id
}

func (p *parser) object(v any, path string, fields ...string) (map[string]any, bool) {
	obj, ok := v.(map[string]any)
	if !ok {
		p.fail(path, CodeValidationFailed, "must be a JSON object")
		return nil, false
	}
	p.checkFields(obj, path, fields...)
	return obj, true
}

func (p *parser) checkFields(obj map[string]any, path string, fields ...string) {
	for _, k := range sortedKeys(obj) {
		if !slices.Contains(fields, k) {
			p.fail(path+"/"+escape(k), CodeValidationFailed, "unknown field %q (allowed: %s)", k, strings.Join(fields, ", "))
		}
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// escape encodes a key for a JSON Pointer (RFC 6901).
func escape(key string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
}
