// Package document parses and validates workflow documents: the version,
// the connections entry (servers a document brings, handles on pools,
// profiles, exposure, look timings), every node kind's spec (sequence,
// call, parallel and fan-out, verify and its claims, wait, model and its
// tools and output schema, profile reads), and the values and $expr
// expressions of arguments, which it also evaluates (Value.Eval) for the
// engine at run time. It checks a document against the registry's
// connections and their profiles; what a principal may use is the gates'
// business (allowlists), and running it is the engine's.
package document

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// Node kinds.
const (
	KindSequence = "sequence"
	KindCall     = "call"
	KindParallel = "parallel"
	KindVerify   = "verify"
)

const kindList = "sequence, call, parallel, verify, wait, model or acp-agent"

// Document is a parsed and validated workflow document, ready to run.
type Document struct {
	Version     int
	Connections []string
	Root        *Node
	// Attached are the MCP servers the document brings itself, by name.
	Attached map[string]AttachSpec
	// Handles are the entries that lease a connection of their own from
	// a pool, by name (see handles.go).
	Handles map[string]Handle
	// Expose is how each entry's operations reach a model, by name, for
	// entries that are not eager (see expose.go).
	Expose map[string]exposure
	// Looks are the manifest entries' look timings, connection → read →
	// turn|effect|ask (see look.go).
	Looks map[string]map[string]string
}

// Node is one step of a document.
type Node struct {
	Kind       string
	ID         string
	Path       string // JSON Pointer of the node in the document
	Steps      []*Node
	Connection string
	Op         string
	Args       map[string]Value
	// Secrets are the $secret values in Args, for the allowlist check.
	Secrets []secretUse
	// ConnFromItem: the call's connection is "$item", the connection a
	// fan-out is on; Over lists the names it ranges over.
	ConnFromItem bool

	// parallel
	Mode  string  // all | any
	Paths []*Node // each a sequence
	Over  []string
	Merge *expression

	// wait
	Event  string      // the event type waited for
	Filter *expression // over $event
	Around *Node       // run once listening has started

	// verify
	Subject *Node  // a read: a call whose output the claims judge
	Of      string // or the id of an earlier step whose output they judge
	Claims  []claim
	Timeout time.Duration
	Every   time.Duration

	// Model (see model.go); an acp-agent node's tools, prompt, until and
	// output too (see acp.go)
	Model *ModelSpec
	Agent *AgentSpec

	// Profile and ProfileOp type a call to an operation of the profile
	// its connection's entry names (see profiles.go); nil otherwise.
	Profile   *profiles.Profile
	ProfileOp *profiles.Operation
}

// secretUse is one {"$secret": name} in a call's arguments.
type secretUse struct {
	Name  string
	Field string // dotted path of the argument ("text", "auth.token")
	Path  string // JSON Pointer in the document
}

// Walk calls fn for every node, depth first, in document order.
func (d *Document) Walk(fn func(*Node)) {
	var visit func(*Node)
	visit = func(n *Node) {
		if n == nil {
			return
		}
		fn(n)
		for _, c := range n.Steps {
			visit(c)
		}
		for _, c := range n.Paths {
			visit(c)
		}
		visit(n.Subject)
		visit(n.Around)
	}
	visit(d.Root)
}

// ParseDocument parses raw as a workflow document and validates it against
// the connections of reg. Every problem is reported, as a *ValidationError
// whose paths are JSON Pointers prefixed with base (the document's place in
// the request body, e.g. "/workflow").
func ParseDocument(raw []byte, reg *registry.Registry, base string) (*Document, error) {
	var doc any
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&doc); err != nil {
		return nil, &fault.ValidationError{Problems: []fault.FieldError{{Path: base, Code: fault.CodeValidationFailed, Message: "not valid JSON: " + err.Error()}}}
	}
	p := &parser{reg: reg, ids: map[string]string{}, done: map[string]bool{}, base: base}
	d := p.document(doc, base)
	if len(p.problems) > 0 {
		return nil, &fault.ValidationError{Problems: p.problems}
	}
	return d, nil
}

type parser struct {
	reg      *registry.Registry
	declared map[string]bool
	ids      map[string]string // step id → path where first seen
	done     map[string]bool   // ids whose output is available to later steps
	problems []fault.FieldError
	field    string      // dotted argument path while parsing a call's args
	secrets  []secretUse // $secrets found in the current call's args

	events        map[string][]string          // event types each manifest entry declares
	attachedSpecs map[string]AttachSpec        // servers the document brings
	handles       map[string]Handle            // entries leased from pools
	base          string                       // the document's JSON Pointer in the request
	declaredList  []string                     // the document's connections, in order
	enclosing     string                       // the connection shorthand calls go to
	over          []string                     // the fan-out's connections while parsing its steps
	stepSpecs     map[string]AttachSpec        // servers model nodes attach for themselves
	entryProfiles map[string]*profiles.Profile // the profile each manifest entry names
	exposures     map[string]exposure          // each entry's expose, when not eager
	looks         map[string]map[string]string // each manifest entry's look timings
}

