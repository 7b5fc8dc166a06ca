package main

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// jobsServer serves the demo with slow_job as a task of the MCP Tasks
// extension (what cmd/demo-mcp -http does) and returns its task store and
// a config naming it "demo".
func jobsServer(t *testing.T) (*demo.Jobs, string) {
	t.Helper()
	s := demo.NewServer()
	jobs := demo.NewJobs()
	s.AddTools(jobs.Tool())
	ts := httptest.NewServer(jobs.Handler(server.NewStreamableHTTPServer(s)))
	t.Cleanup(ts.Close)
	return jobs, fmt.Sprintf(`
connections:
  demo: { mcp: { type: http, url: %q } }
allowlists:
  default: { connections: { demo: { ops: ["*"] } } }
`, ts.URL+"/mcp")
}

// slowJob is a one-step workflow running slow_job with args.
func slowJob(args string) []byte {
	return []byte(`{"workflow":{"version":1,"connections":{"demo":{}},"root":{"kind":"call","id":"job","connection":"demo","op":"slow_job","args":` + args + `}}}`)
}

// waitTask waits until the execution's step "job" records its task id.
func waitTask(t *testing.T, addr, key, id string) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if status, ex := get2(addr, key, "/v1/executions/"+id); status == 200 {
			steps, _ := ex["steps"].([]any)
			for _, s := range steps {
				if st, _ := s.(map[string]any); st["id"] == "job" && st["task"] != nil {
					return st["task"].(string)
				}
			}
		}
	}
	t.Fatalf("execution %s never recorded a task", id)
	return ""
}

// eventsOf reads a finished execution's event stream to its end and
// returns the data of its events of type typ.
func eventsOf(t *testing.T, base, key, id, typ string) []string {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/v1/executions/"+id+"/events?after=0", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	current := ""
	for sc.Scan() {
		line := sc.Text()
		if ev, ok := strings.CutPrefix(line, "event: "); ok {
			current = ev
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok && current == typ {
			out = append(out, data)
		}
	}
	return out
}

// TestTaskSurvivesKillNine: a call the server runs as a task survives a
// SIGKILL of the runner mid-task. The task id is in the step's pending
// ledger entry before the runner waits on it, so the restarted runner
// waits on the same task and the server sees one tools/call only.
func TestTaskSurvivesKillNine(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") that outlives the process")
	}
	st := storetest.New(t)
	jobs, cfgBody := jobsServer(t)
	srv := oneReplica(t, st, writeConfig(t, cfgBody))
	addr := srv.addr

	status, ex := post2(addr, "k1", slowJob(`{"seconds":4}`))
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ex)
	}
	id := ex["id"].(string)
	task := waitTask(t, addr, "k1", id)
	srv.kill()
	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	ex = waitDone(t, "http://"+addr, id)
	out, _ := ex["output"].(map[string]any)
	if ex["status"] != "succeeded" || out["task"] != task || out["idempotencyKey"] != id+":job" {
		t.Fatalf("execution = %v, want slow_job's result from task %s", ex, task)
	}
	if st := jobs.Stats(); st.Calls != 1 || len(st.Cancelled) != 0 {
		t.Fatalf("server saw %+v: want exactly one tools/call and no cancel", st)
	}
}

