package harness_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// taskConn answers its one operation, job, as a server running it as a
// task would through a provider: it announces task t-1, reports progress,
// and finishes when released or gives up when its context ends, noting
// whether the harness asked it to cancel the task upstream.
type taskConn struct {
	release chan struct{}
	cancels chan bool
}

func (c *taskConn) Connect(context.Context) (connect.Conn, error) { return c, nil }
func (c *taskConn) Manifest() connect.Manifest {
	return connect.Manifest{Operations: []connect.Operation{{Name: "job", InputSchema: json.RawMessage(`{"type":"object"}`)}}}
}
func (c *taskConn) Identity() connect.Identity {
	return connect.Identity{Surface: "fake", Instance: "one", Epoch: 1}
}
func (c *taskConn) Info() map[string]any { return nil }
func (c *taskConn) Close() error         { return nil }

func (c *taskConn) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	w := req.Task
	if w.Resume != "" {
		return map[string]any{"resumed": w.Resume}, nil
	}
	if err := w.Started(ctx, "t-1"); err != nil {
		return nil, err
	}
	w.Progress(connect.TaskProgress{ID: "t-1", Status: "working", Message: "half way"})
	select {
	case <-c.release:
		return map[string]any{"task": "t-1"}, nil
	case <-ctx.Done():
		c.cancels <- w.Cancels(ctx)
		return nil, ctx.Err()
	}
}

// TestTaskRecordedAndCancelled: a call the connection runs as a task has
// the task's id in its ledger entry while it runs, its progress in
// step.task events, and cancelling the execution tells the provider to
// cancel the task upstream.
func TestTaskRecordedAndCancelled(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		conn := &taskConn{release: make(chan struct{}), cancels: make(chan bool, 1)}
		reg := registry.NewRegistry(nil)
		must(t, reg.Add("svc", conn))
		must(t, reg.Start(ctx))
		execs := startWorkers(t, st, reg, 1, "jobs", `{"connections":{"svc":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		doc := `{"version":1,"connections":{"svc":{}},"root":{"kind":"call","id":"job","connection":"svc","op":"job","args":{}}}`
		submit := func() string {
			ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Allowlist: "jobs"})
			must(t, err)
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				got, err := execs.Get(ctx, ex.ID)
				must(t, err)
				if s := step(got, "job"); s != nil && s.Task == "t-1" && s.Status == harness.StepPending {
					return ex.ID
				}
			}
			t.Fatal("the pending entry never recorded task t-1")
			return ""
		}

		id := submit()
		conn.release <- struct{}{}
		ex, err := execs.Wait(ctx, id, 10*time.Second)
		must(t, err)
		if ex.Status != harness.ExecSucceeded || step(ex, "job").Task != "t-1" {
			t.Fatalf("execution %s %+v, entry %+v", ex.Status, ex.Error, step(ex, "job"))
		}
		events, err := execs.Events(ctx, id, "", 0)
		must(t, err)
		var seen []string
		for _, ev := range events {
			if ev.Type == harness.EventStepTask && ev.Data["task"] == "t-1" {
				seen = append(seen, ev.Data["status"].(string)+":"+stringOf(ev.Data["message"]))
			}
		}
		if len(seen) != 2 || seen[0] != "working:" || seen[1] != "working:half way" {
			t.Fatalf("step.task events %v", seen)
		}

		id = submit()
		_, err = execs.Cancel(ctx, id)
		must(t, err)
		select {
		case cancels := <-conn.cancels:
			if !cancels {
				t.Fatal("a cancelled execution's task was left running upstream")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the call was not cut short by the cancel")
		}
	})
}

func stringOf(v any) string {
	s, _ := v.(string)
	return s
}
