package modeltest_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/modeltest"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// TestCodexACPCallsMCPTool runs the real codex-acp against the fake
// model: the model calls the MCP tool the client gave in session/new,
// sees its output and answers with text.
func TestCodexACPCallsMCPTool(t *testing.T) {
	bin := npmtest.CodexACP(t)
	mcpURL, mcpCalls := startAddServer(t, "secret")

	const final = "The sum is 5."
	var sawOutput, callID string
	model := modeltest.NewResponses(t, func(req modeltest.ResponsesRequest) modeltest.Reply {
		if _, out, ok := req.LastToolOutput(); ok {
			sawOutput = modeltest.OutputText(out)
			return modeltest.Text(final)
		}
		if req.UserText() != "add 2 and 3" {
			t.Errorf("user text = %q", req.UserText())
			return modeltest.Text("unexpected request")
		}
		if _, ns, ok := req.Tool("add"); !ok || ns != modeltest.CodexNamespace("patchbay") {
			t.Errorf("tool add offered in namespace %q (found %v); tools: %v", ns, ok, req.ToolNames())
		}
		call := modeltest.CodexMCPCall("patchbay", "add", `{"a":2,"b":3}`)
		call.CallID = "call_add_1"
		callID = call.CallID
		return modeltest.Reply{ToolCalls: []modeltest.FunctionCall{call}}
	})

	start := time.Now()
	a := startCodex(t, bin, npmtest.CodexArgs(model.URL), npmtest.CodexEnv(t.TempDir()))
	init := a.initialize(t)
	t.Logf("codex-acp answered initialize after %v", time.Since(start))
	if caps, _ := init["agentCapabilities"].(map[string]any); caps["loadSession"] != true {
		t.Errorf("agentCapabilities = %v, want loadSession true", caps)
	}
	sessionID := a.newSession(t, t.TempDir(), mcpServer("patchbay", mcpURL, "Bearer secret"))
	res := a.prompt(t, sessionID, "add 2 and 3")

	if got := res["stopReason"]; got != "end_turn" {
		t.Errorf("stopReason = %v, want end_turn", got)
	}
	calls := mcpCalls()
	if len(calls) != 1 {
		t.Fatalf("MCP tools/call count = %d, want 1", len(calls))
	}
	if got := calls[0].Header.Get("Authorization"); got != "Bearer secret" {
		t.Errorf("MCP call Authorization = %q", got)
	}
	if sawOutput != "5" {
		t.Errorf("tool output the model saw = %q, want 5", sawOutput)
	}
	if got := a.agentText(sessionID); got != final {
		t.Errorf("agent_message_chunk text = %q, want %q", got, final)
	}
	if n := len(a.permissionRequests()); n != 0 {
		t.Errorf("asked for permission %d times under approval_policy never", n)
	}
	// The tool call as the client sees it: toolCallId is the model's
	// call_id; rawInput names server and tool.
	var started, completed map[string]any
	for _, u := range a.sessionUpdates(sessionID) {
		if u["toolCallId"] != callID {
			continue
		}
		switch u["sessionUpdate"] {
		case "tool_call":
			started = u
		case "tool_call_update":
			completed = u
		}
	}
	if started == nil || started["status"] != "in_progress" || started["title"] != "Tool: patchbay/add" {
		t.Errorf("tool_call update = %v", started)
	} else if raw, _ := started["rawInput"].(map[string]any); raw["server"] != "patchbay" || raw["tool"] != "add" {
		t.Errorf("tool_call rawInput = %v", raw)
	}
	if completed == nil || completed["status"] != "completed" {
		t.Errorf("tool_call_update = %v", completed)
	}
}

