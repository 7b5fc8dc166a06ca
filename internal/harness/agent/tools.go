package agent

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// ToolSource is one connection whose operations a model turn may be
// offered, with its operations already cut to what the allowlist grants.
type ToolSource struct {
	Name string
	Ops  []connect.Operation
	// Step: attached by this model node ({"mcp": …} in its tools), so only
	// the node that lists it is offered its tools.
	Step bool
	// Expose and Profile come from the connection's manifest entry (see
	// expose.go); "" is eager.
	Expose  string
	Profile *profiles.Profile
}

// modelTool is one tool offered to the model and where its calls go.
type modelTool struct {
	ModelTool
	Op string
	// Targets are the connections a call may reach. A merged tool (the
	// same operation on several connections) takes the one it calls in
	// its "target" argument, whose enum is exactly Targets.
	Targets []string
	Merged  bool
	// Pair is set on the _ops (Lists) and _call tools of the operations
	// reached by name (see expose.go).
	Pair  *CallPair
	Lists bool
}

// ToolSet is the tools of one model turn, by the names the model calls.
type ToolSet struct {
	Tools  []*modelTool
	ByName map[string]*modelTool
}

// targetArg is the argument a merged tool takes to name its connection.
const targetArg = "target"

// BuildToolSet names every operation of the turn's connections and keeps
// those the node is offered: without picks, every connection the document
// has (never one a step attaches); with picks, what they name.
//
// Names are worked out over the whole turn, so a pick keeps the names the
// unpicked set would have: "<connection>_<op>", or for an operation that
// several connections offer alike (the same operation of one profile, or
// outside profiles the same name and input schema) one merged tool named
// after the operation, whose target enum is cut to the picked connections.
// Operations a connection's expose setting keeps from tools of their own
// are reached through an _ops/_call pair (see expose.go).
//
// Within one connection, reduced names that collide are suffixed (see
// ToolIDs). Across connections a shared name is an error naming both
// (*Error with CodeToolIDCollision): a suffix there would depend on which
// connections a turn has, so the model would call one operation by
// another's name from one turn to the next, and an overwrite would send
// one connection's calls to the other.
func BuildToolSet(all []ToolSource, picks []document.ToolPick, hasPicks bool) (*ToolSet, error) {
	turn, called := splitExposure(all)
	merged := mergedOps(turn)
	owner := map[string]string{} // tool name → "connection.op" it names
	claim := func(ids map[string]string, who func(op string) string) error {
		for _, op := range slices.Sorted(maps.Keys(ids)) {
			id := ids[op]
			if prev, ok := owner[id]; ok {
				return fault.Errorf(document.CodeToolIDCollision, "tool id %q names both %s and %s; rename a connection, or narrow its operations (openapi include, allowlist ops)", id, prev, who(op))
			}
			owner[id] = who(op)
		}
		return nil
	}
	names := map[string]map[string]string{} // connection → op → tool name
	for _, src := range turn {
		var own []string
		for _, op := range src.Ops {
			if !isMerged(merged, src, op) {
				own = append(own, op.Name)
			}
		}
		names[src.Name] = connect.ToolIDsWith(src.Name+"_", own, nil)
		if err := claim(names[src.Name], func(op string) string { return "connection " + src.Name + " operation " + op }); err != nil {
			return nil, err
		}
	}
	mergedNames := connect.ToolIDsWith("", document.SortedKeys(merged), nil)
	if err := claim(mergedNames, func(op string) string {
		return "operation " + op + " merged across connections " + strings.Join(mergedSources(turn, merged, op), ", ")
	}); err != nil {
		return nil, err
	}
	pair, err := claimPair(called, claim)
	if err != nil {
		return nil, err
	}

	offered := func(src ToolSource, op string) bool {
		if !hasPicks {
			return !src.Step
		}
		for _, p := range picks {
			if p.Connection == src.Name && (p.Ops == nil || document.MatchOp(p.Ops, op)) {
				return true
			}
		}
		return false
	}
	ts := &ToolSet{ByName: map[string]*modelTool{}}
	for _, src := range turn {
		for _, op := range src.Ops {
			if !offered(src, op.Name) {
				continue
			}
			if !isMerged(merged, src, op) {
				t := &modelTool{Op: op.Name, Targets: []string{src.Name}}
				t.ModelTool = ModelTool{Name: names[src.Name][op.Name], Description: describe([]string{src.Name}, op),
					InputSchema: op.InputSchema, Annotations: op.Annotations}
				ts.Add(t)
				continue
			}
			name := mergedNames[op.Name]
			if t, ok := ts.ByName[name]; ok {
				t.Targets = append(t.Targets, src.Name)
				continue
			}
			ts.Add(&modelTool{Op: op.Name, Targets: []string{src.Name}, Merged: true,
				ModelTool: ModelTool{Name: name, InputSchema: mergedSchema(src, op), Annotations: op.Annotations, Description: op.Description}})
		}
	}
	ts.addPair(pair, called, offered)
	for _, t := range ts.Tools {
		if t.Merged {
			op := connect.Operation{Name: t.Op, Description: t.Description, Annotations: t.Annotations}
			t.Description = describe(t.Targets, op)
			t.InputSchema = withTarget(t.InputSchema, t.Targets)
		}
	}
	return ts, nil
}