// TestTaskOutcomes runs slow_job as a task through a whole execution: it
// completes via polling with step.task events; cancelling the execution
// sends tasks/cancel for its task; a task that asks for input has its
// question answered by a person (or declined, and the step fails).
func TestTaskOutcomes(t *testing.T) {
	t.Parallel()
	jobs, cfgBody := jobsServer(t)
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": writeConfig(t, cfgBody), "PATCHBAY_API_KEYS": "k1,k2@approve",
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	})
	addr := strings.TrimPrefix(srv.url, "http://")
	submit := func(t *testing.T, args string) string {
		t.Helper()
		status, ex := post2(addr, "k1", slowJob(args))
		if status != http.StatusAccepted {
			t.Fatalf("POST = %d %v", status, ex)
		}
		return ex["id"].(string)
	}

	t.Run("completes", func(t *testing.T) {
		id := submit(t, `{"seconds":1}`)
		ex := waitDone(t, srv.url, id)
		out, _ := ex["output"].(map[string]any)
		if ex["status"] != "succeeded" || out["task"] == nil || out["done"] != true {
			t.Fatalf("execution = %v", ex)
		}
		events := eventsOf(t, srv.url, "k1", id, "step.task")
		joined := strings.Join(events, "\n")
		if len(events) < 2 || !strings.Contains(events[0], `"status":"working"`) || !strings.Contains(joined, `"status":"completed"`) ||
			!strings.Contains(joined, out["task"].(string)) {
			t.Fatalf("step.task events:\n%s", joined)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		id := submit(t, `{"seconds":60}`)
		task := waitTask(t, addr, "k1", id)
		req, _ := http.NewRequest("POST", srv.url+"/v1/executions/"+id+"/cancel", nil)
		req.Header.Set("Authorization", "Bearer k1")
		status, body := do2(req)
		if status != 200 && status != 202 {
			t.Fatalf("cancel = %d %v", status, body)
		}
		for deadline := time.Now().Add(20 * time.Second); !slices.Contains(jobs.Stats().Cancelled, task); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("tasks/cancel never reached the server for %s (saw %+v)", task, jobs.Stats())
			}
		}
		if ex := waitDone(t, srv.url, id); ex["status"] != "cancelled" {
			t.Fatalf("execution = %v", ex)
		}
	})

	t.Run("input required", func(t *testing.T) {
		// The task's question goes to a person; the answer goes back
		// with tasks/update and the task goes on to its result.
		id := submit(t, `{"seconds":0.5,"input":true}`)
		_, qid := waitQuestion(t, addr, id)
		if status, p := decideQuestion(t, addr, "k2", qid, "answer", map[string]any{"content": map[string]any{"ok": true}}); status != http.StatusOK {
			t.Fatalf("answer = %d %v", status, p)
		}
		ex := waitDone(t, srv.url, id)
		out, _ := ex["output"].(map[string]any)
		if ex["status"] != "succeeded" || out["confirmed"] != true {
			t.Fatalf("execution = %v", ex)
		}

		// Declined: the server ends the task, and the step fails.
		id = submit(t, `{"seconds":0.5,"input":true}`)
		_, qid = waitQuestion(t, addr, id)
		if status, p := decideQuestion(t, addr, "k2", qid, "decline", map[string]any{}); status != http.StatusOK {
			t.Fatalf("decline = %d %v", status, p)
		}
		ex = waitDone(t, srv.url, id)
		e, _ := ex["error"].(map[string]any)
		if ex["status"] != "failed" || e["code"] != "step_failed" || !strings.Contains(fmt.Sprint(e["message"]), "not confirmed") {
			t.Fatalf("execution = %v", ex)
		}
	})
}

// TestAgentToolCallRunsAsTask: a model's tool call that the server runs as
// a task is waited for like a step's, and its result reaches the model.
func TestAgentToolCallRunsAsTask(t *testing.T) {
	t.Parallel()
	llm := newFakeLLM(t, "")
	llm.tool, llm.args = "demo_slow_job", `{"seconds": 1}`
	jobs, cfgBody := jobsServer(t)
	cfgBody += fmt.Sprintf("models:\n  local: { type: openai, baseURL: %q }\n", llm.URL+"/v1")
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": writeConfig(t, cfgBody), "PATCHBAY_API_KEYS": "k1",
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	})
	status, ex := post2(strings.TrimPrefix(srv.url, "http://"), "k1", []byte(`{"agent":{"model":"local/llama3","tools":[{"connection":"demo"}]},"input":"go"}`))
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ex)
	}
	id := ex["id"].(string)
	ex = waitDone(t, srv.url, id)
	if ex["status"] != "succeeded" {
		t.Fatalf("execution = %v", ex)
	}
	var call map[string]any
	for _, s := range ex["steps"].([]any) {
		if st := s.(map[string]any); st["key"] == "agent/round:1/tool:call_01" {
			call = st
		}
	}
	out, _ := call["output"].(map[string]any)
	if call == nil || call["task"] == nil || out["task"] != call["task"] {
		t.Fatalf("tool call entry = %v (steps %v)", call, ex["steps"])
	}
	llm.mu.Lock()
	saw := llm.sawResult
	llm.mu.Unlock()
	if st := jobs.Stats(); st.Calls != 1 || !saw {
		t.Fatalf("server saw %+v; the model saw the result: %v", st, saw)
	}
}