// TestCodexACPPermissionRejected: under approval_policy "on-request"
// codex asks before calling an MCP tool that is not read-only; a reject
// answer skips the call, the model is told, and the turn goes on.
func TestCodexACPPermissionRejected(t *testing.T) {
	bin := npmtest.CodexACP(t)
	mcpURL, mcpCalls := startAddServer(t, "secret")
	var sawOutput string
	model := modeltest.NewResponses(t, func(req modeltest.ResponsesRequest) modeltest.Reply {
		if _, out, ok := req.LastToolOutput(); ok {
			sawOutput = modeltest.OutputText(out)
			return modeltest.Text("I was not allowed to.")
		}
		call := modeltest.CodexMCPCall("patchbay", "add", `{"a":2,"b":3}`)
		call.CallID = "call_add_1"
		return modeltest.Reply{ToolCalls: []modeltest.FunctionCall{call}}
	})
	args := append(npmtest.CodexArgs(model.URL), "-c", `approval_policy="on-request"`)
	a := startCodex(t, bin, args, npmtest.CodexEnv(t.TempDir()))
	a.onPermission(rejectOption)
	a.initialize(t)
	sessionID := a.newSession(t, t.TempDir(), mcpServer("patchbay", mcpURL, "Bearer secret"))
	res := a.prompt(t, sessionID, "add 2 and 3")

	if got := res["stopReason"]; got != "end_turn" {
		t.Errorf("stopReason = %v, want end_turn", got)
	}
	asked := a.permissionRequests()
	if len(asked) != 1 {
		t.Fatalf("session/request_permission count = %d, want 1", len(asked))
	}
	tc, _ := asked[0]["toolCall"].(map[string]any)
	if tc["toolCallId"] != "call_add_1" {
		t.Errorf("permission toolCall = %v, want toolCallId call_add_1", tc)
	}
	kinds := map[string]string{}
	options, _ := asked[0]["options"].([]any)
	for _, o := range options {
		om, _ := o.(map[string]any)
		kinds[fmt.Sprint(om["optionId"])] = fmt.Sprint(om["kind"])
	}
	if kinds["approved"] != "allow_once" || kinds["cancel"] != "reject_once" {
		t.Errorf("permission options = %v", options)
	}
	if n := len(mcpCalls()); n != 0 {
		t.Errorf("MCP tools/call count = %d after a reject, want 0", n)
	}
	if sawOutput != "user cancelled MCP tool call" {
		t.Errorf("tool output the model saw = %q", sawOutput)
	}
}

// TestCodexACPLoadSessionAfterRestart: a session lives on in CODEX_HOME
// after its process is killed; another process loads it, replays it as
// session/update notifications, and its next turn carries the history.
func TestCodexACPLoadSessionAfterRestart(t *testing.T) {
	bin := npmtest.CodexACP(t)
	mcpURL, _ := startAddServer(t, "secret")
	model := modeltest.NewResponses(t, func(req modeltest.ResponsesRequest) modeltest.Reply {
		if req.UserText() == "and now?" {
			if req.ToolOutputs()["call_add_1"] == "" {
				t.Errorf("history of the loaded session lacks the first turn's tool output; input: %v", req.Input)
			}
			return modeltest.Text("Still 5.")
		}
		if _, _, ok := req.LastToolOutput(); ok {
			return modeltest.Text("The sum is 5.")
		}
		call := modeltest.CodexMCPCall("patchbay", "add", `{"a":2,"b":3}`)
		call.CallID = "call_add_1"
		return modeltest.Reply{ToolCalls: []modeltest.FunctionCall{call}}
	})
	home, cwd := t.TempDir(), t.TempDir()
	servers := []any{mcpServer("patchbay", mcpURL, "Bearer secret")}

	first := startCodex(t, bin, npmtest.CodexArgs(model.URL), npmtest.CodexEnv(home))
	first.initialize(t)
	sessionID := first.newSession(t, cwd, mcpServer("patchbay", mcpURL, "Bearer secret"))
	first.prompt(t, sessionID, "add 2 and 3")
	first.kill(syscall.SIGKILL)

	second := startCodex(t, bin, npmtest.CodexArgs(model.URL), npmtest.CodexEnv(home))
	second.initialize(t)
	second.mustCall(t, "session/load", map[string]any{"sessionId": sessionID, "cwd": cwd, "mcpServers": servers})
	var replayed []string
	for _, u := range second.sessionUpdates(sessionID) {
		replayed = append(replayed, fmt.Sprint(u["sessionUpdate"]))
	}
	if !containsAll(replayed, "user_message_chunk", "tool_call", "tool_call_update", "agent_message_chunk") {
		t.Errorf("replayed updates = %v", replayed)
	}
	if got := second.agentText(sessionID); got != "The sum is 5." {
		t.Errorf("replayed agent text = %q", got)
	}
	res := second.prompt(t, sessionID, "and now?")
	if res["stopReason"] != "end_turn" {
		t.Errorf("stopReason = %v", res["stopReason"])
	}
	if got := second.agentText(sessionID); got != "The sum is 5.Still 5." {
		t.Errorf("agent text after the second turn = %q", got)
	}
}

