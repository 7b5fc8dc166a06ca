package mcpserver_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
	"github.com/patchbay-dev/patchbay/internal/modeltest"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// codexAgent is the real Codex agent (codex-acp, pinned, its prebuilt
// binary) pointed at model, a fake Responses server on loopback, with a
// home of its own.
func codexAgent(t *testing.T, model *modeltest.Responses, home string) harness.AgentEntry {
	t.Helper()
	env := map[string]string{}
	for _, kv := range npmtest.CodexEnv(home) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return harness.AgentEntry{Command: npmtest.CodexACP(t), Args: npmtest.CodexArgs(model.URL), Env: env, Timeout: 2 * time.Minute}
}

// credentials records the bearer credentials agents present at /mcp.
type credentials struct {
	mu   sync.Mutex
	seen []string
}

func (c *credentials) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/mcp" {
			if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "+harness.BridgeCredentialPrefix); ok {
				c.mu.Lock()
				if !slices.Contains(c.seen, harness.BridgeCredentialPrefix+tok) {
					c.seen = append(c.seen, harness.BridgeCredentialPrefix+tok)
				}
				c.mu.Unlock()
			}
		}
		next.ServeHTTP(w, r)
	})
}

func (c *credentials) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.seen)
}

const codexDoc = `{"version":1,"connections":{"mem":{}},"root":{"kind":"acp-agent","id":"coder","agent":"codex",
	"prompt":"add 2 and 3, then run the guarded step","tools":[{"connection":"mem","ops":["add","guarded"]}]}}`

func TestCodexCallsToolsThroughTheBridge(t *testing.T) {
	t.Parallel()
	// Codex offers an MCP server's tools inside a namespace named for
	// the server; the model calls them by their own names in it.
	const add, guarded = "mem_add", "mem_guarded"
	var offered []string
	model := modeltest.NewResponses(t, func(req modeltest.ResponsesRequest) modeltest.Reply {
		outs := req.ToolOutputs()
		switch len(outs) {
		case 0:
			offered = req.ToolNames()
			_, ns, _ := req.Tool(add)
			return modeltest.Reply{ToolCalls: []modeltest.FunctionCall{{Name: add, Namespace: ns, Arguments: `{"a":2,"b":3}`}}}
		case 1:
			_, ns, _ := req.Tool(guarded)
			return modeltest.Reply{ToolCalls: []modeltest.FunctionCall{{Name: guarded, Namespace: ns, Arguments: `{}`}}}
		}
		var all string
		for _, o := range outs {
			all += o
		}
		if !strings.Contains(all, `{\"sum\":5}`) || !strings.Contains(all, "done after approval") {
			return modeltest.Text("The tools did not answer as expected: " + all)
		}
		return modeltest.Text("The sum is 5, and the guarded step ran.")
	})
	var creds credentials
	b := setupWith(t, mcpserver.Options{}, harness.ExecutionsOptions{
		Agents: map[string]harness.AgentEntry{"codex": codexAgent(t, model, t.TempDir())},
	}, creds.wrap)

	id := postExecution(t, b, runnerKey, codexDoc, nil)
	ap := pendingApproval(t, b, id)
	if ap.Connection != "mem" || ap.Op != "guarded" || ap.RequestedBy != "runner" {
		t.Fatalf("approval = %+v, want mem.guarded asked for by runner", ap)
	}

	// While the node runs: its credential lists exactly the picks, and a
	// tool the picks do not grant is refused without reaching the server.
	cs := creds.list()
	if len(cs) != 1 {
		t.Fatalf("credentials seen at /mcp: %d, want 1", len(cs))
	}
	agent := dial(t, b, cs[0], "2025-11-25", nil)
	if got := strings.Join(toolNames(t, agent), ","); got != "mem_add,mem_guarded" {
		t.Errorf("the node's credential is offered %s, want mem_add,mem_guarded", got)
	}
	before := len(b.mem.Calls())
	res, err := agent.CallTool(t.Context(), &sdk.CallToolParams{Name: "mem_leak", Arguments: map[string]any{}})
	if err == nil && !res.IsError {
		t.Errorf("a tool the picks do not grant answered %s", text(res))
	}
	if len(b.mem.Calls()) != before {
		t.Error("a tool the picks do not grant reached the server")
	}

	decideAs(t, b, approverKey, ap.ID, "approve")
	ex := finished(t, b, id)
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("execution %s %+v", ex.Status, ex.Error)
	}
	want := "The sum is 5, and the guarded step ran."
	if ex.Output != want {
		t.Errorf("output = %v, want %q (the agent's final message)", ex.Output, want)
	}
	if !slices.Contains(offered, "mcp__patchbay."+add) || !slices.Contains(offered, "mcp__patchbay."+guarded) || slices.Contains(offered, "mcp__patchbay.mem_wipe") {
		t.Errorf("the model was offered %v", offered)
	}
	var ops []string
	for _, st := range ex.Steps {
		if !strings.HasPrefix(st.ID, "tool:coder.") {
			continue
		}
		ops = append(ops, st.Op)
		if st.Connection != "mem" || st.Status != harness.StepDone || st.IdempotencyKey != id+":"+st.ID {
			t.Errorf("bridged call step %+v", st)
		}
	}
	if strings.Join(ops, ",") != "add,guarded" {
		t.Errorf("bridged call steps = %v, want add,guarded", ops)
	}
	var sent []string
	for _, c := range b.mem.Calls() {
		sent = append(sent, c.Op)
	}
	if n := strings.Count(strings.Join(sent, ","), "add"); n != 1 {
		t.Errorf("add reached the server %d times, want 1 (%v)", n, sent)
	}

	// The node has ended: its credential is refused.
	req, _ := http.NewRequest(http.MethodPost, b.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Authorization", "Bearer "+cs[0])
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the ended node's credential got %d, want 401", resp.StatusCode)
	}
}

