package harness

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestTakeIsFenced: a runner whose claim was taken over (an older epoch)
// cannot take an event of its thread, as it could not record it; the
// current runner can.
func TestTakeIsFenced(t *testing.T) {
	t.Parallel()
	e := newSubmitExecutions(t, storetest.New(t))
	ctx := t.Context()
	turn, err := e.FollowThread(ctx, ThreadEvent{Thread: "mem:t1", Trigger: "t", Workflow: json.RawMessage(echoDoc),
		Event: ConnEvent{Connection: "mem", Type: "said", ID: "a", ReceivedAt: time.Now()}})
	if err != nil || !turn.Started {
		t.Fatalf("FollowThread = %+v, %v", turn, err)
	}
	rec, err := e.load(ctx, turn.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.Client.Set(ctx, e.epochKey(turn.ID), 2, 0).Err(); err != nil {
		t.Fatal(err)
	}
	raw := []byte(`{"connection":"mem","type":"said","id":"b"}`)
	zombie := &run{e: e, rec: rec, epoch: 1}
	if ok, err := zombie.take(ctx, "w", "b", raw); ok || !errors.Is(err, ErrFenced) {
		t.Fatalf("a fenced runner's take = %v, %v; want ErrFenced", ok, err)
	}
	current := &run{e: e, rec: rec, epoch: 2}
	if ok, err := current.take(ctx, "w", "b", raw); !ok || err != nil {
		t.Fatalf("the current runner's take = %v, %v", ok, err)
	}
}
