package agent

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// Exposure: how a connection's operations reach a model, set by its
// manifest entry's "expose". Choices worth knowing:
//   - "eager" gives each operation a tool of its own (<connection>_<op>);
//     it is the default of an entry that names no profile.
//   - "call" gives the connection two tools: <connection>_ops lists its
//     operations with their input schemas (filtered by a query, paged) and
//     <connection>_call runs one by name with its arguments. When two or
//     more connections of a turn are reached that way they share one pair,
//     connection_ops and connection_call, each taking a "target" enum of
//     the connections (optional when listing: all are listed then). The
//     pair is named over the whole turn, so a pick keeps its names.
//   - "profile", the default of an entry naming a profile, offers the
//     profile's eager set (profiles.Profile.IsEager) as tools of their own
//     and the rest of the connection's operations (the profile's others,
//     and a server's own tools beside the profile) through the pair.
//   - A call through <…>_call is the call its own tool would have been: the
//     same ledger entry, idempotency key and gates. It reaches exactly the
//     operations <…>_ops lists — granted by the allowlist, picked by the
//     node, not offered as a tool of their own — and anything else is
//     refused at gate 1, as a call of a tool not offered is. Listing is
//     answered from the turn's tool set and is no connection call.

// sharedPair names the _ops/_call pair that several connections share.
const sharedPair = "connection"

// Paging of an _ops answer: at most this many operations, and no more
// bytes than this once one is in (a page must fit the tool result cut).
const (
	opsPageMax   = 25
	OpsPageBytes = 24 << 10
)

// SourceOf is the tool source of the document's connection name, offering
// ops, with the exposure its entry sets.
func SourceOf(d *document.Document, name string, ops []connect.Operation) ToolSource {
	ex := d.Expose[name]
	return ToolSource{Name: name, Ops: ops, Expose: ex.Mode, Profile: ex.Profile}
}

// ownTool reports whether op is offered as a tool of its own.
func (src ToolSource) ownTool(op string) bool {
	switch src.Expose {
	case document.ExposeCall:
		return false
	case document.ExposeProfile:
		return src.Profile != nil && src.Profile.IsEager(op)
	}
	return true
}

// splitExposure divides each connection's operations into those offered as
// tools of their own (every source, maybe with none) and those reached
// through an _ops/_call pair (only sources with some).
func splitExposure(turn []ToolSource) (own, called []ToolSource) {
	for _, src := range turn {
		o, c := src, src
		o.Ops, c.Ops = nil, nil
		for _, op := range src.Ops {
			if src.ownTool(op.Name) {
				o.Ops = append(o.Ops, op)
			} else {
				c.Ops = append(c.Ops, op)
			}
		}
		own = append(own, o)
		if len(c.Ops) > 0 {
			called = append(called, c)
		}
	}
	return own, called
}

// CallPair is the _ops and _call tools of a turn's called operations.
type CallPair struct {
	Ops, Call string
	// Shared: several connections' pair, whose tools take "target".
	Shared bool
	// Targets are the connections the node is offered through the pair,
	// and ops their operations, by name order.
	Targets []string
	ops     map[string][]connect.Operation
}

// pairNames names the pair of the turn's called sources.
func pairNames(called []ToolSource) (ops, call string, shared bool) {
	prefix := sharedPair
	if len(called) == 1 {
		prefix = called[0].Name
	}
	return connect.ReduceToolID(prefix + "_ops"), connect.ReduceToolID(prefix + "_call"), len(called) > 1
}

// claimPair reserves the pair's names (nil when nothing is called).
func claimPair(called []ToolSource, claim func(ids map[string]string, who func(string) string) error) (*CallPair, error) {
	if len(called) == 0 {
		return nil, nil
	}
	ops, call, shared := pairNames(called)
	conns := make([]string, len(called))
	for i, src := range called {
		conns[i] = src.Name
	}
	who := func(what string) string {
		return "the " + what + " tool of connection " + strings.Join(conns, ", ")
	}
	if err := claim(map[string]string{"list": ops, "call": call}, who); err != nil {
		return nil, err
	}
	return &CallPair{Ops: ops, Call: call, Shared: shared, ops: map[string][]connect.Operation{}}, nil
}

