// Package agent holds what a model turn is made of, apart from running it:
// the provider-neutral model API (Models, ModelRequest, ModelResponse and
// their parts; cmd/server adapts internal/models to it), the tool set a
// turn offers (one tool per operation, merged tools across connections,
// the _ops/_call pairs of exposure, the names models see), the look layer
// (reads shown to the model each round: whole, as a diff or unchanged) and
// the ledger records of rounds and looks, and the loop itself (Turn): what
// to ask the model each round, which calls to run, when to stop. The loop
// reaches the engine only through Run, which the engine implements for one
// node on one path: each round, look and tool call is a ledger entry it
// replays or records, tool calls pass the gates, and it emits the events.
package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// EntryTool marks the ledger entry of one tool call a model made, and
// EntryRound the entry of one model round.
const (
	EntryTool  = "tool"
	EntryRound = "model.round"
)

// Model turn limits at run time.
const (
	// maxToolResult bounds one tool result sent to the model.
	maxToolResult = 64 << 10
	// deltaFlushEvery coalesces streamed text into events, so a long
	// answer is a few dozen events rather than thousands.
	deltaFlushEvery = 100 * time.Millisecond
	deltaFlushBytes = 4 << 10
)

// Event types of model turns.
const (
	EventModelDelta = "model.delta" // {key, id, round, text}: streamed text, coalesced
	EventModelRound = "model.round" // {key, id, round, toolCalls, usage, stopReason}
)

// Models runs model turns for the harness; cmd/server adapts
// internal/models to it, so the harness imports no provider SDK.
type Models interface {
	// Check reports whether model ("<provider>/<name>") can be served;
	// the error says what is missing (an unknown provider).
	Check(model string) error
	// Turn runs one round: the transcript and tools in, what the model
	// said or asked to call out. onDelta receives streamed fragments.
	Turn(ctx context.Context, req ModelRequest, onDelta func(ModelDelta)) (*ModelResponse, error)
}

// TokenObserver is implemented by an Observer that counts model tokens.
// It is a separate interface so existing Observers keep compiling.
type TokenObserver interface {
	// ModelTokens records tokens of one round; direction is "input" or
	// "output".
	ModelTokens(provider, model, direction string, tokens int64)
}

// Transcript roles.
const (
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleTool      = "tool" // the results of the previous message's tool calls
)

// ModelRequest is one round, provider-neutral.
type ModelRequest struct {
	// Model is "<provider>/<name>" as the document wrote it.
	Model        string
	Instructions string
	Messages     []ModelMessage
	Tools        []ModelTool
	// ToolChoice is "", "auto", "none", "required" or a tool name.
	ToolChoice string
	MaxTokens  int64
	// OutputSchema is the JSON Schema the final answer must match (nil:
	// free text). Instructions already ask for it in words; a provider
	// that can also constrain its output to a schema should.
	OutputSchema json.RawMessage
}

// ModelMessage is one transcript entry.
type ModelMessage struct {
	Role        string
	Text        string
	ToolCalls   []ModelToolCall
	ToolResults []ModelToolResult
}

// ModelTool is a tool as the model is given it.
type ModelTool struct {
	Name string
	// Description starts with the connection(s) in brackets and ends with
	// the operation's behaviour hints.
	Description string
	InputSchema json.RawMessage
	Annotations connect.Annotations
}

// ModelToolCall is a call the model asked for.
type ModelToolCall struct {
	ID   string          `json:"id"`
	Name string          `json:"name"`
	Args json.RawMessage `json:"args"`
}

// ModelToolResult answers one tool call; Content is redacted.
type ModelToolResult struct {
	CallID  string
	Content string
	IsError bool
}

// ModelUsage is the token use of one round.
type ModelUsage struct {
	InputTokens  int64 `json:"inputTokens"`
	OutputTokens int64 `json:"outputTokens"`
}

// ModelResponse is what one round returned.
type ModelResponse struct {
	Text       string          `json:"text,omitempty"`
	ToolCalls  []ModelToolCall `json:"toolCalls,omitempty"`
	StopReason string          `json:"stopReason,omitempty"`
	Usage      ModelUsage      `json:"usage"`
}

// ModelDelta is a streamed fragment of a round: text, or a piece of a tool
// call (ToolCallIndex, with the id and name on its first piece).
type ModelDelta struct {
	Text          string
	ToolCallIndex int
	ToolCallID    string
	ToolName      string
	ArgsFragment  string
}

