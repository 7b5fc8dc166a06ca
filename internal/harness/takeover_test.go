package harness_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
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
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "slow"}, Fn: func(ctx context.Context, _ map[string]any) (any, error) {
		if entered.Add(1) == 1 {
			select { // the first runner is stuck until it dies
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return map[string]any{"ok": true}, nil
	}})
	reg := registry.NewRegistry(nil)
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

// A dead runner's execution is taken over as soon as its claim lapses,
// not a whole visibility timeout later. The race: the item comes due
// (idle for a timeout) while the dead runner's last renewal still holds
// the claim; that attempt is refused, and the retry must come when the
// claim lapses. Claim TTLs and stream idle times need the real server.
func TestTakeoverWhenTheDeadRunnersClaimLapses(t *testing.T) {
	t.Parallel()
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + "): claim TTLs and stream idle times")
	}
	st := storetest.New(t)
	var started atomic.Int64
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "mark"}, Fn: func(context.Context, map[string]any) (any, error) {
		started.CompareAndSwap(0, time.Now().UnixNano())
		return map[string]any{"ok": true}, nil
	}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("svc", mem))
	must(t, reg.Start(context.Background()))
	const visibility = 3 * time.Second
	ctx := context.Background()
	work := st.Key("work")
	must(t, st.Client.XGroupCreateMkStream(ctx, work, "workers", "0").Err())

	// Submitted, then read by a runner that claims it, renews once half a
	// timeout later, and dies.
	idle := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Visibility: visibility, Allowlists: gates.NewAllowlists(st)})
	al, err := gates.ParseAllowlist("ops", []byte(`{"connections":{"svc":{"ops":["*"]}}}`))
	must(t, err)
	_, err = gates.NewAllowlists(st).Put(ctx, al, "tester")
	must(t, err)
	ex, err := idle.Submit(ctx, harness.Request{Workflow: json.RawMessage(callDoc("mark", `{}`)), Principal: "tester", Allowlist: "ops"})
	must(t, err)
	must(t, st.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "workers", Consumer: "dead", Streams: []string{work, ">"}, Count: 1}).Err())
	owner := st.Key("{exec:"+ex.ID+"}", "owner")
	must(t, st.Client.Set(ctx, owner, "dead-token", visibility).Err())
	must(t, st.Client.Incr(ctx, st.Key("{exec:"+ex.ID+"}", "epoch")).Err())
	startWorkers(t, st, reg, 1, "ops", `{"connections":{"svc":{"ops":["*"]}}}`, harness.ExecutionsOptions{Visibility: visibility, Consumer: "b"})
	time.Sleep(visibility / 2)
	must(t, st.Client.Set(ctx, owner, "dead-token", visibility).Err()) // the last renewal
	lapsed := time.Now().Add(visibility)

	done, err := idle.Wait(ctx, ex.ID, 3*visibility)
	must(t, err)
	if done.Status != harness.ExecSucceeded {
		t.Fatalf("status = %s %+v", done.Status, done.Error)
	}
	lag := time.Unix(0, started.Load()).Sub(lapsed)
	t.Logf("taken over %s after the dead runner's claim lapsed (visibility %s)", lag.Round(time.Millisecond), visibility)
	// The worker polls every visibility/4; the old behaviour waited for
	// the item to come due again, half a timeout later here.
	if lag > visibility/4+500*time.Millisecond {
		t.Fatalf("taken over %s after the claim lapsed, want within a poll (%s)", lag, visibility/4)
	}
}