// TestCodexACPToolTimeout: a server configured with npmtest.CodexMCPServer
// gets its own tool-call timeout; when it runs out, codex fails the call
// (without cancelling it on the server), tells the model, and the turn
// goes on.
func TestCodexACPToolTimeout(t *testing.T) {
	bin := npmtest.CodexACP(t)
	release := make(chan struct{})
	s := server.NewMCPServer("slow", "1.0.0", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("wait", mcp.WithReadOnlyHintAnnotation(true)), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return mcp.NewToolResultText("done waiting"), nil
	})
	srv := httptest.NewServer(server.NewStreamableHTTPServer(s))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // runs before srv.Close
	var sawOutput string
	model := modeltest.NewResponses(t, func(req modeltest.ResponsesRequest) modeltest.Reply {
		if _, out, ok := req.LastToolOutput(); ok {
			sawOutput = modeltest.OutputText(out)
			return modeltest.Text("It timed out.")
		}
		return modeltest.Reply{ToolCalls: []modeltest.FunctionCall{modeltest.CodexMCPCall("slow", "wait", "{}")}}
	})
	args := append(npmtest.CodexArgs(model.URL), npmtest.CodexMCPServer("slow", srv.URL+"/mcp", map[string]string{"Authorization": "Bearer x"}, time.Second)...)
	a := startCodex(t, bin, args, npmtest.CodexEnv(t.TempDir()))
	a.initialize(t)
	sessionID := a.newSession(t, t.TempDir())
	start := time.Now()
	res := a.prompt(t, sessionID, "wait")
	if res["stopReason"] != "end_turn" {
		t.Errorf("stopReason = %v", res["stopReason"])
	}
	if !strings.Contains(sawOutput, "timed out awaiting tools/call after 1s") {
		t.Errorf("tool output the model saw = %q", sawOutput)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("turn took %v", d)
	}
	var failed bool
	for _, u := range a.sessionUpdates(sessionID) {
		failed = failed || u["sessionUpdate"] == "tool_call_update" && u["status"] == "failed"
	}
	if !failed {
		t.Errorf("no failed tool_call_update in %v", a.updateKinds(sessionID))
	}
}

func containsAll(have []string, want ...string) bool {
	set := map[string]bool{}
	for _, h := range have {
		set[h] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}

// mcpCall is one tools/call the MCP server received: its HTTP header and
// the JSON-RPC request as sent.
type mcpCall struct {
	Header http.Header
	Body   map[string]any
}

// startAddServer serves an MCP server over Streamable HTTP with one tool,
// add {a, b} → a+b, refusing requests without "Authorization: Bearer
// token". It returns the URL and the tools/call requests received.
func startAddServer(t testing.TB, token string, opts ...mcp.ToolOption) (string, func() []mcpCall) {
	t.Helper()
	s := server.NewMCPServer("adder", "1.0.0", server.WithToolCapabilities(false))
	opts = append([]mcp.ToolOption{
		mcp.WithDescription("Adds two numbers."),
		mcp.WithNumber("a", mcp.Required()),
		mcp.WithNumber("b", mcp.Required()),
	}, opts...)
	s.AddTool(mcp.NewTool("add", opts...), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		a, err := req.RequireFloat("a")
		if err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		b, err := req.RequireFloat("b")
		if err != nil {
			return mcp.NewToolResultError(err.Error()), nil
		}
		return mcp.NewToolResultText(fmt.Sprint(a + b)), nil
	})
	h := server.NewStreamableHTTPServer(s)
	var mu sync.Mutex
	var calls []mcpCall
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg map[string]any
			if json.Unmarshal(body, &msg) == nil && msg["method"] == "tools/call" {
				mu.Lock()
				calls = append(calls, mcpCall{Header: r.Header.Clone(), Body: msg})
				mu.Unlock()
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp", func() []mcpCall {
		mu.Lock()
		defer mu.Unlock()
		return append([]mcpCall(nil), calls...)
	}
}

// mcpServer is an ACP McpServer entry of type http with one header.
func mcpServer(name, url, authorization string) map[string]any {
	return map[string]any{
		"type": "http", "name": name, "url": url,
		"headers": []any{map[string]any{"name": "Authorization", "value": authorization}},
	}
}