// mergedSources names the connections whose op is merged into one tool.
func mergedSources(turn []ToolSource, merged map[string]string, op string) []string {
	var out []string
	for _, src := range turn {
		for _, o := range src.Ops {
			if o.Name == op && isMerged(merged, src, o) {
				out = append(out, src.Name)
				break
			}
		}
	}
	return out
}

func isMerged(merged map[string]string, src ToolSource, op connect.Operation) bool {
	key, ok := merged[op.Name]
	return ok && key == mergeKey(src, op)
}

func (ts *ToolSet) Add(t *modelTool) {
	ts.Tools = append(ts.Tools, t)
	ts.ByName[t.Name] = t
}

// List is the tools as the model is given them.
func (ts *ToolSet) List() []ModelTool {
	out := make([]ModelTool, len(ts.Tools))
	for i, t := range ts.Tools {
		out[i] = t.ModelTool
	}
	return out
}

// CheckChoice reports a toolChoice that names no tool of the set.
func (ts *ToolSet) CheckChoice(choice string) error {
	switch choice {
	case "", "auto", "none", "required", "any":
		return nil
	}
	if _, ok := ts.ByName[choice]; ok {
		return nil
	}
	names := make([]string, len(ts.Tools))
	for i, t := range ts.Tools {
		names[i] = t.Name
	}
	return &fault.Error{Code: document.CodeUnknownToolChoice, Message: fmt.Sprintf("toolChoice %q names no tool of this turn (tools: %s)", choice, strings.Join(names, ", "))}
}

// Resolve maps a model's tool call to the connection and operation it
// runs, with the arguments the operation takes. A call to a target the
// tool does not reach is refused at gate 1, before anything else.
func (ts *ToolSet) Resolve(name string, args map[string]any) (conn, op string, rest map[string]any, err error) {
	t, ok := ts.ByName[name]
	if !ok || t.Lists {
		return "", "", nil, fault.Deny(fault.GateDeclared, fmt.Sprintf("no tool named %q is offered in this turn", name))
	}
	if t.Pair != nil {
		return t.Pair.Resolve(ts, args)
	}
	if !t.Merged {
		return t.Targets[0], t.Op, args, nil
	}
	target, _ := args[targetArg].(string)
	if !slices.Contains(t.Targets, target) {
		return "", "", nil, fault.Deny(fault.GateDeclared, fmt.Sprintf("tool %s: target %q is not one of the connections this step may reach (%s)", name, target, strings.Join(t.Targets, ", ")))
	}
	rest = make(map[string]any, len(args))
	for k, v := range args {
		if k != targetArg {
			rest[k] = v
		}
	}
	return target, t.Op, rest, nil
}

