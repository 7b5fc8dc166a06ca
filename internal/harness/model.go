package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// Model nodes: the agent loop. Choices worth knowing:
//   - Tool calls of one round run one after another, in the model's order,
//     each as its own ledger entry through r.call (the same gates,
//     approvals, secrets and presentation as a call node). A refusal or a
//     failure goes back to the model as an error result (steering_denied
//     names the gate); only waiting, fencing and storage stop the turn.
//   - The same operation of one profile (by the connections' entries), or
//     outside profiles an operation of equal name and input schema, on
//     two connections becomes one tool with a required "target" enum.
//   - A connection's entry may keep operations from tools of their own
//     ("expose"); those are reached through <connection>_ops/_call (see
//     package agent).
//   - A node without tools is offered the document's connections (never a
//     server another node attaches), each cut at run time to what the
//     execution's allowlist grants now (host documents: everything).
//   - A document-attached server a node does not pick is not started only
//     to name tools, and a server a node attaches stays attached until the
//     run ends, like the document's own.
//   - Until "no_tool_calls" gives up after defaultModelRounds rounds (a
//     failure); an explicit maxRounds stops there with the last text,
//     leaving that round's tool calls unrun.
//   - Structured output ({"output": {"schema": …}}): the schema is
//     compiled when the document is parsed (no $ref is fetched: only
//     the schema itself and the built-in metaschemas resolve). Every
//     round's instructions end with a sentence asking for a bare JSON
//     value matching the schema (portable to every model), and the
//     request carries the schema so a provider that can constrain its
//     output does (OpenAI-compatible response_format json_schema; see
//     internal/models). The final answer is parsed (one surrounding
//     ```json fence is tolerated) and validated; an answer that fails
//     gets one corrective round naming the problem, then the node fails
//     with output_invalid. The node's output is the parsed value alone,
//     so later steps read $steps.<id>.<field>; the raw text stays in the
//     round's ledger entry.
//   - A handle (a connection leased from a pool) offers its pool's
//     operations under the handle's name ("app_browser_navigate"), cut by
//     the allowlist's grant on the pool. Naming them takes no lease: the
//     first tool call through the handle leases, for the holder the
//     node's path gives (fresh: path), exactly as a call step would, and
//     later calls of the turn land on the same leased connection.

// checkModels is the submit-time check of a document's model nodes:
// the provider exists, the allowlist grants what the tools pick (nil al
// with trusted false grants nothing), and a toolChoice names a tool, when
// the tool set can be built before the run (no server to attach first).
func (e *Executions) checkModels(doc *document.Document, al *gates.Allowlist, trusted bool) []fault.FieldError {
	var problems []fault.FieldError
	add := func(at string, code fault.Code, format string, args ...any) {
		problems = append(problems, fault.FieldError{Path: at, Code: code, Message: fmt.Sprintf(format, args...)})
	}
	doc.Walk(func(n *document.Node) {
		if n.Kind != document.KindModel || n.Model == nil {
			return
		}
		spec := n.Model
		switch {
		case e.models == nil:
			add(n.Path+"/model", fault.CodeNotSupported, "this deployment has no model providers; configure models in the config file")
		default:
			if err := e.models.Check(spec.Ref); err != nil {
				add(n.Path+"/model", fault.CodeValidationFailed, "%s", err.Error())
			}
		}
		if !trusted {
			for _, pick := range spec.Picks {
				problems = append(problems, agent.CheckPick(doc, al, pick)...)
			}
		}
		if ts, ok, err := e.staticTools(doc, n, al, trusted); err != nil {
			add(n.Path+"/tools", document.CodeToolIDCollision, "%s", err.(*fault.Error).Message)
		} else if ok {
			if err := ts.CheckChoice(spec.ToolChoice); err != nil {
				add(n.Path+"/toolChoice", document.CodeUnknownToolChoice, "%s", err.(*fault.Error).Message)
			}
		}
	})
	return problems
}

// staticTools builds a node's tool set from the registry alone, when no
// server must be attached for it and every connection involved is ready.
// An error is a tool id two connections share (CodeToolIDCollision).
func (e *Executions) staticTools(doc *document.Document, n *document.Node, al *gates.Allowlist, trusted bool) (*agent.ToolSet, bool, error) {
	var turn []agent.ToolSource
	for _, name := range doc.Connections {
		if _, ok := doc.Attached[name]; ok {
			return nil, false, nil
		}
		src, conn, err := e.toolConn(doc, name)
		if err != nil || conn.State() != connect.StateReady {
			return nil, false, nil
		}
		turn = append(turn, agent.SourceOf(doc, name, agent.GrantedOps(al, trusted, src, nil, conn.Manifest().Operations)))
	}
	for _, pick := range n.Model.Picks {
		if pick.Attach != nil {
			return nil, false, nil
		}
	}
	ts, err := agent.BuildToolSet(turn, n.Model.Picks, n.Model.HasTools)
	return ts, err == nil, err
}