// acpAgent is codex-acp spoken to over newline-delimited JSON-RPC 2.0 on
// its stdin and stdout.
type acpAgent struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *lockedBuffer
	done   chan struct{} // closed when stdout ends
	exited chan struct{} // closed when the process has exited

	mu      sync.Mutex
	nextID  int
	pending map[string]chan map[string]any
	updates []map[string]any // session/update params, in order
	// permission answers session/request_permission; the default picks
	// the first allow option.
	permission func(params map[string]any) map[string]any
	asked      []map[string]any // session/request_permission params
	// callTimeout bounds the wait for a response (a minute when 0).
	callTimeout time.Duration
	// wire, when set, is called with every line read or written.
	wire func(dir, line string)
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startCodex starts bin in its own process group; at cleanup it is sent
// SIGTERM, then SIGKILL after two seconds, group and all, and its stderr
// is logged when the test failed.
func startCodex(t testing.TB, bin string, args, env []string) *acpAgent {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Dir = t.TempDir()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	a := &acpAgent{cmd: cmd, stderr: &lockedBuffer{}, done: make(chan struct{}), pending: map[string]chan map[string]any{}}
	cmd.Stderr = a.stderr
	if os.Getenv("CODEX_WIRE") != "" { // log the ACP wire
		a.wire = func(dir, line string) { t.Logf("%s %s", dir, line) }
	}
	var err error
	if a.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	a.exited = make(chan struct{})
	go func() {
		a.read(t, stdout)
		close(a.done)
	}()
	go func() {
		cmd.Wait()
		close(a.exited)
	}()
	t.Cleanup(func() {
		a.kill(syscall.SIGTERM)
		if t.Failed() {
			t.Logf("codex-acp stderr:\n%s", a.stderr.String())
		}
	})
	return a
}

// kill sends sig to the agent's process group, then SIGKILL after two
// seconds if the agent is still there (codex-acp exits on SIGTERM at
// once; it does not exit when its stdin closes), SIGKILL to the rest of
// the group in any case, and waits for the agent to exit.
func (a *acpAgent) kill(sig syscall.Signal) {
	pgid := a.cmd.Process.Pid
	syscall.Kill(-pgid, sig)
	select {
	case <-a.exited:
	case <-time.After(2 * time.Second):
	}
	syscall.Kill(-pgid, syscall.SIGKILL)
	<-a.exited
}

func (a *acpAgent) read(t testing.TB, stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if a.wire != nil {
			a.wire("<-", sc.Text())
		}
		var msg map[string]any
		if err := json.Unmarshal(sc.Bytes(), &msg); err != nil {
			t.Errorf("codex-acp wrote a line that is not JSON: %q", sc.Text())
			continue
		}
		method, _ := msg["method"].(string)
		id, hasID := msg["id"]
		switch {
		case method != "" && hasID: // a request to the client
			a.answer(id, method, msg["params"])
		case method != "": // a notification
			if method == "session/update" {
				p, _ := msg["params"].(map[string]any)
				a.mu.Lock()
				a.updates = append(a.updates, p)
				a.mu.Unlock()
			}
		case hasID: // a response
			key := fmt.Sprint(id)
			a.mu.Lock()
			ch := a.pending[key]
			delete(a.pending, key)
			a.mu.Unlock()
			if ch != nil {
				ch <- msg
			}
		}
	}
}

// answer replies to a request from the agent: a permission request with
// the permission func's outcome, anything else with method not found.
func (a *acpAgent) answer(id any, method string, params any) {
	p, _ := params.(map[string]any)
	var reply map[string]any
	switch method {
	case "session/request_permission":
		a.mu.Lock()
		a.asked = append(a.asked, p)
		choose := a.permission
		a.mu.Unlock()
		if choose == nil {
			choose = allowOption
		}
		reply = map[string]any{"jsonrpc": "2.0", "id": id, "result": choose(p)}
	default:
		reply = map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": -32601, "message": "method not found: " + method}}
	}
	a.write(reply)
}

// onPermission sets how session/request_permission is answered.
func (a *acpAgent) onPermission(choose func(params map[string]any) map[string]any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.permission = choose
}

// permissionRequests returns the params of every
// session/request_permission so far.
func (a *acpAgent) permissionRequests() []map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]map[string]any(nil), a.asked...)
}