// CheckPick reports what a pick asks for beyond the allowlist: each ops
// glob must lie inside a granted one.
func CheckPick(doc *document.Document, al *gates.Allowlist, pick document.ToolPick) []fault.FieldError {
	var problems []fault.FieldError
	deny := func(at, format string, args ...any) {
		problems = append(problems, fault.FieldError{Path: at, Code: gates.CodeConnectionNotAllowed, Message: fmt.Sprintf(format, args...)})
	}
	spec := pick.Attach
	if spec == nil {
		if s, ok := doc.Attached[pick.Connection]; ok {
			spec = &s
		}
	}
	var granted []string
	h, isHandle := doc.Handles[pick.Connection]
	switch {
	case isHandle:
		// A handle's tools are its pool's operations, judged by the
		// pool's grant as a call step through the handle is.
		g, ok := gates.Grant{}, al != nil
		if ok {
			g, ok = al.Connections[h.Pool]
		}
		if !ok {
			deny(pick.Path+"/connection", "the allowlist grants no access to pool %q (handle %s)", h.Pool, pick.Connection)
			return problems
		}
		granted = g.Ops
	case spec != nil:
		g, ok := al.MCPGrant(*spec)
		if !ok {
			deny(pick.Path, "the allowlist grants no server %q at that exact url or command", spec.Name)
			return problems
		}
		if pick.Attach != nil {
			for _, sec := range spec.Secrets() {
				if !containsString(g.Secrets, sec) {
					deny(pick.Path+"/mcp", "the allowlist does not grant secret %q to server %q", sec, spec.Name)
				}
			}
		}
		granted = g.Ops
	default:
		g, ok := gates.Grant{}, al != nil
		if ok {
			g, ok = al.Connections[pick.Connection]
		}
		if !ok {
			deny(pick.Path+"/connection", "the allowlist grants no access to connection %q", pick.Connection)
			return problems
		}
		granted = g.Ops
	}
	for i, glob := range pick.Ops {
		if !globInside(glob, granted) {
			deny(fmt.Sprintf("%s/ops/%d", pick.Path, i), "%q is not inside the operations the allowlist grants on %s (%s)", glob, pick.Connection, strings.Join(granted, ", "))
		}
	}
	return problems
}

// globInside reports whether every name glob matches is matched by one of
// granted: glob, read as a name, matches a granted glob ("ui.tap" and
// "ui.*" lie inside "ui.*"; "*" does not).
func globInside(glob string, granted []string) bool {
	for _, g := range granted {
		if ok, _ := path.Match(g, glob); ok {
			return true
		}
	}
	return false
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// GrantedOps cuts ops to what the allowlist grants on a connection (spec:
// a server the document or a node attaches).
func GrantedOps(al *gates.Allowlist, trusted bool, name string, spec *document.AttachSpec, ops []connect.Operation) []connect.Operation {
	if trusted {
		return ops
	}
	var globs []string
	if spec != nil {
		g, ok := al.MCPGrant(*spec)
		if !ok {
			return nil
		}
		globs = g.Ops
	} else {
		if al == nil {
			return nil
		}
		g, ok := al.Connections[name]
		if !ok {
			return nil
		}
		globs = g.Ops
	}
	var out []connect.Operation
	for _, op := range ops {
		if document.MatchOp(globs, op.Name) {
			out = append(out, op)
		}
	}
	return out
}

// ForcesCall reports whether a tool choice makes the model call a tool
// ("required", its synonym "any", or a tool's name).
func ForcesCall(choice string) bool { return choice != "" && choice != "auto" && choice != "none" }

// RoundOutput is what the ledger keeps of a round: the response with its
// tool calls, and its token use.
func RoundOutput(model string, resp *ModelResponse) any {
	data, err := json.Marshal(resp)
	if err != nil {
		return map[string]any{"model": model}
	}
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	m["model"] = model
	return m
}

func DecodeRound(out any) (*ModelResponse, error) {
	return decodeLedger[ModelResponse]("model round", out)
}

// decodeLedger turns a ledger entry's output (decoded JSON) back into the
// T it was written from; what names the entry in an error.
func decodeLedger[T any](what string, out any) (*T, error) {
	data, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("%s: decode ledger: %w", what, err)
	}
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("%s: decode ledger: %w", what, err)
	}
	return &v, nil
}

// deltaStream turns streamed text into model.delta events, coalesced.
// newDeltaStream coalesces the streamed text of one round of the model node
// id (ledger key key) into model.delta events, written through emit.
func NewDeltaStream(ctx context.Context, emit func(ctx context.Context, data map[string]any), key, id string, round int) *deltaStream {
	return &deltaStream{emit: emit, ctx: ctx, key: key, id: id, round: round, last: time.Now()}
}

type deltaStream struct {
	// emit writes one model.delta event on the execution's stream.
	emit  func(ctx context.Context, data map[string]any)
	ctx   context.Context
	key   string
	id    string
	round int
	buf   strings.Builder
	last  time.Time
}

func (d *deltaStream) Add(md ModelDelta) {
	if md.Text == "" {
		return
	}
	d.buf.WriteString(md.Text)
	if time.Since(d.last) >= deltaFlushEvery || d.buf.Len() >= deltaFlushBytes {
		d.Flush()
	}
}

func (d *deltaStream) Flush() {
	if d.buf.Len() == 0 {
		return
	}
	d.emit(d.ctx, map[string]any{"key": d.key, "id": d.id, "round": d.round, "text": d.buf.String()})
	d.buf.Reset()
	d.last = time.Now()
}

// BoundForModel cuts text the model is given (a tool result, a read) to
// maxToolResult, saying how long it was.
func BoundForModel(s string) string {
	if len(s) > maxToolResult {
		s = connect.CutOnRune(s, maxToolResult) + fmt.Sprintf("… [cut: %d bytes in all]", len(s))
	}
	return s
}
