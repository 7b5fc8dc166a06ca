package mcp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// serveJobs serves the demo with slow_job as a task of the Tasks
// extension, as cmd/demo-mcp -http does, and returns its task store.
func serveJobs(t *testing.T) (*demo.Jobs, config.MCP) {
	t.Helper()
	s := demo.NewServer()
	jobs := demo.NewJobs()
	jobs.Poll = 50 * time.Millisecond // under the floor: the floor decides
	s.AddTools(jobs.Tool())
	ts := httptest.NewServer(jobs.Handler(server.NewStreamableHTTPServer(s)))
	t.Cleanup(ts.Close)
	return jobs, config.MCP{URL: ts.URL + "/mcp"}
}

// watch records what a provider tells the harness of a call's task.
type watch struct {
	mu       sync.Mutex
	started  []string
	statuses []string
	cancels  bool
	startErr error
}

func (w *watch) taskWatch(resume string) *connect.TaskWatch {
	return &connect.TaskWatch{
		Resume: resume,
		Started: func(_ context.Context, id string) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.started = append(w.started, id)
			return w.startErr
		},
		Progress: func(p connect.TaskProgress) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.statuses = append(w.statuses, p.Status)
		},
		Cancels: func(context.Context) bool { return w.cancels },
	}
}

func (w *watch) ids() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.started)
}

// TestTaskPolledToItsResult: slow_job answers with a task; the call
// records its id first, polls tasks/get no faster than the floor, and
// returns the completed task's result like any call's.
func TestTaskPolledToItsResult(t *testing.T) {
	t.Parallel()
	jobs, spec := serveJobs(t)
	conn := openConn(t, "jobs", spec, nil)
	w := &watch{}
	start := time.Now()
	out, err := conn.Call(t.Context(), connect.CallRequest{Op: "slow_job", Args: map[string]any{"seconds": 1}, IdempotencyKey: "k1", Task: w.taskWatch("")})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	ids := w.ids()
	res, _ := out.(map[string]any)
	if len(ids) != 1 || res["task"] != ids[0] || res["done"] != true || res["idempotencyKey"] != "k1" {
		t.Fatalf("result %v, tasks started %v", out, ids)
	}
	st := jobs.Stats()
	if st.Calls != 1 || st.Gets < 2 {
		t.Fatalf("server saw %+v, want one call and polls", st)
	}
	// Polls at 50 ms would be about 20 in a second; the floor allows at
	// most one per TaskPollFloor (and one more at the end).
	if limit := int(took/pbmcp.TaskPollFloor) + 2; st.Gets > limit {
		t.Errorf("%d polls in %s, want at most %d (the floor is %s)", st.Gets, took, limit, pbmcp.TaskPollFloor)
	}
	if got := w.statuses; len(got) < 2 || got[0] != "working" || got[len(got)-1] != "completed" {
		t.Errorf("progress %v, want working … completed", got)
	}
}

// TestTaskResumedNotCalledAgain: a call cut short while its task runs
// (the runner stops: no cancel) leaves the task alone; a call resuming
// the task waits on it and sends no tools/call.
func TestTaskResumedNotCalledAgain(t *testing.T) {
	t.Parallel()
	jobs, spec := serveJobs(t)
	conn := openConn(t, "jobs", spec, nil)
	first := &watch{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := conn.Call(ctx, connect.CallRequest{Op: "slow_job", Args: map[string]any{"seconds": 1}, Task: first.taskWatch("")})
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); len(first.ids()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the task never started")
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cut short: err = %v", err)
	}
	id := first.ids()[0]
	second := &watch{}
	out, err := conn.Call(t.Context(), connect.CallRequest{Op: "slow_job", Args: map[string]any{"seconds": 1}, Task: second.taskWatch(id)})
	if err != nil {
		t.Fatal(err)
	}
	if res, _ := out.(map[string]any); res["task"] != id {
		t.Fatalf("resumed result %v, want task %s's", out, id)
	}
	st := jobs.Stats()
	if st.Calls != 1 || len(st.Cancelled) != 0 || len(second.ids()) != 0 {
		t.Fatalf("server saw %+v, resumed call started %v; want one call, no cancel, no new task", st, second.ids())
	}
}

