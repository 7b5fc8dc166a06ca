package document

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// KindModel is a model turn: the agent loop over connection tools.
const KindModel = "model"

// Model turn limits.
const (
	// DefaultModelRounds bounds a turn that runs until the model calls no
	// tool: a model that never stops fails there instead of spending for
	// ever.
	DefaultModelRounds = 25
	maxModelRounds     = 100
	maxInstructions    = 64 << 10
	maxModelRefLen     = 256
)

// CodeUnknownToolChoice: a model node's toolChoice names no tool of its
// tool set.
const CodeUnknownToolChoice fault.Code = "UNKNOWN_TOOL_CHOICE"

// CodeToolIDCollision: two connections of a model turn offer operations
// under one tool id (see buildToolSet).
const CodeToolIDCollision fault.Code = "TOOL_ID_COLLISION"

// ModelSpec is a parsed model node.
type ModelSpec struct {
	Ref          string // "<provider>/<name>"
	Instructions string
	Input        Value // nil: $input
	Picks        []ToolPick
	HasTools     bool
	MaxRounds    int // 0: until no tool calls, bounded by defaultModelRounds
	ToolChoice   string
	MaxTokens    int64
	Output       *outputSpec // nil: the output is the final text
}

// outputSpec is a model node's structured output: the schema its final
// answer must match.
type outputSpec struct {
	Raw    json.RawMessage // the schema as sent to the model
	Schema *jsonschema.Schema
}

func (m *ModelSpec) Provider() string { p, _, _ := strings.Cut(m.Ref, "/"); return p }

func (m *ModelSpec) Name() string { _, n, _ := strings.Cut(m.Ref, "/"); return n }

// model parses {"kind": "model", "id", "model", "instructions"?, "input"?,
// "tools"?, "until"?, "toolChoice"?, "maxTokens"?, "output"?}.
func (p *parser) model(obj map[string]any, at string) *Node {
	p.checkFields(obj, at, "kind", "id", "model", "instructions", "input", "tools", "until", "toolChoice", "maxTokens", "output")
	n := &Node{Kind: KindModel, ID: p.id(obj["id"], at), Path: at}
	spec := &ModelSpec{}
	spec.Ref, _ = obj["model"].(string)
	provider, name, ok := strings.Cut(spec.Ref, "/")
	if !ok || !registry.ValidName(provider) || name == "" || len(spec.Ref) > maxModelRefLen {
		p.fail(at+"/model", fault.CodeValidationFailed, "is required and must be \"<provider>/<model>\" with a provider from the config file's models, e.g. \"anthropic/claude-sonnet-4-5\" or \"local/llama3\"")
	}
	if v, ok := obj["instructions"]; ok {
		s, isStr := v.(string)
		if !isStr || len(s) > maxInstructions {
			p.fail(at+"/instructions", fault.CodeValidationFailed, "must be a string of at most %d bytes", maxInstructions)
		}
		spec.Instructions = s
	}
	if v, ok := obj["input"]; ok {
		p.secrets, p.field = nil, "input"
		spec.Input = p.value(v, at+"/input")
		for _, s := range p.secrets {
			p.fail(s.Path, fault.CodeValidationFailed, "a model's input may not hold secrets: the model would read them")
		}
		p.secrets = nil
	}
	if v, ok := obj["tools"]; ok {
		p.modelTools(v, at+"/tools", spec)
	}
	if v, ok := obj["until"]; ok {
		spec.MaxRounds = p.until(v, at+"/until")
	}
	if v, ok := obj["toolChoice"]; ok {
		s, isStr := v.(string)
		if !isStr || s == "" || len(s) > connect.MaxToolIDLen {
			p.fail(at+"/toolChoice", fault.CodeValidationFailed, "must be \"auto\", \"none\", \"required\" or the name of a tool of this node")
		}
		spec.ToolChoice = s
	}
	if v, ok := obj["maxTokens"]; ok {
		f, isNum := v.(float64)
		if !isNum || f < 1 || f > 1_000_000 || f != float64(int64(f)) {
			p.fail(at+"/maxTokens", fault.CodeValidationFailed, "must be a whole number from 1 to 1000000")
		}
		spec.MaxTokens = int64(f)
	}
	if v, ok := obj["output"]; ok {
		spec.Output = p.output(v, at+"/output")
	}
	n.Model = spec
	p.done[n.ID] = true
	return n
}

// Structured output limits.
const (
	maxOutputSchema = 32 << 10
	// OutputRetries is how many corrective rounds an answer that does not
	// match the schema gets before the node fails.
	OutputRetries = 1
)

