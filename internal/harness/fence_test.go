package harness

import (
	"context"
	"errors"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestZombieWritesAreRefused: a runner whose claim lapsed and was taken
// over cannot write the record any more, and a claim held by a live runner
// cannot be taken.
func TestZombieWritesAreRefused(t *testing.T) {
	t.Parallel()
	reg, _ := testRegistry(t)
	e := NewExecutions(storetest.New(t), reg, nil)
	ctx := context.Background()
	ex, err := e.enqueue(ctx, "ex_fence", []byte(`{}`), nil, "t")
	must(t, err)
	old, err := e.claim(ctx, ex.ID, "a")
	must(t, err)
	if _, err := e.claim(ctx, ex.ID, "b"); !errors.Is(err, errClaimed) {
		t.Fatalf("second claim while held = %v, want errClaimed", err)
	}
	// a's claim lapses (its process froze); b takes the execution over.
	must(t, e.store.Client.Del(ctx, e.ownerKey(ex.ID)).Err())
	cur, err := e.claim(ctx, ex.ID, "b")
	must(t, err)
	if cur <= old {
		t.Fatalf("epoch went from %d to %d", old, cur)
	}
	rec, err := e.load(ctx, ex.ID)
	must(t, err)
	zombie := &run{e: e, rec: rec, epoch: old}
	rec.Status = ExecFailed
	if err := zombie.save(ctx); !errors.Is(err, ErrFenced) {
		t.Fatalf("zombie save = %v, want ErrFenced", err)
	}
	current := &run{e: e, rec: rec, epoch: cur}
	rec.Status = ExecRunning
	must(t, current.save(ctx))
	got, err := e.Get(ctx, ex.ID)
	must(t, err)
	if got.Status != ExecRunning {
		t.Fatalf("status = %s, want the current runner's write", got.Status)
	}
	// A claim refused while b held it is served when b releases.
	if _, err := e.claim(ctx, ex.ID, "c"); !errors.Is(err, errClaimed) {
		t.Fatal("claim while b holds it succeeded")
	}
	before, _ := e.store.Client.XLen(ctx, e.workKey()).Result()
	e.release(ctx, ex.ID, "b")
	after, _ := e.store.Client.XLen(ctx, e.workKey()).Result()
	if after != before+1 {
		t.Fatalf("work items %d → %d: the refused claim was not enqueued again", before, after)
	}
}
