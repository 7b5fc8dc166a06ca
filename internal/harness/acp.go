package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/patchbay-dev/patchbay/internal/acp"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/proctree"
)

// acp-agent nodes: patchbay is the ACP client of a coding agent the config
// file declares (package acp). Choices worth knowing:
//   - The agent gets one MCP server, this process's own /mcp, with a
//     credential minted for the node run (see bridge.go): the tools a
//     model node with the same picks would see, through the same gates.
//   - Its permission requests (before one of its own tools, such as a
//     shell command) are decided by the entry's permissions by tool kind,
//     else become approvals in the queue, waited for in place; the
//     decision goes back as the option the agent offered.
//   - The node's ledger entry records the agent's session id and its
//     process tree's tag while it runs. A run resumed after a crash ends
//     what is left of the old tree, starts the agent again, loads the
//     session where the agent supports session/load, and sends the prompt
//     again (ACP cannot resume a turn); where it cannot load, the prompt
//     goes to a new session only when the entry is replayable. Bridged
//     calls already answered are replayed from the ledger, not sent.
//   - Cancel and the entry's timeout send session/cancel and end the
//     agent's whole process tree; so does the end of the node run.
//   - The node's output is the agent's final message of the prompt turn
//     (its agent_message_chunk text), or that text parsed as JSON matching
//     the node's output schema.

// AgentEntry is an agent of the config file as the engine runs it.
type AgentEntry struct {
	Command string
	Args    []string
	// Env is the agent's environment beside PATH and HOME; a value that
	// is exactly ${secret:NAME} is resolved through the secret store when
	// the agent starts. Every value is redacted.
	Env map[string]string
	// Cwd is the working directory and the root of FS and Terminal;
	// empty: a fresh temporary directory per node run.
	Cwd     string
	Timeout time.Duration
	// Allow and Deny decide permission requests by ACP tool kind ("*":
	// any) without asking a person; Deny wins.
	Allow, Deny  []string
	FS, Terminal bool
	Replayable   bool
}

// Events of acp-agent nodes.
const (
	EventAgentMessage  = "agent.message"   // {key, id, text}: the agent's message, coalesced
	EventAgentToolCall = "agent.tool_call" // {key, id, toolCallId, title?, kind?, status?}
	EventAgentPlan     = "agent.plan"      // {key, id, entries}
)

// agentRunNode is an acp-agent node's ledger entry kind (the node's own).
const agentSessionKind = "acp-agent"

// checkAgents is the submit-time check of a document's acp-agent nodes:
// the agent exists in the config file and the picks are granted.
func (e *Executions) checkAgents(doc *document.Document, al *gates.Allowlist, trusted bool) []fault.FieldError {
	var problems []fault.FieldError
	doc.Walk(func(n *document.Node) {
		if n.Kind != document.KindACPAgent || n.Agent == nil {
			return
		}
		if _, ok := e.agents[n.Agent.Agent]; !ok {
			problems = append(problems, fault.FieldError{Path: n.Path + "/agent", Code: fault.CodeValidationFailed,
				Message: fmt.Sprintf("no agent named %q under the config file's agents (%s)", n.Agent.Agent, strings.Join(e.agentNames(), ", "))})
		}
		if !trusted {
			for _, pick := range n.Model.Picks {
				problems = append(problems, agent.CheckPick(doc, al, pick)...)
			}
		}
		if _, _, err := e.staticTools(doc, n, al, trusted); err != nil {
			problems = append(problems, fault.FieldError{Path: n.Path + "/tools", Code: document.CodeToolIDCollision, Message: err.(*fault.Error).Message})
		}
	})
	return problems
}