// output parses {"schema": <JSON Schema>}: the schema must compile, with
// problems reported at their place inside it.
func (p *parser) output(v any, at string) *outputSpec {
	obj, ok := v.(map[string]any)
	if !ok {
		p.fail(at, fault.CodeValidationFailed, "must be {\"schema\": <JSON Schema>}")
		return nil
	}
	p.checkFields(obj, at, "schema")
	schema, ok := obj["schema"]
	if !ok {
		p.fail(at+"/schema", fault.CodeValidationFailed, "is required: the JSON Schema the final answer must match")
		return nil
	}
	raw, err := json.Marshal(schema)
	switch {
	case err != nil:
		p.fail(at+"/schema", fault.CodeValidationFailed, "is not JSON: %v", err)
		return nil
	case len(raw) > maxOutputSchema:
		p.fail(at+"/schema", fault.CodeValidationFailed, "is %d bytes; at most %d", len(raw), maxOutputSchema)
		return nil
	}
	if _, isObj := schema.(map[string]any); !isObj {
		if _, isBool := schema.(bool); !isBool {
			p.fail(at+"/schema", fault.CodeValidationFailed, "must be a JSON Schema (an object, or true/false)")
			return nil
		}
	}
	compiled, where, err := compileOutputSchema(raw)
	if err != nil {
		p.fail(at+"/schema"+where, fault.CodeValidationFailed, "is not a valid JSON Schema: %v", err)
		return nil
	}
	return &outputSpec{Raw: raw, Schema: compiled}
}

// compileOutputSchema compiles a document's schema. Nothing is fetched: a
// $ref must point inside the schema (or to a built-in metaschema). where
// is the JSON Pointer of a problem inside the schema, when known.
func compileOutputSchema(raw json.RawMessage) (sch *jsonschema.Schema, where string, err error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, "", err
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(jsonschema.SchemeURLLoader{}) // no file:, http: or other loads
	const url = "mem://model-output/schema.json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, "", err
	}
	sch, err = c.Compile(url)
	if err == nil {
		return sch, "", nil
	}
	var sve *jsonschema.SchemaValidationError
	var ve *jsonschema.ValidationError
	if errors.As(err, &sve) && errors.As(sve.Err, &ve) {
		leaves := schemaLeaves(ve)
		if len(leaves) > 0 {
			where = "/" + strings.Join(leaves[0].InstanceLocation, "/")
			if len(leaves[0].InstanceLocation) == 0 {
				where = ""
			}
		}
		return nil, where, errors.New(schemaProblems(ve))
	}
	var le *jsonschema.LoadURLError
	if errors.As(err, &le) {
		return nil, "", fmt.Errorf("$ref %q points outside the schema; only refs inside it (\"#/$defs/…\") are followed", le.URL)
	}
	return nil, "", errors.New(strings.ReplaceAll(err.Error(), url, "the schema"))
}

// schemaLeaves are the innermost causes of a validation error: the ones
// that say what is wrong rather than which branch failed.
func schemaLeaves(ve *jsonschema.ValidationError) []*jsonschema.ValidationError {
	if len(ve.Causes) == 0 {
		return []*jsonschema.ValidationError{ve}
	}
	var out []*jsonschema.ValidationError
	for _, c := range ve.Causes {
		out = append(out, schemaLeaves(c)...)
	}
	return out
}

// schemaProblems is a validation error as one line: up to three of its
// innermost causes ("at '/age': got string, want integer").
func schemaProblems(ve *jsonschema.ValidationError) string {
	leaves := schemaLeaves(ve)
	var parts []string
	for i, l := range leaves {
		if i == 3 {
			parts = append(parts, fmt.Sprintf("and %d more", len(leaves)-i))
			break
		}
		parts = append(parts, strings.ReplaceAll(l.Error(), "\n", " "))
	}
	return strings.Join(parts, "; ")
}

// OutputInstruction is appended to a node's instructions when it asks for
// structured output.
func OutputInstruction(instructions string, schema json.RawMessage) string {
	ask := "When you are done (calling no more tools), answer with only a JSON value that matches this JSON Schema: no other text, no code fences.\n" + string(schema)
	if instructions == "" {
		return ask
	}
	return instructions + "\n\n" + ask
}

// parseOutput reads a final answer as JSON matching the schema. The error
// says what is wrong, in words the model can act on.
func (o *outputSpec) Parse(text string) (any, error) {
	s := strings.TrimSpace(text)
	if rest, ok := strings.CutPrefix(s, "```"); ok && strings.HasSuffix(rest, "```") {
		rest = strings.TrimSuffix(rest, "```")
		rest = strings.TrimPrefix(rest, "json")
		s = strings.TrimSpace(rest)
	}
	if s == "" {
		return nil, errors.New("the answer is empty, not a JSON value")
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(s))
	if err != nil {
		return nil, fmt.Errorf("the answer is not a single JSON value: %v", err)
	}
	if err := o.Schema.Validate(inst); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("the answer does not match the output schema: %s", schemaProblems(ve))
		}
		return nil, fmt.Errorf("the answer does not match the output schema: %v", err)
	}
	var out any
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		return nil, fmt.Errorf("the answer is not a single JSON value: %v", err)
	}
	return out, nil
}

func (p *parser) until(v any, at string) int {
	if v == "no_tool_calls" {
		return 0
	}
	m, ok := v.(map[string]any)
	rounds, isNum := m["maxRounds"].(float64)
	if !ok || len(m) != 1 || !isNum || rounds < 1 || rounds > maxModelRounds || rounds != float64(int(rounds)) {
		p.fail(at, fault.CodeValidationFailed, "must be \"no_tool_calls\" or {\"maxRounds\": n} with n from 1 to %d", maxModelRounds)
		return 0
	}
	return int(rounds)
}

