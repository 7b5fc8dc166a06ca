package harness_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestCancelReachesARunInAnotherInstance cancels calls in flight on one
// Executions from another on the same Redis, as two replicas would: the
// message goes through each process's one shared subscription, and every
// run listening on it hears only its own execution's cancel.
func TestCancelReachesARunInAnotherInstance(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		started := make(chan struct{}, 4)
		mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "hang"}, Fn: func(ctx context.Context, _ map[string]any) (any, error) {
			started <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		}})
		reg := registry.NewRegistry(nil)
		must(t, reg.Add("x", mem))
		must(t, reg.Start(context.Background()))
		runner := startWorkers(t, st, reg, 3, "all", `{"connections":{"x":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		// The other replica: no workers, only the API's side.
		other := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: gates.NewAllowlists(st)})

		doc := json.RawMessage(`{"version":1,"connections":{"x":{}},"root":{"kind":"call","id":"h","connection":"x","op":"hang"}}`)
		var ids []string
		for range 3 {
			ex, err := runner.Submit(context.Background(), harness.Request{Workflow: doc, Allowlist: "all"})
			must(t, err)
			ids = append(ids, ex.ID)
		}
		for range ids {
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("calls never started")
			}
		}
		// Cancel two of the three; the third must keep running.
		for _, id := range ids[:2] {
			begun := time.Now()
			got, err := other.Cancel(context.Background(), id)
			must(t, err)
			if got.Status != harness.ExecCancelled {
				t.Fatalf("%s after cancel: %s", id, got.Status)
			}
			if d := time.Since(begun); d > 3*time.Second {
				t.Fatalf("cancel of %s took %s", id, d)
			}
		}
		ex, err := runner.Get(context.Background(), ids[2])
		must(t, err)
		if ex.Status != harness.ExecRunning {
			t.Fatalf("the execution nobody cancelled is %s", ex.Status)
		}
		got, err := runner.Cancel(context.Background(), ids[2])
		must(t, err)
		if got.Status != harness.ExecCancelled {
			t.Fatalf("last after cancel: %s", got.Status)
		}
	})
}