// toolConn is the registry connection that names the tools of the
// document's connection name, and the name its allowlist grant is under:
// for a handle, its pool, whose manifest (read from a probe at start) is
// what every lease offers. Naming tools takes no lease; the first call
// through the handle does, as a call step's would.
func (e *Executions) toolConn(doc *document.Document, name string) (grantName string, conn *registry.Connection, err error) {
	if h, ok := doc.Handles[name]; ok {
		conn, err = e.reg.Get(h.Pool)
		return h.Pool, conn, err
	}
	conn, err = e.reg.Get(name)
	return name, conn, err
}

// model runs a model node: rounds of the model and its tool calls until
// it calls no tool or the round limit. Each round and each tool call is a
// ledger entry, so a resumed run replays finished rounds (not paying for
// them again) and finished tool calls (not repeating them).
func (r *run) model(ctx context.Context, f *frame, n *document.Node) (any, error) {
	key := n.ID + f.suffix
	if out, err, ok := r.replayed(key, n); ok {
		return out, err
	}
	r.begin(n, key, "")
	out, err := r.turn(ctx, f, n)
	if errors.Is(err, errWaiting) || errors.Is(err, ErrFenced) || isStorage(err) {
		return nil, err
	}
	if err != nil {
		return nil, r.fail(ctx, key, n, err)
	}
	return r.done(ctx, key, n, out)
}

func (r *run) turn(ctx context.Context, f *frame, n *document.Node) (any, error) {
	spec := n.Model
	if r.e.models == nil {
		return nil, &stepError{step: n.ID, code: fault.StepFailed, err: errors.New("this deployment has no model providers")}
	}
	if err := r.e.models.Check(spec.Ref); err != nil {
		return nil, &stepError{step: n.ID, code: fault.StepFailed, err: err}
	}
	return agent.Turn(ctx, spec, &turnRun{r: r, f: f, n: n})
}

// turnRun is the engine's side of one model node's turn on one path: each
// round, look and tool call a ledger entry of the execution.
type turnRun struct {
	r *run
	f *frame
	n *document.Node
}

func (t *turnRun) Input(ctx context.Context) (string, error) {
	return t.r.modelInput(ctx, t.f, t.n.Model)
}

func (t *turnRun) ToolSet(ctx context.Context) (*agent.ToolSet, error) {
	return t.r.toolSet(ctx, t.n)
}

func (t *turnRun) LookLayer(ctx context.Context) (*agent.LookLayer, error) {
	return t.r.lookLayer(ctx, t.n)
}

func (t *turnRun) Look(ctx context.Context, round int, l *agent.LookLayer, effected map[string]bool) (string, error) {
	return t.r.look(ctx, t.f, t.n, round, l, effected)
}

func (t *turnRun) Round(ctx context.Context, round int, req agent.ModelRequest) (*agent.ModelResponse, error) {
	return t.r.round(ctx, t.f, t.n, round, req)
}

func (t *turnRun) LookCall(ctx context.Context, round int, l *agent.LookLayer, call agent.ModelToolCall) (agent.ModelToolResult, bool, error) {
	return t.r.lookCall(ctx, t.f, t.n, round, l, call)
}

func (t *turnRun) ToolCall(ctx context.Context, round int, ts *agent.ToolSet, call agent.ModelToolCall) (agent.ModelToolResult, error) {
	return t.r.toolCall(ctx, t.f, t.n, round, ts, call)
}

func (t *turnRun) EffectOf(ctx context.Context, ts *agent.ToolSet, call agent.ModelToolCall) string {
	return t.r.effectOf(ctx, ts, call)
}

func (t *turnRun) Failed(code string, err error) error {
	return &stepError{step: t.n.ID, code: code, err: err}
}

// modelInput is the user message: the node's input (default $input), as
// text; anything but a string is sent as JSON.
func (r *run) modelInput(ctx context.Context, f *frame, spec *document.ModelSpec) (string, error) {
	r.mu.Lock()
	sc := r.scope(f)
	sc.Ctx = ctx
	var v any = sc.Input
	var err error
	if spec.Input != nil {
		v, err = spec.Input.Eval(sc)
	}
	r.mu.Unlock()
	if err != nil {
		return "", err
	}
	if s, ok := v.(string); ok {
		return s, nil
	}
	if v == nil {
		return "", nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("model input: %w", err)
	}
	return string(data), nil
}

