package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// replaceable is a server that can be replaced: each Connect makes a new
// instance (a new identity), and Replace drops the current one, as a crashed
// server process would.
type replaceable struct {
	ops  []connecttest.MemoryOp
	mu   sync.Mutex
	cur  *lossy
	made atomic.Int32
}

type lossy struct {
	*connecttest.Memory
	done chan struct{}
}

func (l *lossy) Done() <-chan struct{} { return l.done }
func (l *lossy) Err() error            { return errors.New("server replaced") }

func (p *replaceable) Connect(context.Context) (connect.Conn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cur = &lossy{Memory: connecttest.NewMemory(p.ops...), done: make(chan struct{})}
	p.made.Add(1)
	return p.cur, nil
}

// Replace drops the current instance and waits for the reconnect.
func (p *replaceable) Replace(t *testing.T, c *registry.Connection) {
	t.Helper()
	before := c.Identity().Instance
	p.mu.Lock()
	close(p.cur.done)
	p.mu.Unlock()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if id := c.Identity().Instance; id != "" && id != before && c.Status().State == connect.StateReady {
			return
		}
	}
	t.Fatal("connection was not replaced")
}

func TestResumeAfterIdentityChange(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		determinism string
		rerun       []string
		status      harness.ExecState
		marks       int64 // calls of "mark" in all
		instances   int32 // server instances made: start, replace, and a costly reset
	}{
		{"unsafe refuses", "", nil, harness.ExecFailed, 1, 2},
		{"unsafe with rerun runs live", "", []string{"x"}, harness.ExecSucceeded, 2, 2},
		{"replayable keeps results", registry.Replayable, nil, harness.ExecSucceeded, 1, 2},
		{"costly resets and runs live", registry.Costly, nil, harness.ExecSucceeded, 2, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var marks atomic.Int64
			var broken atomic.Bool
			broken.Store(true)
			prov := &replaceable{ops: []connecttest.MemoryOp{
				{Operation: connect.Operation{Name: "mark"}, Fn: func(context.Context, map[string]any) (any, error) {
					return map[string]any{"n": marks.Add(1)}, nil
				}},
				{Operation: connect.Operation{Name: "flaky"}, Fn: func(context.Context, map[string]any) (any, error) {
					if broken.Load() {
						return nil, &connect.CallError{Op: "flaky", Message: "not yet"}
					}
					return "ok", nil
				}},
			}}
			reg := registry.NewRegistry(nil)
			must(t, reg.Add("x", prov))
			must(t, reg.SetPolicy("x", registry.Policy{Determinism: tt.determinism}))
			must(t, reg.Start(context.Background()))
			t.Cleanup(func() { _ = reg.Close() })
			st := storetest.New(t)
			execs := startWorkers(t, st, reg, 1, "all", `{"connections":{"x":{"ops":["*"]}}}`, harness.ExecutionsOptions{})

			doc := `{"version":1,"connections":{"x":{}},"root":{"kind":"sequence","id":"m","steps":[{"mark":{}},{"flaky":{}}]}}`
			ex := runDocAs(t, execs, doc, "all")
			if ex.Status != harness.ExecFailed || ex.Error.Step == "" {
				t.Fatalf("first run: %s %+v", ex.Status, ex.Error)
			}
			conn, _ := reg.Get("x")
			prov.Replace(t, conn)
			broken.Store(false)

			_, err := execs.Resume(context.Background(), ex.ID, tt.rerun)
			must(t, err)
			ex, err = execs.Wait(context.Background(), ex.ID, 10*time.Second)
			must(t, err)
			if ex.Status != tt.status {
				t.Fatalf("after resume: %s %+v", ex.Status, ex.Error)
			}
			if tt.status == harness.ExecFailed && ex.Error.Code != "resume_refused" {
				t.Fatalf("error = %+v, want resume_refused", ex.Error)
			}
			if got := marks.Load(); got != tt.marks {
				t.Fatalf("mark called %d times, want %d", got, tt.marks)
			}
			if got := prov.made.Load(); got != tt.instances {
				t.Fatalf("%d server instances, want %d", got, tt.instances)
			}
			if len(ex.Rerun) != 0 {
				t.Fatalf("rerun outlived its run: %v", ex.Rerun)
			}
		})
	}
}

func runDocAs(t *testing.T, execs *harness.Executions, doc, allowlist string) *harness.Execution {
	t.Helper()
	ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Allowlist: allowlist})
	must(t, err)
	ex, err = execs.Wait(context.Background(), ex.ID, 10*time.Second)
	must(t, err)
	return ex
}

