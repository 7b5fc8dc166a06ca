package harness_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// A replica that finds an execution claimed by a live runner must not drop
// the work item: if that runner then dies, the item is all that brings the
// execution back. Here replica B's attempt fails while A runs a long call;
// then A loses its claim as a killed process would; the execution must
// still finish.
func TestWorkItemSurvivesAFailedClaim(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	release := make(chan struct{})
	var entered atomic.Int32
	mem := harness.NewMemory(harness.MemoryOp{Operation: harness.Operation{Name: "slow"}, Fn: func(ctx context.Context, _ map[string]any) (any, error) {
		if entered.Add(1) == 1 {
			select { // the first runner is stuck until it dies
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return map[string]any{"ok": true}, nil
	}})
	reg := harness.NewRegistry(nil)
	must(t, reg.Add("svc", mem))
	must(t, reg.Start(context.Background()))
	const visibility = 300 * time.Millisecond
	grant := `{"connections":{"svc":{"ops":["*"]}}}`
	a := startWorkers(t, st, reg, 1, "ops", grant, harness.ExecutionsOptions{Visibility: visibility, Consumer: "a"})
	startWorkers(t, st, reg, 1, "ops", grant, harness.ExecutionsOptions{Visibility: visibility, Consumer: "b"})

	ex, err := a.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(callDoc("slow", `{}`)), Principal: "tester", Allowlist: "ops"})
	must(t, err)
	waitFor(t, "the first runner to start the call", func() bool { return entered.Load() == 1 })
	// Long enough for the other replica to take the item over and fail
	// to claim the execution, several times.
	time.Sleep(5 * visibility)
	// The runner dies: its claim lapses, and nothing it does counts any
	// more (as if a later claim had fenced it).
	ctx := context.Background()
	must(t, st.Client.Incr(ctx, st.Key("{exec:"+ex.ID+"}", "epoch")).Err())
	must(t, st.Client.Del(ctx, st.Key("{exec:"+ex.ID+"}", "owner")).Err())

	ex, err = a.Wait(ctx, ex.ID, 10*time.Second)
	must(t, err)
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("after the runner died: %s %+v, want succeeded by the other replica", ex.Status, ex.Error)
	}
	close(release)
}