func (e *Executions) agentNames() []string {
	names := make([]string, 0, len(e.agents))
	for name := range e.agents {
		names = append(names, name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		return []string{"none are configured"}
	}
	return names
}

// SetAgentBridge sets the /mcp URL agents reach this process's tool
// bridge at (http://127.0.0.1:<port>/mcp); the server knows it once it
// listens.
func (e *Executions) SetAgentBridge(url string) { e.bridgeURL.Store(&url) }

// acpAgent runs an acp-agent node (see above).
func (r *run) acpAgent(ctx context.Context, f *frame, n *document.Node) (any, error) {
	key := n.ID + f.suffix
	if out, err, ok := r.replayed(key, n); ok {
		return out, err
	}
	r.begin(n, key, "")
	out, err := r.agentTurn(ctx, f, n, key)
	if errors.Is(err, ErrFenced) || isStorage(err) {
		return nil, err
	}
	if errors.Is(context.Cause(ctx), errCancelled) {
		return nil, context.Cause(ctx)
	}
	if err != nil {
		return nil, r.fail(ctx, key, n, err)
	}
	return r.done(ctx, key, n, out)
}

func (r *run) agentTurn(ctx context.Context, f *frame, n *document.Node, key string) (any, error) {
	entry, ok := r.e.agents[n.Agent.Agent]
	if !ok {
		return nil, &stepError{step: n.ID, code: fault.StepFailed, err: fmt.Errorf("no agent named %q in this deployment", n.Agent.Agent)}
	}
	bridgeURL := r.e.bridgeURL.Load()
	if bridgeURL == nil {
		return nil, &stepError{step: n.ID, code: fault.StepFailed, err: errors.New("this process serves no /mcp for agents to reach")}
	}
	prompt, err := r.modelInput(ctx, f, n.Model)
	if err != nil {
		return nil, &stepError{step: n.ID, code: fault.StepFailed, err: fmt.Errorf("prompt: %w", err)}
	}
	ts, err := r.toolSet(ctx, n)
	if err != nil {
		return nil, err
	}
	al, _, err := r.grants(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, entry.Timeout, errAgentTimeout)
	defer cancel()
	credential, closeBridge := r.openBridge(ctx, f, n, ts, al)
	defer closeBridge()
	s, err := r.startAgent(ctx, n, key, entry, ts, credential, *bridgeURL)
	if err != nil {
		return nil, err
	}
	defer s.close()
	text, err := s.prompt(ctx, prompt)
	if err != nil {
		return nil, err
	}
	if n.Model.Output == nil {
		return text, nil
	}
	v, perr := n.Model.Output.Parse(text)
	if perr != nil {
		return nil, &stepError{step: n.ID, code: fault.OutputInvalid, err: perr}
	}
	return v, nil
}

var errAgentTimeout = errors.New("the agent did not finish within its entry's timeoutMs")

// agentSession is one node run's agent: the process, its session, and
// the client side patchbay answers the agent with.
type agentSession struct {
	r     *run
	n     *document.Node
	key   string
	entry AgentEntry
	tools *agent.ToolSet
	conn  *acp.Conn
	id    string
	dir   string // a temporary working directory to remove, or ""

	mu      sync.Mutex
	text    strings.Builder // the final message of the current turn
	pending strings.Builder // message text not yet emitted
	last    time.Time
	asked   int // permission requests so far, naming their approvals
}

// startAgent ends what a crashed run left of the agent, starts it again
// and opens (or loads) its session, recording both in the node's entry.
func (r *run) startAgent(ctx context.Context, n *document.Node, key string, entry AgentEntry, ts *agent.ToolSet, credential, bridgeURL string) (*agentSession, error) {
	s := &agentSession{r: r, n: n, key: key, entry: entry, tools: ts}
	prevSession, prevTree := r.agentState(key)
	if prevTree != "" {
		if _, err := proctree.NewTree(prevTree).Kill(2 * time.Second); err != nil {
			r.e.logger.Warn("ending what a crashed run left of an agent", "execution", r.rec.ID, "step", n.ID, "err", err)
		}
	}
	cwd := entry.Cwd
	if cwd == "" {
		dir, err := os.MkdirTemp("", "patchbay-agent-")
		if err != nil {
			return nil, &stepError{step: n.ID, code: fault.StepFailed, err: fmt.Errorf("agent working directory: %w", err)}
		}
		cwd, s.dir = dir, dir
	}
	env, err := r.agentEnv(ctx, entry)
	if err != nil {
		s.close()
		return nil, &stepError{step: n.ID, code: fault.StepFailed, err: err}
	}
	tag := proctree.NewTag()
	r.update(key, func(st *StepRecord) { st.Status, st.Tree = StepPending, tag })
	if err := r.save(ctx); err != nil {
		s.close()
		return nil, err
	}
	opts := acp.Options{ClientInfo: &acp.Implementation{Name: "patchbay", Version: "1"}, Logger: r.e.logger}
	if entry.FS {
		opts.FS = &acp.FSOptions{Root: cwd, Write: true}
	}
	if entry.Terminal {
		opts.Terminal = &acp.TerminalOptions{Root: cwd, Env: env}
	}
	cmd := acp.Command{Path: entry.Command, Args: entry.Args, Env: env, Dir: cwd, Stderr: &agentLog{r: r, n: n}}
	s.conn, err = acp.Start(proctree.WithTag(ctx, tag), cmd, s, opts)
	if err != nil {
		s.close()
		return nil, &stepError{step: n.ID, code: fault.ConnectionUnavailable, err: fmt.Errorf("agent %s: %w", n.Agent.Agent, err)}
	}
	if err := s.open(ctx, cwd, prevSession, credential, bridgeURL); err != nil {
		s.close()
		return nil, err
	}
	r.update(key, func(st *StepRecord) { st.Session = s.id })
	if err := r.save(ctx); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// agentState is what the node's entry recorded of an earlier run: the
// agent's session id and its process tree's tag.
func (r *run) agentState(key string) (session, tree string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i := r.entry(key); i >= 0 {
		return r.rec.Steps[i].Session, r.rec.Steps[i].Tree
	}
	return "", ""
}

// agentEnv is the agent's whole environment: PATH and HOME of this
// process, and the entry's variables, secrets resolved and redacted.
func (r *run) agentEnv(ctx context.Context, entry AgentEntry) ([]string, error) {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for _, k := range document.SortedKeys(entry.Env) {
		v := entry.Env[k]
		if name, ok := secretRef(v); ok {
			if r.e.secrets == nil {
				return nil, fmt.Errorf("agent env %s: no secret store for ${secret:%s}", k, name)
			}
			resolved, err := r.e.secrets.Resolve(ctx, name)
			if err != nil {
				return nil, fmt.Errorf("agent env %s: %w", k, err)
			}
			v = resolved
		}
		if len(v) >= 8 {
			r.e.redactor.Add(v)
		}
		env = append(env, k+"="+v)
	}
	return env, nil
}

// secretRef reports whether s is exactly ${secret:NAME}.
func secretRef(s string) (string, bool) {
	name, ok := strings.CutPrefix(s, "${secret:")
	if !ok || !strings.HasSuffix(name, "}") {
		return "", false
	}
	return strings.TrimSuffix(name, "}"), true
}

// open initializes the agent and opens its session: the recorded one
// loaded where the agent can, else a new one (after a crash, only for a
// replayable entry).
func (s *agentSession) open(ctx context.Context, cwd, prev, credential, bridgeURL string) error {
	info, err := s.conn.Initialize(ctx)
	if err != nil {
		return s.failed(ctx, fmt.Errorf("initialize: %w", err))
	}
	var servers []acp.MCPServer
	switch {
	case len(s.tools.List()) == 0:
		// Nothing to bridge: the agent gets no MCP server.
	case !info.AgentCapabilities.MCPCapabilities.HTTP:
		return &stepError{step: s.n.ID, code: fault.StepFailed, err: fmt.Errorf(
			"agent %s does not connect to MCP servers over HTTP (it declared no mcpCapabilities.http), and the node's tools reach it only that way", s.n.Agent.Agent)}
	default:
		servers = []acp.MCPServer{{Type: "http", Name: "patchbay", URL: bridgeURL,
			Headers: []acp.Header{{Name: "Authorization", Value: "Bearer " + credential}}}}
	}
	if prev != "" {
		if info.AgentCapabilities.LoadSession {
			err := s.conn.LoadSession(ctx, prev, cwd, servers)
			if err == nil {
				s.id = prev
				s.mu.Lock()
				s.text.Reset() // the replayed history is not this turn's answer
				s.pending.Reset()
				s.mu.Unlock()
				return nil
			}
			s.r.e.logger.Warn("agent could not load its session; starting a new one", "execution", s.r.rec.ID, "step", s.n.ID, "err", err)
		}
		if !s.entry.Replayable {
			return &stepError{step: s.n.ID, code: fault.StepFailed, err: errors.New(
				"the agent's run was cut short and it cannot load its session; its entry is not replayable, so the prompt is not sent again (set determinism: replayable to allow it)")}
		}
	}
	s.id, err = s.conn.NewSession(ctx, cwd, servers)
	if err != nil {
		return s.failed(ctx, fmt.Errorf("session/new: %w", err))
	}
	return nil
}

// prompt sends the prompt and returns the agent's final message.
func (s *agentSession) prompt(ctx context.Context, text string) (string, error) {
	reason, err := s.conn.Prompt(ctx, s.id, text)
	s.flush(context.WithoutCancel(ctx))
	if err != nil {
		return "", s.failed(ctx, fmt.Errorf("session/prompt: %w", err))
	}
	switch reason {
	case acp.StopEndTurn:
	case acp.StopCancelled:
		return "", s.failed(ctx, errors.New("the agent's turn was cancelled"))
	default:
		return "", &stepError{step: s.n.ID, code: fault.StepFailed, err: fmt.Errorf("the agent stopped: %s", reason)}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.text.String(), nil
}

// failed is err as the node's failure, or the run's interruption when the
// node was cut short (cancelled, timed out, fenced).
func (s *agentSession) failed(ctx context.Context, err error) error {
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, errAgentTimeout):
		return &stepError{step: s.n.ID, code: fault.Timeout, err: cause}
	case cause != nil:
		return cause
	}
	return &stepError{step: s.n.ID, code: fault.StepFailed, err: err}
}

// close ends the agent's process tree and its working directory.
func (s *agentSession) close() {
	if s.conn != nil {
		if err := s.conn.Close(); err != nil {
			s.r.e.logger.Warn("ending an agent", "execution", s.r.rec.ID, "step", s.n.ID, "err", err)
		}
	}
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// SessionUpdate implements acp.Client: the agent's messages, tool calls
// and plan become execution events.
func (s *agentSession) SessionUpdate(ctx context.Context, u acp.SessionNotification) {
	switch u.Kind {
	case acp.UpdateAgentMessageChunk:
		if u.Content != nil && u.Content.Type == "text" {
			s.message(ctx, u.Content.Text)
		}
	case acp.UpdateToolCall, acp.UpdateToolCallUpdate:
		if u.ToolCall == nil {
			return
		}
		s.flush(ctx)
		data := map[string]any{"key": s.key, "id": s.n.ID, "toolCallId": u.ToolCall.ToolCallID}
		for k, v := range map[string]string{"title": u.ToolCall.Title, "kind": u.ToolCall.Kind, "status": u.ToolCall.Status} {
			if v != "" {
				data[k] = v
			}
		}
		s.r.e.emit(ctx, s.r.rec.ID, EventAgentToolCall, data)
	case acp.UpdatePlan:
		s.flush(ctx)
		s.r.e.emit(ctx, s.r.rec.ID, EventAgentPlan, map[string]any{"key": s.key, "id": s.n.ID, "entries": u.Plan})
	}
}

// Agent messages are coalesced as a model's deltas are.
const (
	agentFlushEvery = 100 * time.Millisecond
	agentFlushBytes = 4 << 10
	maxAgentText    = 1 << 20
)

func (s *agentSession) message(ctx context.Context, text string) {
	s.mu.Lock()
	if s.text.Len() < maxAgentText {
		s.text.WriteString(text)
	}
	s.pending.WriteString(text)
	due := time.Since(s.last) >= agentFlushEvery || s.pending.Len() >= agentFlushBytes
	s.mu.Unlock()
	if due {
		s.flush(ctx)
	}
}

func (s *agentSession) flush(ctx context.Context) {
	s.mu.Lock()
	text := s.pending.String()
	s.pending.Reset()
	s.last = time.Now()
	s.mu.Unlock()
	if text != "" {
		s.r.e.emit(ctx, s.r.rec.ID, EventAgentMessage, map[string]any{"key": s.key, "id": s.n.ID, "text": text})
	}
}

// RequestPermission implements acp.Client: the entry's permissions decide
// by tool kind, else a person does through the approval queue.
func (s *agentSession) RequestPermission(ctx context.Context, req acp.PermissionRequest) (acp.PermissionOutcome, error) {
	kind := req.ToolCall.Kind
	if kind == "" {
		kind = "other"
	}
	switch {
	case matchesKind(s.entry.Deny, kind):
		return req.Pick(acp.RejectOnce, acp.RejectAlways), nil
	case matchesKind(s.entry.Allow, kind):
		return req.Pick(acp.AllowOnce, acp.AllowAlways), nil
	}
	s.mu.Lock()
	s.asked++
	k := s.asked
	s.mu.Unlock()
	approved, err := s.r.askPermission(ctx, s, req, kind, k)
	if err != nil {
		return acp.PermissionOutcome{}, err
	}
	if approved {
		return req.Pick(acp.AllowOnce, acp.AllowAlways), nil
	}
	return req.Pick(acp.RejectOnce, acp.RejectAlways), nil
}

func matchesKind(kinds []string, kind string) bool {
	return slices.Contains(kinds, kind) || slices.Contains(kinds, "*")
}

// askPermission puts a permission request in the approval queue as a
// step of its own ("<node>/permission:<toolCallId>"), waits for the
// decision in place, and records it, so a resumed run asked again by the
// agent for the same tool call reuses the decision.
func (r *run) askPermission(ctx context.Context, s *agentSession, req acp.PermissionRequest, kind string, k int) (bool, error) {
	id := req.ToolCall.ToolCallID
	if id == "" || !ValidCallID(id) {
		id = fmt.Sprintf("p%d", k)
	}
	pn := &document.Node{Kind: "permission", ID: s.n.ID + "/permission:" + id, Connection: "agent:" + s.n.Agent.Agent, Op: kind}
	key := pn.ID + s.key[len(s.n.ID):]
	if out, err, ok := r.replayed(key, pn); ok {
		b, _ := out.(bool)
		return b && err == nil, nil
	}
	r.begin(pn, key, pn.Connection)
	args := map[string]any{"title": req.ToolCall.Title, "kind": kind, "options": req.Options}
	if len(req.ToolCall.RawInput) > 0 {
		var raw any
		if json.Unmarshal(req.ToolCall.RawInput, &raw) == nil {
			args["rawInput"] = raw
		}
	}
	now := time.Now().UTC()
	ap, err := r.e.approvals.Request(ctx, &gates.Approval{
		ID: gates.ApprovalID(r.rec.ID, key), State: gates.ApprovalPending, Execution: r.rec.ID, Step: pn.ID,
		Connection: pn.Connection, Op: kind, Args: r.e.redact(args).(map[string]any),
		RequestedBy: r.rec.Principal, CreatedAt: now, ExpiresAt: now.Add(r.e.approvalTTL),
	})
	if err != nil {
		return false, r.storage(ctx, err)
	}
	if ap.State == gates.ApprovalPending {
		r.update(key, func(st *StepRecord) { st.Status, st.ApprovalID = StepWaiting, ap.ID })
		if err := r.save(ctx); err != nil {
			return false, err
		}
		r.e.emit(ctx, r.rec.ID, EventApprovalRequest, map[string]any{"approval": ap.ID, "step": pn.ID, "connection": pn.Connection, "op": kind})
		if err := r.awaitDecision(ctx, key); err != nil {
			return false, err
		}
		if ap, err = r.e.approvals.Get(ctx, ap.ID); err != nil {
			return false, r.storage(ctx, err)
		}
	}
	approved := ap.State == gates.ApprovalApproved
	if _, err := r.done(ctx, key, pn, approved); err != nil {
		return false, err
	}
	return approved, nil
}

// agentLog passes the agent's stderr to the log, line by line, redacted.
type agentLog struct {
	r   *run
	n   *document.Node
	buf bytes.Buffer
	mu  sync.Mutex
}

func (l *agentLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		line, err := l.buf.ReadString('\n')
		if err != nil {
			l.buf.Reset()
			if l.buf.Len() < 64<<10 {
				l.buf.WriteString(line)
			}
			break
		}
		l.r.e.logger.Debug("agent stderr", "execution", l.r.rec.ID, "step", l.n.ID, "line", l.r.e.redactor.String(strings.TrimRight(line, "\n")))
	}
	return len(p), nil
}