// mergedOps returns the operations that two or more connections of the
// turn offer alike (see mergeKey), with no argument of their own called
// "target". The value is the merge key; a connection whose operation of
// that name has another key keeps its own tool.
func mergedOps(turn []ToolSource) map[string]string {
	count := map[string]int{} // name + merge key → connections
	var order []string
	for _, src := range turn {
		for _, op := range src.Ops {
			schema := decodeSchema(mergedSchema(src, op))
			if hasProperty(schema, targetArg) {
				continue
			}
			k := op.Name + "\x00" + mergeKey(src, op)
			if count[k] == 0 {
				order = append(order, k)
			}
			count[k]++
		}
	}
	out := map[string]string{}
	for _, k := range order {
		name, key, _ := strings.Cut(k, "\x00")
		if _, taken := out[name]; !taken && count[k] > 1 {
			out[name] = key
		}
	}
	return out
}

// mergeKey is what makes two connections' operations one tool: being the
// same operation of one profile (its name and major version, and the
// input schema the profile gives it) when the connection's entry names a
// profile that has it; else the same name and input schema.
func mergeKey(src ToolSource, op connect.Operation) string {
	if pop := entryProfileOp(src, op.Name); pop != nil {
		return fmt.Sprintf("profile %s@%d %s", src.Profile.Name, src.Profile.Version.Major(), schemaKey(connect.Operation{InputSchema: pop.Input}))
	}
	return schemaKey(op)
}

// mergedSchema is the input schema of op's merged tool: the profile's,
// which every connection speaking it takes, or the operation's own.
func mergedSchema(src ToolSource, op connect.Operation) json.RawMessage {
	if pop := entryProfileOp(src, op.Name); pop != nil {
		return pop.Input
	}
	return op.InputSchema
}

func entryProfileOp(src ToolSource, name string) *profiles.Operation {
	if src.Profile == nil {
		return nil
	}
	return src.Profile.Operations[name]
}

// schemaKey is an operation's input schema in a canonical form.
func schemaKey(op connect.Operation) string {
	data, _ := json.Marshal(decodeSchema(op.InputSchema))
	return string(data)
}

func decodeSchema(raw json.RawMessage) any {
	if len(raw) == 0 {
		return map[string]any{"type": "object"}
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	return v
}

func hasProperty(schema any, name string) bool {
	m, _ := schema.(map[string]any)
	props, _ := m["properties"].(map[string]any)
	_, ok := props[name]
	return ok
}

// withTarget adds the required "target" argument, an enum of targets, to
// an operation's input schema.
func withTarget(raw json.RawMessage, targets []string) json.RawMessage {
	m, ok := decodeSchema(raw).(map[string]any)
	if !ok {
		m = map[string]any{"type": "object"}
	}
	props, _ := m["properties"].(map[string]any)
	cp := make(map[string]any, len(props)+1)
	for k, v := range props {
		cp[k] = v
	}
	cp[targetArg] = map[string]any{"type": "string", "enum": targets, "description": "The connection to run this operation on."}
	m["properties"] = cp
	req, _ := m["required"].([]any)
	m["required"] = append(slices.Clone(req), targetArg)
	if m["type"] == nil {
		m["type"] = "object"
	}
	out, err := json.Marshal(m)
	if err != nil {
		return raw
	}
	return out
}

// describe is the description a model reads: which connection(s) the tool
// reaches in brackets, the operation's title and description, and its
// behaviour hints, which the model APIs have no field for.
func describe(conns []string, op connect.Operation) string {
	text := opText(op)
	if text == "" {
		return "[" + strings.Join(conns, ", ") + "]"
	}
	return "[" + strings.Join(conns, ", ") + "] " + text
}

// opText is an operation's title, description and behaviour hints.
func opText(op connect.Operation) string {
	var parts []string
	if t := op.Annotations.Title; t != "" && t != op.Name {
		parts = append(parts, t+".")
	}
	if op.Description != "" {
		parts = append(parts, op.Description)
	}
	if hints := hintWords(op.Annotations); len(hints) > 0 {
		parts = append(parts, "("+strings.Join(hints, ", ")+")")
	}
	return strings.Join(parts, " ")
}

func hintWords(a connect.Annotations) []string {
	var out []string
	yes := func(p *bool) bool { return p != nil && *p }
	if yes(a.ReadOnlyHint) {
		out = append(out, "read-only")
	}
	if yes(a.DestructiveHint) {
		out = append(out, "destructive")
	}
	if yes(a.IdempotentHint) {
		out = append(out, "idempotent")
	}
	if yes(a.OpenWorldHint) {
		out = append(out, "open world")
	}
	return out
}