func (p *parser) fail(path string, code fault.Code, format string, args ...any) {
	p.problems = append(p.problems, fault.FieldError{Path: path, Code: code, Message: fmt.Sprintf(format, args...)})
}

func (p *parser) document(v any, path string) *Document {
	obj, ok := p.object(v, path, "version", "connections", "root")
	if !ok {
		return nil
	}
	d := &Document{}
	switch ver, ok := obj["version"].(float64); {
	case obj["version"] == nil:
		p.fail(path+"/version", fault.CodeValidationFailed, "is required and must be 1")
	case !ok || ver != 1:
		p.fail(path+"/version", fault.CodeValidationFailed, "must be 1")
	default:
		d.Version = 1
	}
	d.Connections = p.connections(obj["connections"], path+"/connections")
	p.declared = map[string]bool{}
	for _, name := range d.Connections {
		p.declared[name] = true
	}
	p.declaredList = d.Connections
	d.Attached = p.attachedSpecs
	d.Handles = p.handles
	d.Expose = p.exposures
	d.Looks = p.looks
	if obj["root"] == nil {
		p.fail(path+"/root", fault.CodeValidationFailed, "is required")
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
		p.fail(path, fault.CodeValidationFailed, "must be an object mapping connection names to entries")
		return nil
	}
	names := make([]string, 0, len(obj))
	for _, name := range SortedKeys(obj) {
		at := path + "/" + fault.Escape(name)
		names = append(names, name)
		entry, ok := obj[name].(map[string]any)
		_, attaches := entry["mcp"]
		_, leases := entry["from"] // a handle: its pool is checked by handle
		switch _, err := p.reg.Get(name); {
		case !registry.ValidName(name):
			p.fail(at, fault.CodeConnectionInvalid, "%q is not a valid connection name", name)
		case err != nil && !attaches && !leases:
			p.fail(at, fault.CodeConnectionUnknown, "no connection named %q", name)
		}
		if !ok {
			p.fail(at, fault.CodeValidationFailed, "must be an object")
			continue
		}
		p.entry(name, entry, at)
		if v, ok := entry["look"]; ok {
			p.parseLook(name, v, at+"/look")
		}
	}
	return names
}

func (p *parser) node(v any, path string) *Node {
	obj, ok := v.(map[string]any)
	if !ok {
		p.fail(path, fault.CodeValidationFailed, "must be an object")
		return nil
	}
	kind, _ := obj["kind"].(string)
	switch {
	case kind == KindSequence:
		return p.sequence(obj, path)
	case kind == KindCall:
		return p.call(obj, path)
	case kind == KindParallel:
		return p.parallel(obj, path)
	case kind == KindVerify:
		return p.verify(obj, path)
	case kind == KindWait:
		return p.wait(obj, path)
	case kind == KindModel:
		return p.model(obj, path)
	case kind == KindACPAgent:
		return p.acpAgent(obj, path)
	case obj["kind"] == nil && len(obj) == 1:
		return p.shorthand(obj, path)
	case obj["kind"] == nil:
		p.fail(path+"/kind", fault.CodeValidationFailed, "is required (%s)", kindList)
	default:
		p.fail(path+"/kind", fault.CodeValidationFailed, "unknown kind %v (%s)", obj["kind"], kindList)
	}
	return nil
}

// shorthand parses {"<op>": {args}}: a call of op on the enclosing
// connection (a fan-out's item, or the document's only connection). Its id
// is its place in the document, so replays find its ledger entry.
func (p *parser) shorthand(obj map[string]any, path string) *Node {
	op := SortedKeys(obj)[0]
	conn := p.enclosing
	if conn == "" && len(p.declaredList) == 1 {
		conn = p.declaredList[0]
	}
	if conn == "" {
		p.fail(path, fault.CodeValidationFailed, "%q is written by name, but there is no enclosing connection (the document declares %d)", op, len(p.declaredList))
		return nil
	}
	call := map[string]any{"kind": KindCall, "id": "@" + strings.TrimPrefix(path, p.base), "connection": conn, "op": op}
	if conn == itemConn {
		call["connection"] = map[string]any{"$expr": "$item"}
	}
	if args, ok := obj[op]; ok && args != nil {
		call["args"] = args
	}
	return p.call(call, path)
}