// addPair adds the pair's tools, offering each source what the node is
// offered of it; no tool when that is nothing.
func (ts *ToolSet) addPair(pair *CallPair, called []ToolSource, offered func(ToolSource, string) bool) {
	if pair == nil {
		return
	}
	for _, src := range called {
		var ops []connect.Operation
		for _, op := range src.Ops {
			if offered(src, op.Name) {
				ops = append(ops, op)
			}
		}
		if len(ops) == 0 {
			continue
		}
		slices.SortFunc(ops, func(a, b connect.Operation) int { return strings.Compare(a.Name, b.Name) })
		pair.Targets = append(pair.Targets, src.Name)
		pair.ops[src.Name] = ops
	}
	if len(pair.Targets) == 0 {
		return
	}
	ts.Add(&modelTool{Pair: pair, Lists: true, ModelTool: ModelTool{Name: pair.Ops, Description: pair.describeOps(),
		InputSchema: pair.opsSchema(), Annotations: connect.Annotations{ReadOnlyHint: ptrTo(true)}}})
	ts.Add(&modelTool{Pair: pair, ModelTool: ModelTool{Name: pair.Call, Description: pair.describeCall(), InputSchema: pair.callSchema()}})
}

func ptrTo[T any](v T) *T { return &v }

func (p *CallPair) count() int {
	n := 0
	for _, ops := range p.ops {
		n += len(ops)
	}
	return n
}

func (p *CallPair) describeOps() string {
	return fmt.Sprintf("[%s] Lists the %d operations %s runs: name, description and input schema of each. query keeps those whose name or description holds every word of it; a long list comes in pages (pass next as offset).",
		strings.Join(p.Targets, ", "), p.count(), p.Call)
}

func (p *CallPair) describeCall() string {
	return fmt.Sprintf("[%s] Runs one operation %s lists, by its name (op), with its arguments (args, matching its input schema).",
		strings.Join(p.Targets, ", "), p.Ops)
}

func (p *CallPair) targetSchema() map[string]any {
	return map[string]any{"type": "string", "enum": p.Targets, "description": "The connection the operation belongs to."}
}

func (p *CallPair) opsSchema() json.RawMessage {
	props := map[string]any{
		"query":  map[string]any{"type": "string", "description": "Words the operation's name or description must contain."},
		"offset": map[string]any{"type": "integer", "minimum": 0, "description": "Where the page starts: the next of the previous page."},
	}
	if p.Shared {
		t := p.targetSchema()
		t["description"] = "Only this connection's operations (default: every connection's)."
		props[targetArg] = t
	}
	return MustJSON(map[string]any{"type": "object", "properties": props, "additionalProperties": false})
}