// TestTaskEndings: a cancelled caller cancels its task upstream; a task
// that asks for input fails the call (and is cancelled, since nobody will
// answer); a task the server does not know fails the call; a task whose
// id cannot be recorded is cancelled.
func TestTaskEndings(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       map[string]any
		resume     string
		cancelAt   time.Duration
		startErr   error
		wantErr    error
		wantCancel bool
	}{
		{name: "cancelled", args: map[string]any{"seconds": 30}, cancelAt: 300 * time.Millisecond, wantErr: context.Canceled, wantCancel: true},
		{name: "input required", args: map[string]any{"seconds": 0.4, "input": true}, wantErr: pbmcp.ErrTaskInputRequired, wantCancel: true},
		{name: "unknown task", args: map[string]any{"seconds": 1}, resume: "no-such-task", wantErr: pbmcp.ErrTaskGone},
		{name: "not recorded", args: map[string]any{"seconds": 30}, startErr: connect.ErrUnavailable, wantErr: connect.ErrUnavailable, wantCancel: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			jobs, spec := serveJobs(t)
			conn := openConn(t, "jobs", spec, nil)
			w := &watch{cancels: true, startErr: tt.startErr}
			ctx := t.Context()
			if tt.cancelAt > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				time.AfterFunc(tt.cancelAt, cancel)
			}
			_, err := conn.Call(ctx, connect.CallRequest{Op: "slow_job", Args: tt.args, Task: w.taskWatch(tt.resume)})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			st := jobs.Stats()
			if cancelled := len(st.Cancelled) == 1 && len(w.ids()) == 1 && st.Cancelled[0] == w.ids()[0]; cancelled != tt.wantCancel {
				t.Fatalf("tasks/cancel sent for %v (started %v), want a cancel: %v", st.Cancelled, w.ids(), tt.wantCancel)
			}
		})
	}
}

// TestTaskOverStdioBlocks: over stdio the demo serves no tasks, so
// slow_job answers in place and no task is started.
func TestTaskOverStdioBlocks(t *testing.T) {
	t.Parallel()
	conn := openConn(t, "jobs", config.MCP{Command: demoBin}, nil)
	w := &watch{}
	out, err := conn.Call(t.Context(), connect.CallRequest{Op: "slow_job", Args: map[string]any{"seconds": 0.2}, Task: w.taskWatch("")})
	if err != nil {
		t.Fatal(err)
	}
	if res, _ := out.(map[string]any); res["done"] != true || res["task"] != nil || len(w.ids()) != 0 {
		t.Fatalf("stdio result %v, tasks %v", out, w.ids())
	}
}

// TestTaskInputAnswered: a task that turns input_required has its
// question answered through the call's Asker; the answer goes to the
// server with tasks/update, once, and the task goes on to its result. A
// refusal ends the task as the server decides.
func TestTaskInputAnswered(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, action string
		ok           bool
		wantErr      bool
	}{
		{"confirmed", connect.AnswerAccept, true, false},
		{"declined", connect.AnswerDecline, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			jobs, spec := serveJobs(t)
			conn := openConn(t, "jobs", spec, nil)
			var asked []connect.Question
			ask := func(_ context.Context, q connect.Question) (connect.Answer, error) {
				asked = append(asked, q)
				a := connect.Answer{Action: tt.action}
				if tt.action == connect.AnswerAccept {
					a.Content = map[string]any{"ok": tt.ok}
				}
				return a, nil
			}
			w := &watch{}
			out, err := conn.Call(t.Context(), connect.CallRequest{Op: "slow_job", Args: map[string]any{"seconds": 0.6, "input": true},
				Task: w.taskWatch(""), Ask: ask})
			if (err != nil) != tt.wantErr {
				t.Fatalf("out %v, err %v; want an error: %v", out, err, tt.wantErr)
			}
			if len(asked) != 1 || asked[0].Mode != "form" || asked[0].Message != "Go on with the job?" {
				t.Fatalf("asked %+v, want the job's one question", asked)
			}
			if st := jobs.Stats(); len(st.Answers) != 1 || st.Answers[0] != fmt.Sprintf("%s %v", tt.action, map[bool]any{true: true, false: nil}[tt.action == connect.AnswerAccept]) {
				t.Errorf("the server received %v", st.Answers)
			}
			if !tt.wantErr {
				if m, _ := out.(map[string]any); m["confirmed"] != true || m["done"] != true {
					t.Errorf("result = %v, want the job done and confirmed", out)
				}
			}
		})
	}
}