// modelTools parses a model node's tools: picks of the document's
// connections and servers the node attaches for itself.
func (p *parser) modelTools(v any, at string, spec *ModelSpec) {
	list, ok := v.([]any)
	if !ok {
		p.fail(at, fault.CodeValidationFailed, "must be an array of {\"connection\": name, \"ops\"?: [globs]} and {\"mcp\": {…}} entries")
		return
	}
	spec.HasTools = true
	for i, item := range list {
		entry := fmt.Sprintf("%s/%d", at, i)
		m, _ := item.(map[string]any)
		_, isConn := m["connection"]
		_, isMCP := m["mcp"]
		switch {
		case isConn:
			p.checkFields(m, entry, "connection", "ops")
			if pick, ok := p.pick(m, entry); ok {
				spec.Picks = append(spec.Picks, pick)
			}
		case isMCP:
			p.checkFields(m, entry, "mcp")
			if pick, ok := p.stepServer(m["mcp"], entry); ok {
				spec.Picks = append(spec.Picks, pick)
			}
		default:
			p.fail(entry, fault.CodeValidationFailed, "must be {\"connection\": name, \"ops\"?: [globs]} or {\"mcp\": {…}}")
		}
	}
}

// pick parses {"connection": name, "ops"?: [globs]}: the name must be a
// connection the document declares.
func (p *parser) pick(m map[string]any, at string) (ToolPick, bool) {
	name, _ := m["connection"].(string)
	pick := ToolPick{Connection: name, Path: at}
	_, attached := p.attachedSpecs[name]
	_, handle := p.handles[name]
	_, err := p.reg.Get(name)
	switch {
	case !registry.ValidName(name):
		p.fail(at+"/connection", fault.CodeConnectionInvalid, "%q is not a valid connection name (a letter, then letters, digits, '_' or '-')", name)
		return pick, false
	case !attached && !handle && err != nil:
		p.fail(at+"/connection", fault.CodeConnectionUnknown, "no connection named %q", name)
		return pick, false
	case !p.declared[name]:
		p.fail(at+"/connection", fault.CodeValidationFailed, "connection %q is not declared in the document's connections", name)
		return pick, false
	}
	if v, ok := m["ops"]; ok {
		globs, isList := v.([]any)
		if !isList || len(globs) == 0 {
			p.fail(at+"/ops", fault.CodeValidationFailed, "must be a non-empty array of operation globs")
		}
		for j, g := range globs {
			s, _ := g.(string)
			if _, err := path.Match(s, ""); err != nil || s == "" {
				p.fail(fmt.Sprintf("%s/ops/%d", at, j), fault.CodeValidationFailed, "%v is not a valid glob", g)
				continue
			}
			pick.Ops = append(pick.Ops, s)
		}
		if pick.Ops == nil {
			pick.Ops = []string{}
		}
	}
	return pick, true
}

// stepServer parses {"mcp": {…}}: a server this node attaches for itself,
// validated as a document's own servers are. Its name may not be one the
// document already uses, unless another node attaches the very same
// server.
func (p *parser) stepServer(v any, at string) (ToolPick, bool) {
	m, _ := v.(map[string]any)
	name, _ := m["name"].(string)
	if !registry.ValidName(name) {
		p.fail(at+"/mcp/name", fault.CodeConnectionInvalid, "%q is not a valid connection name (a letter, then letters, digits, '_' or '-')", name)
		return ToolPick{}, false
	}
	if p.declared[name] {
		p.fail(at+"/mcp/name", fault.CodeConnectionNameTaken, "the document already has a connection named %q", name)
		return ToolPick{}, false
	}
	// p.attached validates and records into the document's servers;
	// take the spec back out, since only this node attaches it.
	before := len(p.problems)
	prev, had := p.attachedSpecs[name]
	p.attached(name, v, at)
	spec, ok := p.attachedSpecs[name]
	if had {
		p.attachedSpecs[name] = prev
	} else {
		delete(p.attachedSpecs, name)
	}
	if !ok || len(p.problems) > before {
		return ToolPick{}, false
	}
	if other, seen := p.stepSpecs[name]; seen && !sameSpec(other, spec) {
		p.fail(at+"/mcp/name", fault.CodeConnectionNameTaken, "another node attaches a different server named %q", name)
		return ToolPick{}, false
	}
	if p.stepSpecs == nil {
		p.stepSpecs = map[string]AttachSpec{}
	}
	p.stepSpecs[name] = spec
	return ToolPick{Connection: name, Attach: &spec, Path: at}, true
}

func sameSpec(a, b AttachSpec) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// ToolPick is one {"connection": name, "ops"?: [globs]} or {"mcp": …}
// entry of a model node's tools.
type ToolPick struct {
	Connection string
	Ops        []string // globs; nil: every operation the connection offers
	Attach     *AttachSpec
	Path       string
}