// round runs (or replays) one round of the model.
func (r *run) round(ctx context.Context, f *frame, n *document.Node, round int, req agent.ModelRequest) (*agent.ModelResponse, error) {
	rn := &document.Node{Kind: agent.EntryRound, ID: fmt.Sprintf("%s/round:%d", n.ID, round), Op: n.Model.Ref}
	key := rn.ID + f.suffix
	if out, err, ok := r.replayed(key, rn); ok {
		if err != nil {
			return nil, err
		}
		return agent.DecodeRound(out)
	}
	r.begin(rn, key, "")
	r.update(key, func(st *StepRecord) { st.Status = StepPending })
	if err := r.save(ctx); err != nil {
		return nil, err
	}
	emit := func(ctx context.Context, data map[string]any) { r.e.emit(ctx, r.rec.ID, agent.EventModelDelta, data) }
	stream := agent.NewDeltaStream(ctx, emit, key, n.ID, round)
	tctx, endRound := r.traceRound(ctx, n.Model)
	resp, err := r.e.models.Turn(tctx, req, stream.Add)
	endRound(resp, err)
	stream.Flush()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
		}
		return nil, r.fail(ctx, key, rn, &stepError{step: n.ID, code: callErrorKind(err), err: fmt.Errorf("model %s: %w", n.Model.Ref, err)})
	}
	r.countTokens(n.Model, resp.Usage)
	names := make([]string, len(resp.ToolCalls))
	for i, c := range resp.ToolCalls {
		names[i] = c.Name
	}
	r.e.emit(ctx, r.rec.ID, agent.EventModelRound, map[string]any{"key": key, "id": n.ID, "round": round, "toolCalls": names,
		"usage": resp.Usage, "stopReason": resp.StopReason})
	out, err := r.done(ctx, key, rn, r.e.redact(agent.RoundOutput(n.Model.Ref, resp)))
	if err != nil {
		return nil, err
	}
	return agent.DecodeRound(out)
}

func (r *run) countTokens(spec *document.ModelSpec, u agent.ModelUsage) {
	obs, ok := r.e.observer.(agent.TokenObserver)
	if !ok {
		return
	}
	obs.ModelTokens(spec.Provider(), spec.Name(), "input", u.InputTokens)
	obs.ModelTokens(spec.Provider(), spec.Name(), "output", u.OutputTokens)
}

// toolCall runs one tool call of a round as a call step of its own (ledger
// key "<node>/round:<n>/tool:<call id>"), through the same gates,
// approvals included. A refusal or failure goes back to the model as an
// error result; only waiting, fencing and storage failures stop the turn.
func (r *run) toolCall(ctx context.Context, f *frame, n *document.Node, round int, ts *agent.ToolSet, call agent.ModelToolCall) (agent.ModelToolResult, error) {
	tn := &document.Node{Kind: agent.EntryTool, ID: fmt.Sprintf("%s/round:%d/tool:%s", n.ID, round, call.ID)}
	res := agent.ModelToolResult{CallID: call.ID}
	var args map[string]any
	if len(call.Args) > 0 && json.Unmarshal(call.Args, &args) != nil {
		args = nil
	}
	if args == nil {
		args = map[string]any{}
	}
	if t := ts.ByName[call.Name]; t != nil && t.Lists {
		return r.listOps(t.Pair, res, args), nil
	}
	return r.runToolCall(ctx, f, tn, ts, call.Name, args, nil, res)
}

// runToolCall runs a call of tool (of ts) as the call step tn, or records
// it refused when ts cannot resolve it or refuse is set, and answers it as
// its caller reads it: a refusal or failure is an error result; only
// waiting, fencing and storage failures (and a context cut short) are
// errors.
func (r *run) runToolCall(ctx context.Context, f *frame, tn *document.Node, ts *agent.ToolSet, tool string, args map[string]any, refuse error, res agent.ModelToolResult) (agent.ModelToolResult, error) {
	conn, op, rest, rerr := ts.Resolve(tool, args)
	if rerr == nil {
		rerr = refuse
	}
	tn.Connection, tn.Op = conn, op
	var out any
	var err error
	if rerr != nil {
		out, err = r.refused(ctx, f, tn, rerr)
	} else {
		tn.Args = make(map[string]document.Value, len(rest))
		for k, v := range rest {
			tn.Args[k] = document.NewLiteral(v)
		}
		out, err = r.call(ctx, f, tn)
	}
	switch {
	case errors.Is(err, errWaiting), errors.Is(err, ErrFenced), isStorage(err):
		return res, err
	case err != nil && ctx.Err() != nil:
		return res, err
	case err != nil:
		res.IsError, res.Content = true, r.e.redactor.String(toolErrorText(err))
		return res, nil
	}
	res.Content = r.toolContent(out)
	return res, nil
}

