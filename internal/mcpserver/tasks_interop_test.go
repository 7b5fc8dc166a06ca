package mcpserver_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// tsExtTasks is the Tasks extension's TypeScript package, whose client
// drives 2026-07-28 tasks over the client v2 (tsClient), installed with it.
const tsExtTasks = "@modelcontextprotocol/ext-tasks@0.2.2"

// taskAnswer is what tsclient.mjs answers a task command.
type taskAnswer struct {
	Kind     string         `json:"kind"`
	TaskID   string         `json:"taskId"`
	Task     map[string]any `json:"task"`
	Outcome  *taskOutcome   `json:"outcome"`
	Statuses []string       `json:"statuses"`
	Tasks    []struct {
		TaskID string `json:"taskId"`
	} `json:"tasks"`
}

type taskOutcome struct {
	Status string         `json:"status"`
	Result map[string]any `json:"result"`
	Error  string         `json:"error"`
}

func (p *tsProc) task(t *testing.T, cmd map[string]any) taskAnswer {
	t.Helper()
	a := p.do(t, cmd)
	var ta taskAnswer
	if err := json.Unmarshal([]byte(a.raw), &ta); err != nil {
		t.Fatalf("%v answered %s: %v", cmd, a.raw, err)
	}
	return ta
}

// TestInteropTypeScriptTasks has each era's official task client drive
// /mcp's tasks as alice: a guarded call run as a task, polled while it
// waits, approved by another key, its result fetched by the client's own
// driver; another caller unable to read or cancel it; a task cancelled
// (its execution ends cancelled); a quick call.
func TestInteropTypeScriptTasks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, flavor, mode string
		dir                func(t *testing.T) string
		modern             bool
	}{
		{"sdk v1 experimental tasks 2025-11-25", "sdk", "legacy", func(t *testing.T) string { return npmtest.Require(t, "sdk", tsSDK) }, false},
		{"ext-tasks with client v2 2026-07-28", "client", "pin", func(t *testing.T) string {
			return npmtest.RequireAll(t, "ext-tasks", tsClient, tsExtTasks)[0]
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, mcpserver.Options{})
			ts := startTSClient(t, tt.flavor, tt.dir(t))
			for as, key := range map[string]string{"alice": aliceKey, "carol": carolKey} {
				ts.do(t, map[string]any{"op": "connect", "as": as, "url": b.url + "/mcp", "key": key, "mode": tt.mode})
			}

			// A guarded call, as a task: its task is its execution.
			call := ts.task(t, map[string]any{"op": "taskCall", "as": "alice", "tool": "mem_guarded", "args": map[string]any{}})
			id := call.TaskID
			if call.Kind != "task" || id == "" {
				t.Fatalf("taskCall mem_guarded = %+v, want a task", call)
			}
			if ex, err := b.execs.Get(t.Context(), id); err != nil || ex.Principal != "alice" {
				t.Fatalf("task %s as an execution: %+v, %v; want alice's", id, ex, err)
			}
			// Polled while it waits for approval.
			var waiting map[string]any
			for deadline := time.Now().Add(15 * time.Second); ; {
				waiting = ts.task(t, map[string]any{"op": "taskGet", "as": "alice", "taskId": id}).Task
				if strings.Contains(str(waiting, "statusMessage"), "approval") || time.Now().After(deadline) {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if str(waiting, "status") != "working" || !strings.Contains(str(waiting, "statusMessage"), "approval") {
				t.Fatalf("the waiting task = %v, want working, naming its approval", waiting)
			}
			// Another caller cannot read or cancel it.
			for _, op := range []string{"taskGet", "taskCancel"} {
				if a := ts.send(t, map[string]any{"op": op, "as": "carol", "taskId": id}); a.OK {
					t.Errorf("carol's %s of alice's task: %s, want an error", op, a.raw)
				}
			}
			if !tt.modern {
				if strings.Contains(ts.do(t, map[string]any{"op": "taskList", "as": "carol"}).raw, id) {
					t.Error("carol's tasks/list names alice's task")
				}
				if !strings.Contains(ts.do(t, map[string]any{"op": "taskList", "as": "alice"}).raw, id) {
					t.Error("alice's tasks/list lacks her task")
				}
			}
			// Approved by another key; the client's own driver polls to
			// the end and fetches the result.
			approved := approveWhenWaiting(t, b)
			settled := ts.task(t, map[string]any{"op": "taskSettle", "as": "alice", "taskId": id})
			ap := <-approved
			if o := settled.Outcome; o == nil || o.Status != "completed" || resultText(o.Result) != "done after approval" {
				t.Errorf("the settled task = %+v, want the approved call's result", settled)
			}
			if ap == "" || !strings.Contains(str(waiting, "statusMessage"), ap) {
				t.Errorf("approval %q, the waiting task said %q", ap, str(waiting, "statusMessage"))
			}
			t.Logf("%s: statuses seen while settling: %v", tt.flavor, settled.Statuses)
			if o := ts.task(t, map[string]any{"op": "taskResult", "as": "alice", "taskId": id}).Outcome; o == nil || resultText(o.Result) != "done after approval" {
				t.Errorf("the task's result, fetched again = %+v", o)
			}

			// A task cancelled: the execution ends cancelled.
			call = ts.task(t, map[string]any{"op": "taskCall", "as": "alice", "tool": "mem_guarded", "args": map[string]any{}})
			if call.Kind != "task" {
				t.Fatalf("taskCall = %+v, want a task", call)
			}
			waitPending(t, b)
			cancel := ts.task(t, map[string]any{"op": "taskCancel", "as": "alice", "taskId": call.TaskID})
			if !tt.modern && str(cancel.Task, "status") != "cancelled" {
				t.Errorf("tasks/cancel answered %v, want the task, cancelled", cancel.Task)
			}
			if got := execStatus(t, b, call.TaskID); got != harness.ExecCancelled {
				t.Errorf("the cancelled task's execution is %s", got)
			}
			if o := ts.task(t, map[string]any{"op": "taskSettle", "as": "alice", "taskId": call.TaskID}).Outcome; o == nil || o.Status == "completed" {
				t.Errorf("the cancelled task settled as %+v", o)
			}
			if got := str(ts.task(t, map[string]any{"op": "taskGet", "as": "alice", "taskId": call.TaskID}).Task, "status"); got != "cancelled" {
				t.Errorf("the cancelled task reads %s", got)
			}

			// A quick call: the 2026 era answers it at once; the 2025 era
			// owes the client the task it asked for.
			quick := ts.task(t, map[string]any{"op": "taskCall", "as": "alice", "tool": "mem_add", "args": map[string]any{"a": 2, "b": 3}})
			if quick.Kind == "task" {
				quick = ts.task(t, map[string]any{"op": "taskSettle", "as": "alice", "taskId": quick.TaskID})
			}
			if want := map[bool]string{true: "immediate", false: ""}[tt.modern]; quick.Kind != want {
				t.Errorf("the quick call came as %q, want %q", quick.Kind, want)
			}
			if o := quick.Outcome; o == nil || o.Status != "completed" || !strings.Contains(resultText(o.Result), `"sum":5`) {
				t.Errorf("the quick call = %+v, want sum 5", quick)
			}
			for _, as := range []string{"alice", "carol"} {
				ts.do(t, map[string]any{"op": "close", "as": as})
			}
		})
	}
}
