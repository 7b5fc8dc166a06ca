package mcpserver_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// The ACP SDK's example agent (dist/examples/agent.js of
// @agentclientprotocol/sdk, pinned): a real agent nobody here wrote, for
// the protocol paths codex does not take. Its turn reports a read tool
// call (pending, then completed), then asks permission for an edit
// ("allow" / "reject") and says which it got; it honours session/cancel.
const exampleAgentSDK = "@agentclientprotocol/sdk@1.9.0"

func exampleAgent(t *testing.T) harness.AgentEntry {
	t.Helper()
	dir := npmtest.Require(t, "acp-sdk", exampleAgentSDK)
	return harness.AgentEntry{
		Command: npmtest.Node(t), Args: []string{filepath.Join(dir, "dist", "examples", "agent.js")},
		Timeout: time.Minute,
	}
}

// postExecution submits doc as key over the API and returns the
// execution's id.
func postExecution(t *testing.T, b *bundle, key, doc string, input any) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"workflow": json.RawMessage(doc), "input": input})
	req, _ := http.NewRequest(http.MethodPost, b.url+"/v1/executions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	var out struct {
		ID     string `json:"id"`
		Detail string `json:"detail"`
		Errors any    `json:"errors"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != http.StatusAccepted && resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/executions = %d %s %v", resp.StatusCode, out.Detail, out.Errors)
	}
	return out.ID
}

// decideAs approves or denies an approval over the API as key.
func decideAs(t *testing.T, b *bundle, key, id, verb string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.url+"/v1/approvals/"+id+"/"+verb, strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/approvals/%s/%s as %s = %d", id, verb, key, resp.StatusCode)
	}
}

// pendingApproval waits for the execution's first pending approval.
func pendingApproval(t *testing.T, b *bundle, exec string) *gates.Approval {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		list, err := b.execs.Approvals().List(t.Context(), gates.ApprovalPending, 100)
		must(t, err)
		for _, ap := range list {
			if ap.Execution == exec {
				return ap
			}
		}
		if ex, err := b.execs.Get(t.Context(), exec); err == nil && ex.Status.Terminal() {
			t.Fatalf("execution %s ended %s (%+v) without asking for approval", exec, ex.Status, ex.Error)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ex, _ := b.execs.Get(t.Context(), exec)
	t.Fatalf("no approval was asked for by %s (status %v, error %+v)", exec, ex.Status, ex.Error)
	return nil
}

func finished(t *testing.T, b *bundle, exec string) *harness.Execution {
	t.Helper()
	ex, err := b.execs.Wait(t.Context(), exec, 60*time.Second)
	must(t, err)
	if !ex.Status.Terminal() {
		t.Fatalf("execution %s is still %s", exec, ex.Status)
	}
	return ex
}

func eventsOf(t *testing.T, b *bundle, exec string) []harness.Event {
	t.Helper()
	evs, err := b.execs.Events(t.Context(), exec, "", 0)
	must(t, err)
	return evs
}

const exampleDoc = `{"version":1,"root":{"kind":"acp-agent","id":"helper","agent":%q,"prompt":"Improve the config."}}`

func TestExampleAgentPermissionRequests(t *testing.T) {
	t.Parallel()
	example := exampleAgent(t)
	denier := example
	denier.Deny = []string{"edit"}
	b := setupWith(t, mcpserver.Options{}, harness.ExecutionsOptions{Agents: map[string]harness.AgentEntry{"example": example, "denier": denier}}, nil)

	for _, tc := range []struct {
		name, agent, decide, want, notWant string
		asks                               bool
	}{
		{"approved by another key", "example", "approve", "successfully updated the configuration", "prefer not", true},
		{"denied by another key", "example", "deny", "prefer not to make that change", "successfully", true},
		{"denied by the entry's permissions", "denier", "", "prefer not to make that change", "successfully", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id := postExecution(t, b, runnerKey, fmt.Sprintf(exampleDoc, tc.agent), nil)
			if tc.asks {
				ap := pendingApproval(t, b, id)
				if ap.Connection != "agent:example" || ap.Op != "edit" || ap.RequestedBy != "runner" ||
					ap.Args["title"] != "Modifying critical configuration file" {
					t.Fatalf("approval = %+v", ap)
				}
				if raw, _ := ap.Args["rawInput"].(map[string]any); raw["path"] != "/home/user/project/config.json" {
					t.Errorf("the approval does not show what the agent showed: %v", ap.Args)
				}
				req, _ := http.NewRequest(http.MethodPost, b.url+"/v1/approvals/"+ap.ID+"/approve", strings.NewReader(`{}`))
				req.Header.Set("Authorization", "Bearer "+runnerKey)
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				must(t, err)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					t.Fatal("the runner decided its own agent's permission request")
				}
				decideAs(t, b, approverKey, ap.ID, tc.decide)
			}
			ex := finished(t, b, id)
			out, _ := ex.Output.(string)
			if ex.Status != harness.ExecSucceeded || !strings.Contains(out, tc.want) || strings.Contains(out, tc.notWant) {
				t.Fatalf("execution %s %+v, output %q; want it to say %q", ex.Status, ex.Error, out, tc.want)
			}
			if !strings.HasPrefix(out, "I'll help you with that.") {
				t.Errorf("output %q is not the agent's whole message", out)
			}
			var permission *harness.StepRecord
			for i, st := range ex.Steps {
				if st.ID == "helper/permission:call_2" {
					permission = &ex.Steps[i]
				}
			}
			if tc.asks != (permission != nil) {
				t.Errorf("permission step recorded = %v, want %v (%+v)", permission != nil, tc.asks, ex.Steps)
			}
		})
	}
}

func TestExampleAgentUpdatesBecomeEvents(t *testing.T) {
	t.Parallel()
	denier := exampleAgent(t)
	denier.Deny = []string{"*"}
	b := setupWith(t, mcpserver.Options{}, harness.ExecutionsOptions{Agents: map[string]harness.AgentEntry{"denier": denier}}, nil)
	id := postExecution(t, b, runnerKey, fmt.Sprintf(exampleDoc, "denier"), nil)
	if ex := finished(t, b, id); ex.Status != harness.ExecSucceeded {
		t.Fatalf("execution %s %+v", ex.Status, ex.Error)
	}
	var text strings.Builder
	calls := map[string][]string{}
	for _, ev := range eventsOf(t, b, id) {
		switch ev.Type {
		case harness.EventAgentMessage:
			if ev.Data["id"] != "helper" || ev.Data["key"] != "helper" {
				t.Errorf("message event %v does not name its node", ev.Data)
			}
			text.WriteString(ev.Data["text"].(string))
		case harness.EventAgentToolCall:
			tc, _ := ev.Data["toolCallId"].(string)
			status, _ := ev.Data["status"].(string)
			calls[tc] = append(calls[tc], fmt.Sprint(ev.Data["kind"], "/", status))
		}
	}
	if !strings.HasPrefix(text.String(), "I'll help you with that.") || !strings.Contains(text.String(), "Now I understand") {
		t.Errorf("agent.message events say %q", text.String())
	}
	if got := strings.Join(calls["call_1"], ","); got != "read/pending,<nil>/completed" {
		t.Errorf("call_1 events = %s", got)
	}
	if got := strings.Join(calls["call_2"], ","); !strings.HasPrefix(got, "edit/pending") {
		t.Errorf("call_2 events = %s", got)
	}
}

func TestCancellingAnAgentEndsIt(t *testing.T) {
	t.Parallel()
	example := exampleAgent(t)
	mark := "agent-of-" + t.Name() // an argument the agent ignores, to find its process by
	example.Args = append(example.Args, mark)
	b := setupWith(t, mcpserver.Options{}, harness.ExecutionsOptions{Agents: map[string]harness.AgentEntry{"example": example}}, nil)
	id := postExecution(t, b, runnerKey, fmt.Sprintf(exampleDoc, "example"), nil)
	pendingApproval(t, b, id) // the agent is mid-turn, asking
	pids := agentPIDs(t, mark)
	if len(pids) == 0 {
		t.Fatal("no agent process found while the node runs")
	}
	_, err := b.execs.Cancel(t.Context(), id)
	must(t, err)
	ex := finished(t, b, id)
	if ex.Status != harness.ExecCancelled {
		t.Fatalf("execution %s %+v, want cancelled", ex.Status, ex.Error)
	}
	waitGone(t, pids)
}

// agentPIDs are the live processes whose command line holds arg.
func agentPIDs(t *testing.T, arg string) []int {
	t.Helper()
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(arg)) {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(d), "%d", &pid); err == nil && pid != os.Getpid() {
			pids = append(pids, pid)
		}
	}
	return pids
}

func waitGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("agent process %d is still running", pid)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// TestAnAgentPastItsTimeoutIsEnded: the entry's timeoutMs bounds the
// node run; the agent is cancelled and its process ended.
func TestAnAgentPastItsTimeoutIsEnded(t *testing.T) {
	t.Parallel()
	slow := exampleAgent(t)
	slow.Timeout = 1500 * time.Millisecond // the example's turn takes about five seconds
	mark := "agent-of-" + t.Name()
	slow.Args = append(slow.Args, mark)
	b := setupWith(t, mcpserver.Options{}, harness.ExecutionsOptions{Agents: map[string]harness.AgentEntry{"example": slow}}, nil)
	id := postExecution(t, b, runnerKey, fmt.Sprintf(exampleDoc, "example"), nil)
	ex := finished(t, b, id)
	if ex.Status != harness.ExecFailed || ex.Error == nil || ex.Error.Code != "timeout" {
		t.Fatalf("execution %s %+v, want failed with timeout", ex.Status, ex.Error)
	}
	waitGone(t, agentPIDs(t, mark))
}