// TestCodexAsksBeforeAShellCommand: Codex under approval_policy
// "untrusted" asks before running a command it does not know to be safe;
// the request is an approval another key decides, and the command runs
// once approved. An entry whose permissions allow the kind is not asked.
func TestCodexAsksBeforeAShellCommand(t *testing.T) {
	t.Parallel()
	script := func(req modeltest.ResponsesRequest) modeltest.Reply {
		if _, out, ok := req.LastToolOutput(); ok {
			return modeltest.Text("ran: " + strings.TrimSpace(modeltest.OutputText(out)))
		}
		return modeltest.Reply{ToolCalls: []modeltest.FunctionCall{{Name: "exec_command", Arguments: `{"cmd":"touch made-by-agent && ls"}`}}}
	}
	asking := codexAgent(t, modeltest.NewResponses(t, script), t.TempDir())
	asking.Args = append(asking.Args, "-c", `approval_policy="untrusted"`)
	trusting := codexAgent(t, modeltest.NewResponses(t, script), t.TempDir())
	trusting.Args = append(trusting.Args, "-c", `approval_policy="untrusted"`)
	trusting.Allow = []string{"execute"}
	b := setupWith(t, mcpserver.Options{}, harness.ExecutionsOptions{
		Agents: map[string]harness.AgentEntry{"codex": asking, "example": trusting},
	}, nil)
	const doc = `{"version":1,"root":{"kind":"acp-agent","id":"shell","agent":%q,"prompt":"say hello in a file"}}`

	id := postExecution(t, b, runnerKey, fmt.Sprintf(doc, "codex"), nil)
	ap := pendingApproval(t, b, id)
	if ap.Connection != "agent:codex" || ap.Op != "execute" || !strings.Contains(fmt.Sprint(ap.Args["title"], ap.Args["rawInput"]), "touch made-by-agent") {
		t.Fatalf("approval = %+v, want the command codex showed", ap)
	}
	decideAs(t, b, approverKey, ap.ID, "approve")
	ex := finished(t, b, id)
	if ex.Status != harness.ExecSucceeded || !strings.Contains(fmt.Sprint(ex.Output), "made-by-agent") {
		t.Fatalf("execution %s %+v, output %v", ex.Status, ex.Error, ex.Output)
	}

	id = postExecution(t, b, runnerKey, fmt.Sprintf(doc, "example"), nil)
	ex = finished(t, b, id)
	if ex.Status != harness.ExecSucceeded || !strings.Contains(fmt.Sprint(ex.Output), "made-by-agent") {
		t.Fatalf("with execute allowed: execution %s %+v, output %v", ex.Status, ex.Error, ex.Output)
	}
	list, err := b.execs.Approvals().List(t.Context(), "", 100)
	must(t, err)
	for _, a := range list {
		if a.Execution == id {
			t.Errorf("an allowed kind was asked for: %+v", a)
		}
	}
}