// allowOption selects the first option whose kind starts with allow_.
func allowOption(params map[string]any) map[string]any {
	return selectOption(params, "allow_")
}

// rejectOption selects the first option whose kind starts with reject_.
func rejectOption(params map[string]any) map[string]any {
	return selectOption(params, "reject_")
}

func selectOption(params map[string]any, prefix string) map[string]any {
	options, _ := params["options"].([]any)
	for _, o := range options {
		om, _ := o.(map[string]any)
		if kind, _ := om["kind"].(string); strings.HasPrefix(kind, prefix) {
			return map[string]any{"outcome": map[string]any{"outcome": "selected", "optionId": om["optionId"]}}
		}
	}
	return map[string]any{"outcome": map[string]any{"outcome": "cancelled"}}
}

func (a *acpAgent) write(msg map[string]any) {
	b, _ := json.Marshal(msg)
	if a.wire != nil {
		a.wire("->", string(b))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stdin.Write(append(b, '\n'))
}

// call sends a request and waits for its response (callTimeout, a
// minute by default).
func (a *acpAgent) call(t testing.TB, method string, params any) (result map[string]any, rpcErr map[string]any) {
	t.Helper()
	a.mu.Lock()
	a.nextID++
	id := a.nextID
	ch := make(chan map[string]any, 1)
	a.pending[fmt.Sprint(id)] = ch
	a.mu.Unlock()
	a.write(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	timeout := a.callTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	select {
	case msg := <-ch:
		result, _ = msg["result"].(map[string]any)
		rpcErr, _ = msg["error"].(map[string]any)
		return result, rpcErr
	case <-a.done:
		t.Fatalf("%s: codex-acp closed stdout; stderr:\n%s", method, a.stderr.String())
	case <-time.After(timeout):
		t.Fatalf("%s: no response in %v; stderr:\n%s", method, timeout, a.stderr.String())
	}
	return nil, nil
}

// mustCall is call that fails the test on an error response.
func (a *acpAgent) mustCall(t testing.TB, method string, params any) map[string]any {
	t.Helper()
	result, rpcErr := a.call(t, method, params)
	if rpcErr != nil {
		t.Fatalf("%s: error %v", method, rpcErr)
	}
	return result
}

func (a *acpAgent) initialize(t testing.TB) map[string]any {
	t.Helper()
	return a.mustCall(t, "initialize", map[string]any{
		"protocolVersion": 1,
		"clientCapabilities": map[string]any{
			"fs":       map[string]any{"readTextFile": false, "writeTextFile": false},
			"terminal": false,
		},
	})
}

func (a *acpAgent) newSession(t testing.TB, cwd string, servers ...map[string]any) string {
	t.Helper()
	if servers == nil {
		servers = []map[string]any{}
	}
	res := a.mustCall(t, "session/new", map[string]any{"cwd": cwd, "mcpServers": servers})
	id, _ := res["sessionId"].(string)
	if id == "" {
		t.Fatalf("session/new: no sessionId in %v", res)
	}
	return id
}

func (a *acpAgent) prompt(t testing.TB, sessionID, text string) map[string]any {
	t.Helper()
	return a.mustCall(t, "session/prompt", map[string]any{
		"sessionId": sessionID,
		"prompt":    []any{map[string]any{"type": "text", "text": text}},
	})
}

// sessionUpdates returns the update objects of one session, in order.
func (a *acpAgent) sessionUpdates(sessionID string) []map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []map[string]any
	for _, p := range a.updates {
		if p["sessionId"] != sessionID {
			continue
		}
		if u, ok := p["update"].(map[string]any); ok {
			out = append(out, u)
		}
	}
	return out
}

func (a *acpAgent) updateKinds(sessionID string) []string {
	var kinds []string
	for _, u := range a.sessionUpdates(sessionID) {
		kinds = append(kinds, fmt.Sprint(u["sessionUpdate"]))
	}
	return kinds
}

// agentText joins the text of the session's agent_message_chunk updates.
func (a *acpAgent) agentText(sessionID string) string {
	var b strings.Builder
	for _, u := range a.sessionUpdates(sessionID) {
		if u["sessionUpdate"] != "agent_message_chunk" {
			continue
		}
		c, _ := u["content"].(map[string]any)
		s, _ := c["text"].(string)
		b.WriteString(s)
	}
	return b.String()
}
