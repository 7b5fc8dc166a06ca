package triggers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

// TestReclaimFromDeadReplica: entries read by a replica that then died are
// taken over after ReclaimAfter; one that was delivered MaxDeliveries times
// already goes to the dead letters instead. Stream idle times need the
// real server.
func TestReclaimFromDeadReplica(t *testing.T) {
	t.Parallel()
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + "): stream idle times")
	}
	st := storetest.New(t)
	f := baseFile()
	f.Inbox.MaxDeliveries = 2
	b := setup(t, st, f, nil)
	ctx := context.Background()
	stream := st.Key("{in:deploys}", "stream")
	if err := st.Client.XGroupCreateMkStream(ctx, stream, "triggers", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if _, err := b.svc.Emit(ctx, "deploys", failed(id, "api"), triggers.Via{Kind: "api"}); err != nil {
			t.Fatal(err)
		}
	}
	// A replica reads both and dies; a's entry had been delivered once
	// before (to another dead replica).
	got, err := st.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triggers", Consumer: "dead-1", Streams: []string{stream, ">"}, Count: 10}).Result()
	if err != nil || len(got[0].Messages) != 2 {
		t.Fatalf("read: %v %v", got, err)
	}
	first := got[0].Messages[0].ID
	if err := st.Client.XClaim(ctx, &redis.XClaimArgs{Stream: stream, Group: "triggers", Consumer: "dead-2", Messages: []string{first}}).Err(); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if err := b.svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b's turn and a's dead letter", func() bool {
		c := trigger(status(t, b), "failures").Counts
		return c.Succeeded == 1 && c.Dead == 1
	})
	if d := time.Since(started); d < time.Second {
		t.Errorf("reclaimed after %s, before ReclaimAfter", d)
	}
	dls, err := b.svc.DeadLetters(ctx)
	if err != nil || len(dls) != 1 || dls[0].Event.ID != "a" || dls[0].Deliveries != 2 {
		t.Fatalf("dead letters = %+v, %v", dls, err)
	}
	exs := allExecutions(t, b.execs)
	if len(exs) != 1 || eventID(exs[0]) != "b" {
		t.Fatalf("executions = %v", exs)
	}
	// Redelivered, a starts its one turn.
	if _, err := b.svc.Redeliver(ctx, dls[0].ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's turn", func() bool { return trigger(status(t, b), "failures").Counts.Succeeded == 2 })
	if s := status(t, b); s.Inboxes[0].Depth != 0 || s.Inboxes[0].Pending != 0 || s.Inboxes[0].DeadLetters != 0 {
		t.Errorf("inbox = %+v", s.Inboxes[0])
	}
}

// TestReclaimDrainsABacklog: a replica that read a thousand entries and
// died leaves them all stalled at once; another replica takes them in one
// pass and their turns all run within seconds. Stream idle times need the
// real server.
func TestReclaimDrainsABacklog(t *testing.T) {
	t.Parallel()
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + "): stream idle times")
	}
	const backlog = 1000
	st := storetest.New(t)
	f := baseFile()
	// Long enough that a hundred entries per pass (a pass every 2 s)
	// could not pass: that took 20 s.
	f.Inbox.ReclaimAfter = 4 * time.Second
	b := setup(t, st, f, nil)
	ctx := context.Background()
	stream := st.Key("{in:deploys}", "stream")
	if err := st.Client.XGroupCreateMkStream(ctx, stream, "triggers", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for i := range backlog {
		if _, err := b.svc.Emit(ctx, "deploys", failed(fmt.Sprintf("ev-%d", i), "api"), triggers.Via{Kind: "api"}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.Client.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "triggers", Consumer: "dead", Streams: []string{stream, ">"}, Count: backlog}).Result()
	if err != nil || len(got[0].Messages) != backlog {
		t.Fatalf("read: %d, %v", len(got[0].Messages), err)
	}
	stalled := time.Now().Add(f.Inbox.ReclaimAfter) // when the entries come due
	if err := b.svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var reclaimed time.Duration
	deadline := time.Now().Add(60 * time.Second)
	for {
		pend, err := st.Client.XPending(ctx, stream, "triggers").Result()
		if err != nil {
			t.Fatal(err)
		}
		if reclaimed == 0 && pend.Consumers["dead"] == 0 {
			reclaimed = time.Since(stalled)
		}
		if c := trigger(status(t, b), "failures").Counts; c.Succeeded == backlog {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s: %+v, pending %+v", trigger(status(t, b), "failures").Counts, pend)
		}
		time.Sleep(50 * time.Millisecond)
	}
	drained := time.Since(stalled)
	t.Logf("%d stalled entries: all reclaimed %s after they came due, all turns done after %s (%.0f entries/s)",
		backlog, reclaimed.Round(time.Millisecond), drained.Round(time.Millisecond), backlog/drained.Seconds())
	// The first pass after they come due (within half ReclaimAfter)
	// takes them all.
	if reclaimed > 2*f.Inbox.ReclaimAfter {
		t.Errorf("reclaimed %s after coming due, want within %s", reclaimed, 2*f.Inbox.ReclaimAfter)
	}
	if n := len(allExecutions(t, b.execs)); n != backlog {
		t.Errorf("%d executions listed, want %d", n, backlog)
	}
}