// refused records a tool call refused before it reached a connection (an
// unknown tool, a target the step may not reach) as a failed entry.
func (r *run) refused(ctx context.Context, f *frame, tn *document.Node, reason error) (any, error) {
	key := tn.ID + f.suffix
	if out, err, ok := r.replayed(key, tn); ok {
		return out, err
	}
	r.begin(tn, key, tn.Connection)
	return nil, r.fail(ctx, key, tn, reason)
}

// toolContent is a tool result as the model reads it: text as is,
// anything else as JSON; redacted and bounded.
func (r *run) toolContent(out any) string {
	s, ok := out.(string)
	if !ok {
		data, err := json.Marshal(out)
		if err != nil {
			data = []byte(fmt.Sprintf("%v", out))
		}
		s = string(data)
	}
	return agent.BoundForModel(r.e.redactor.String(s))
}

// toolSet builds the node's tools from the turn's connections, attaching
// the servers the document or the node brings as needed, each cut to what
// the execution's allowlist grants.
func (r *run) toolSet(ctx context.Context, n *document.Node) (*agent.ToolSet, error) {
	al, trusted, err := r.grants(ctx)
	if err != nil {
		return nil, err
	}
	spec := n.Model
	picked := map[string]bool{}
	for _, p := range spec.Picks {
		picked[p.Connection] = true
	}
	var turn []agent.ToolSource
	for _, name := range r.doc.Connections {
		if _, isHandle := r.doc.Handles[name]; isHandle {
			pool, conn, err := r.e.toolConn(r.doc, name)
			if st := conn.State(); err == nil && st != connect.StateReady {
				err = fmt.Errorf("pool %s is %s: %w", pool, st, connect.ErrUnavailable)
			}
			if err != nil {
				return nil, &stepError{step: n.ID, code: fault.ConnectionUnavailable, err: err}
			}
			turn = append(turn, agent.SourceOf(r.doc, name, agent.GrantedOps(al, trusted, pool, nil, conn.Manifest().Operations)))
			continue
		}
		attach, isAttached := r.doc.Attached[name]
		if isAttached && spec.HasTools && !picked[name] {
			continue // not worth starting a server only to name its tools
		}
		conn, err := r.conn(ctx, name)
		if err != nil {
			return nil, &stepError{step: n.ID, code: fault.ConnectionUnavailable, err: err}
		}
		var as *document.AttachSpec
		if isAttached {
			as = &attach
		}
		turn = append(turn, agent.SourceOf(r.doc, name, agent.GrantedOps(al, trusted, name, as, conn.Manifest().Operations)))
	}
	for _, p := range spec.Picks {
		if p.Attach == nil {
			continue
		}
		conn, err := r.attach(ctx, *p.Attach)
		if err != nil {
			return nil, &stepError{step: n.ID, code: fault.ConnectionUnavailable, err: err}
		}
		turn = append(turn, agent.ToolSource{Name: p.Connection, Step: true, Ops: agent.GrantedOps(al, trusted, p.Connection, p.Attach, conn.Manifest().Operations)})
	}
	ts, err := agent.BuildToolSet(turn, spec.Picks, spec.HasTools)
	if err != nil {
		return nil, &stepError{step: n.ID, code: string(document.CodeToolIDCollision), err: err}
	}
	return ts, nil
}

// grants returns the allowlist that bounds this execution's model tools;
// trusted is true for a host document (a trigger's), which none bounds.
func (r *run) grants(ctx context.Context) (*gates.Allowlist, bool, error) {
	if r.rec.Allowlist == nil {
		return nil, true, nil
	}
	al, err := r.e.allowlist(ctx, *r.rec.Allowlist)
	if err != nil {
		return nil, false, &storageError{err}
	}
	return al, false, nil
}

// listOps answers a call of an _ops tool from the turn's tool set. No
// connection is called, so no ledger entry is written: a resumed turn
// answers it again from the same tool set.
func (r *run) listOps(p *agent.CallPair, res agent.ModelToolResult, args map[string]any) agent.ModelToolResult {
	page, err := p.List(args)
	if err != nil {
		res.IsError, res.Content = true, fault.SteeringDenied+": "+err.Error()
		return res
	}
	res.Content = r.toolContent(page)
	return res
}

func toolErrorText(err error) string {
	var se *stepError
	if errors.As(err, &se) {
		return se.code + ": " + se.err.Error()
	}
	return err.Error()
}