func (p *CallPair) callSchema() json.RawMessage {
	props := map[string]any{
		"op":   map[string]any{"type": "string", "description": "The operation's name, as " + p.Ops + " lists it."},
		"args": map[string]any{"type": "object", "description": "The operation's arguments, matching its input schema."},
	}
	required := []string{"op"}
	if p.Shared {
		props[targetArg] = p.targetSchema()
		required = append(required, targetArg)
	}
	return MustJSON(map[string]any{"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

func MustJSON(v any) json.RawMessage {
	data, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("harness: marshal a tool schema: %v", err))
	}
	return data
}

// target reads a shared pair's target argument ("" when absent).
func (p *CallPair) target(tool string, args map[string]any, required bool) (string, error) {
	if !p.Shared {
		if len(p.Targets) == 1 {
			return p.Targets[0], nil
		}
		return "", nil
	}
	v, ok := args[targetArg]
	if !ok && !required {
		return "", nil
	}
	s, _ := v.(string)
	if !slices.Contains(p.Targets, s) {
		return "", fault.Deny(fault.GateDeclared, fmt.Sprintf("tool %s: target %s is not one of the connections this step may reach (%s)", tool, jsonText(v), strings.Join(p.Targets, ", ")))
	}
	return s, nil
}

func jsonText(v any) string {
	data, err := json.Marshal(v)
	if err != nil || v == nil {
		return "(none)"
	}
	return string(data)
}

// opEntry is one operation as an _ops answer lists it.
type opEntry struct {
	Target      string          `json:"target,omitempty"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

// opsPage is an _ops answer.
type opsPage struct {
	Operations []opEntry `json:"operations"`
	Total      int       `json:"total"`          // matching operations in all
	Next       *int      `json:"next,omitempty"` // the offset of the next page
}

// List answers an _ops call. A bad argument is an error the model reads.
func (p *CallPair) List(args map[string]any) (*opsPage, error) {
	for k := range args {
		if k != "query" && k != "offset" && (k != targetArg || !p.Shared) {
			return nil, fault.Deny(fault.GateSchema, fmt.Sprintf("tool %s takes no argument %q", p.Ops, k))
		}
	}
	target, err := p.target(p.Ops, args, false)
	if err != nil {
		return nil, err
	}
	query, ok := args["query"].(string)
	if _, given := args["query"]; given && !ok {
		return nil, fault.Deny(fault.GateSchema, fmt.Sprintf("tool %s: query must be a string", p.Ops))
	}
	offset := 0
	if v, given := args["offset"]; given {
		f, isNum := v.(float64)
		if !isNum || f < 0 || f != float64(int(f)) {
			return nil, fault.Deny(fault.GateSchema, fmt.Sprintf("tool %s: offset must be a whole number from 0", p.Ops))
		}
		offset = int(f)
	}
	var all []opEntry
	for _, conn := range p.Targets {
		if target != "" && conn != target {
			continue
		}
		for _, op := range p.ops[conn] {
			e := opEntry{Name: op.Name, Description: opText(op), InputSchema: op.InputSchema}
			if len(e.InputSchema) == 0 {
				e.InputSchema = json.RawMessage(`{"type":"object"}`)
			}
			if p.Shared {
				e.Target = conn
			}
			if matchesQuery(e, query) {
				all = append(all, e)
			}
		}
	}
	page := &opsPage{Operations: []opEntry{}, Total: len(all)}
	size := 0
	for i := offset; i < len(all); i++ {
		n := len(MustJSON(all[i]))
		if len(page.Operations) == opsPageMax || (len(page.Operations) > 0 && size+n > OpsPageBytes) {
			page.Next = &i
			break
		}
		page.Operations = append(page.Operations, all[i])
		size += n
	}
	return page, nil
}

// matchesQuery reports whether every word of query is in the entry's name
// or description, ignoring case.
func matchesQuery(e opEntry, query string) bool {
	text := strings.ToLower(e.Name + " " + e.Description)
	for _, w := range strings.Fields(strings.ToLower(query)) {
		if !strings.Contains(text, w) {
			return false
		}
	}
	return true
}

// Resolve maps a _call call to the connection, operation and arguments it
// runs; an operation the pair does not offer is refused at gate 1.
func (p *CallPair) Resolve(ts *ToolSet, args map[string]any) (conn, op string, rest map[string]any, err error) {
	for k := range args {
		if k != "op" && k != "args" && (k != targetArg || !p.Shared) {
			return "", "", nil, fault.Deny(fault.GateSchema, fmt.Sprintf("tool %s takes op and args%s; the operation's arguments go inside args, not %q", p.Call, map[bool]string{true: " and target"}[p.Shared], k))
		}
	}
	conn, err = p.target(p.Call, args, true)
	if err != nil {
		return "", "", nil, err
	}
	op, _ = args["op"].(string)
	if !slices.ContainsFunc(p.ops[conn], func(o connect.Operation) bool { return o.Name == op }) {
		msg := fmt.Sprintf("tool %s: %s offers no operation %s to this step (%s lists those it does)", p.Call, conn, jsonText(args["op"]), p.Ops)
		if own := ts.ownToolOf(conn, op); own != "" {
			msg = fmt.Sprintf("tool %s: %s of %s is a tool of its own, %s; call that", p.Call, op, conn, own)
		}
		return conn, op, nil, fault.Deny(fault.GateDeclared, msg)
	}
	rest, isObj := args["args"].(map[string]any)
	switch {
	case args["args"] == nil:
		rest = map[string]any{}
	case !isObj:
		return conn, op, nil, fault.Deny(fault.GateSchema, fmt.Sprintf("tool %s: args must be an object of %s's arguments", p.Call, op))
	}
	return conn, op, rest, nil
}

// ownToolOf is the name of the tool of its own that runs op on conn, if
// the turn offers one.
func (ts *ToolSet) ownToolOf(conn, op string) string {
	for _, t := range ts.Tools {
		if t.Pair == nil && t.Op == op && slices.Contains(t.Targets, conn) {
			return t.Name
		}
	}
	return ""
}