func (p *parser) sequence(obj map[string]any, path string) *Node {
	p.checkFields(obj, path, "kind", "id", "steps")
	n := &Node{Kind: KindSequence, ID: p.id(obj["id"], path), Path: path}
	steps, ok := obj["steps"].([]any)
	if !ok || len(steps) == 0 {
		p.fail(path+"/steps", fault.CodeValidationFailed, "must be a non-empty array of steps")
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
	if e, ok := obj["connection"].(map[string]any); ok && len(e) == 1 && e["$expr"] == "$item" {
		n.ConnFromItem = true
	}
	switch {
	case n.ConnFromItem && p.over == nil:
		p.fail(path+"/connection", fault.CodeValidationFailed, "$item names a connection only inside a parallel node's fan-out (over)")
	case n.ConnFromItem:
		for _, c := range p.over {
			probe := *n
			probe.Connection = c
			p.target(&probe, obj, path)
		}
	default:
		p.target(n, obj, path)
		p.typeCall(n)
	}
	if a, ok := obj["args"]; ok {
		args, ok := a.(map[string]any)
		if !ok {
			p.fail(path+"/args", fault.CodeValidationFailed, "must be an object")
		}
		n.Args = map[string]Value{}
		p.secrets = nil
		for _, k := range SortedKeys(args) {
			p.field = k
			n.Args[k] = p.value(args[k], path+"/args/"+fault.Escape(k))
		}
		n.Secrets = p.secrets
	}
	p.checkLiteralArgs(n, path)
	p.done[n.ID] = true
	return n
}

// target checks that a call names a declared connection and an operation
// its manifest has.
func (p *parser) target(n *Node, obj map[string]any, path string) {
	if n.Connection == "" {
		p.fail(path+"/connection", fault.CodeValidationFailed, "is required and must be a connection name")
		return
	}
	if p.handleTarget(n, path) {
		return
	}
	if _, ok := p.attachedSpecs[n.Connection]; ok {
		// Its operations are known once it is attached; gate 1 checks
		// them then.
		if n.Op == "" {
			p.fail(path+"/op", fault.CodeValidationFailed, "is required and must be an operation name")
		}
		return
	}
	conn, err := p.reg.Get(n.Connection)
	switch {
	case err != nil:
		p.fail(path+"/connection", fault.CodeConnectionUnknown, "no connection named %q", n.Connection)
		return
	case !p.declared[n.Connection]:
		p.fail(path+"/connection", fault.CodeValidationFailed, "connection %q is not declared in the document's connections", n.Connection)
		return
	}
	if n.Op == "" {
		p.fail(path+"/op", fault.CodeValidationFailed, "is required and must be an operation name")
		return
	}
	if st := conn.State(); st != connect.StateReady {
		p.fail(path+"/op", registry.NotReadyCode(st), "connection %q is %s, so operation %q cannot be checked", n.Connection, st, n.Op)
		return
	}
	if _, ok := conn.Manifest().Operation(n.Op); !ok {
		if prof := p.entryProfiles[n.Connection]; prof != nil && prof.Operations[n.Op] == nil {
			p.fail(path+"/op", fault.CodeOperationUnknown, "connection %q has no operation %q, nor has its profile %s", n.Connection, n.Op, prof.ID())
			return
		}
		p.fail(path+"/op", fault.CodeOperationUnknown, "connection %q has no operation %q", n.Connection, n.Op)
	}
}

func (p *parser) id(v any, path string) string {
	id, ok := v.(string)
	switch {
	case !ok || id == "":
		p.fail(path+"/id", fault.CodeValidationFailed, "is required and must be a non-empty string")
	case len(id) > 128:
		p.fail(path+"/id", fault.CodeValidationFailed, "must be at most 128 characters")
	case p.ids[id] != "":
		p.fail(path+"/id", fault.CodeStepIDDuplicate, "step id %q is already used at %s", id, p.ids[id])
	default:
		p.ids[id] = path
	}
	return id
}

func (p *parser) object(v any, path string, fields ...string) (map[string]any, bool) {
	obj, ok := v.(map[string]any)
	if !ok {
		p.fail(path, fault.CodeValidationFailed, "must be a JSON object")
		return nil, false
	}
	p.checkFields(obj, path, fields...)
	return obj, true
}

func (p *parser) checkFields(obj map[string]any, path string, fields ...string) {
	for _, k := range SortedKeys(obj) {
		if !slices.Contains(fields, k) {
			p.fail(path+"/"+fault.Escape(k), fault.CodeValidationFailed, "unknown field %q (allowed: %s)", k, strings.Join(fields, ", "))
		}
	}
}

func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