// TestCancelStopsTheExpressionInFlight: cancelling an execution while one
// of its expressions runs (one that would run to the 1-second time limit)
// interrupts the expression: its step ends saying so, not on the limit,
// and the call the expression feeds is never made. On a machine slow
// enough (-race, a loaded runner) that the cancel lands only as the limit
// strikes, the attempt proves nothing and is made again.
func TestCancelStopsTheExpressionInFlight(t *testing.T) {
	t.Parallel()
	var called atomic.Bool
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}, Fn: func(context.Context, map[string]any) (any, error) {
		called.Store(true)
		return nil, nil
	}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("x", mem))
	must(t, reg.Start(context.Background()))
	st := storetest.New(t)
	execs := startWorkers(t, st, reg, 1, "all", `{"connections":{"x":{"ops":["*"]}}}`, harness.ExecutionsOptions{})

	var ended []string
	for range 5 {
		msg := cancelDuringExpression(t, execs)
		if called.Load() {
			t.Fatal("the call the cancelled expression feeds was made")
		}
		if strings.Contains(msg, "interrupted") {
			return
		}
		ended = append(ended, msg)
	}
	t.Fatalf("no cancel interrupted its expression; the steps ended: %q", ended)
}

// cancelDuringExpression starts an execution whose one expression
// compares two 400 KB strings that differ in their last byte 400,000 times
// (cheap in steps, long in time), cancels it while the expression runs,
// and returns how its step ended.
func cancelDuringExpression(t *testing.T, execs *harness.Executions) string {
	t.Helper()
	ctx := context.Background()
	s := strings.Repeat("0123456789", 40_000)
	doc := `{"version":1,"connections":{"x":{}},"root":{"kind":"call","id":"e","connection":"x","op":"echo","args":{"n":{"$expr":"count(1..400000, $input.s == $input.t)"}}}}`
	ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Allowlist: "all",
		Input: map[string]any{"s": s, "t": s[:len(s)-1] + "x"}})
	must(t, err)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got, err := execs.Get(ctx, ex.ID)
		must(t, err)
		if got.Status == harness.ExecRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ran: %s", got.Status)
		}
	}
	time.Sleep(50 * time.Millisecond) // into the expression
	if _, err := execs.Cancel(ctx, ex.ID); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		evs, err := execs.Events(ctx, ex.ID, "", 0)
		must(t, err)
		for _, ev := range evs {
			if ev.Type == "step.finished" {
				e, _ := ev.Data["error"].(map[string]any)
				msg, _ := e["message"].(string)
				return msg
			}
		}
	}
	t.Fatal("the step never finished")
	return ""
}

func TestCancelStopsTheCallInFlight(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 1)
	var sawCancel atomic.Bool
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "hang"}, Fn: func(ctx context.Context, _ map[string]any) (any, error) {
		started <- struct{}{}
		<-ctx.Done()
		sawCancel.Store(true)
		return nil, ctx.Err()
	}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("x", mem))
	must(t, reg.Start(context.Background()))
	st := storetest.New(t)
	execs := startWorkers(t, st, reg, 1, "all", `{"connections":{"x":{"ops":["*"]}}}`, harness.ExecutionsOptions{})

	ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(`{"version":1,"connections":{"x":{}},"root":{"kind":"call","id":"h","connection":"x","op":"hang"}}`), Allowlist: "all"})
	must(t, err)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("call never started")
	}
	begun := time.Now()
	got, err := execs.Cancel(context.Background(), ex.ID)
	must(t, err)
	if got.Status != harness.ExecCancelled || got.Error.Code != "cancelled" {
		t.Fatalf("after cancel: %s %+v", got.Status, got.Error)
	}
	if !sawCancel.Load() {
		t.Fatal("the call in flight was not cancelled")
	}
	if d := time.Since(begun); d > 3*time.Second {
		t.Fatalf("cancel took %s", d)
	}
	// The record is written before the last event: give it a moment.
	var last harness.Event
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		events, err := execs.Events(context.Background(), ex.ID, "", 0)
		must(t, err)
		if last = events[len(events)-1]; last.Type == harness.EventFinished {
			break
		}
	}
	if last.Type != harness.EventFinished || last.Data["status"] != "cancelled" {
		t.Fatalf("last event = %+v", last)
	}
}
