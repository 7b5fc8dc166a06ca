package harness

import (
	"context"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// numsub is how many clients Redis has subscribed to channel.
func numsub(t *testing.T, st *store.Store, channel string) int64 {
	t.Helper()
	m, err := st.Client.PubSubNumSub(context.Background(), channel).Result()
	if err != nil {
		t.Fatal(err)
	}
	return m[channel]
}

func heard(ch <-chan struct{}, within time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(within):
		return false
	}
}

// A watched channel is subscribed while it has watchers and only then;
// watch returns once Redis has confirmed it, so a message published right
// after is heard; a channel watched again as its last watcher leaves stays
// subscribed (the commands go out in order).
func TestWatchSubscribesWhileWatched(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		n := newNotifier(st.Client, globEscape(st.Prefix)+"{exec:*}:done")
		ch := st.Key("{exec:w1}", "events")

		a, stopA := n.watch(ctx, ch)
		if got := numsub(t, st, ch); got != 1 {
			t.Fatalf("subscribers after watch = %d, want 1", got)
		}
		st.Client.Publish(ctx, ch, "")
		if !heard(a, 5*time.Second) {
			t.Fatal("the first watcher heard nothing")
		}
		b, stopB := n.watch(ctx, ch)
		st.Client.Publish(ctx, ch, "")
		if !heard(a, 5*time.Second) || !heard(b, 5*time.Second) {
			t.Fatal("both watchers should hear a message")
		}
		stopA()
		st.Client.Publish(ctx, ch, "")
		if !heard(b, 5*time.Second) {
			t.Fatal("the remaining watcher heard nothing")
		}
		stopB()
		// UNSUBSCRIBE is not waited for: it is done when Redis says so.
		for deadline := time.Now().Add(5 * time.Second); numsub(t, st, ch) != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("still subscribed 5s after the last watcher left")
			}
		}
		for range 20 {
			_, stop := n.watch(ctx, ch)
			stop()
		}
		c, stopC := n.watch(ctx, ch)
		defer stopC()
		st.Client.Publish(ctx, ch, "")
		if !heard(c, 5*time.Second) {
			t.Fatal("a watcher after quick watch/stop cycles heard nothing")
		}
		if got := numsub(t, st, ch); got != 1 {
			t.Fatalf("subscribers = %d, want 1", got)
		}
	})
}

// A confirmation nobody waits for is go-redis subscribing again after a
// reconnect: the channel's watchers are woken, since what was published
// meanwhile is lost.
func TestResubscriptionWakesWatchers(t *testing.T) {
	t.Parallel()
	st := storetest.NewEmbedded(t)
	n := newNotifier(st.Client, globEscape(st.Prefix)+"{exec:*}:done")
	ch := st.Key("{exec:w2}", "events")
	wake, stop := n.watch(context.Background(), ch)
	defer stop()
	if heard(wake, 50*time.Millisecond) {
		t.Fatal("woken by its own subscription's confirmation")
	}
	n.subscribed(ch)
	if !heard(wake, time.Second) {
		t.Fatal("a re-subscription did not wake the watcher")
	}
}

// A confirmation that never comes (lost with its connection) holds a
// watcher up for subscribeWait at most, and not the next one.
func TestLostConfirmationIsGivenUp(t *testing.T) {
	t.Parallel()
	st := storetest.NewEmbedded(t)
	n := newNotifier(st.Client, globEscape(st.Prefix)+"{exec:*}:done")
	ch := st.Key("{exec:w3}", "events")
	// A SUBSCRIBE counted whose confirmation was lost.
	n.start.Do(n.open)
	<-n.ready
	n.mu.Lock()
	n.pending[ch] = 1
	n.mu.Unlock()
	began := time.Now()
	_, stop := n.watch(context.Background(), ch)
	if took := time.Since(began); took < subscribeWait/2 || took > 3*subscribeWait {
		t.Fatalf("the first watcher waited %s, want about %s", took, subscribeWait)
	}
	stop()
	began = time.Now()
	_, stop = n.watch(context.Background(), ch)
	defer stop()
	if took := time.Since(began); took > subscribeWait/2 {
		t.Fatalf("the next watcher waited %s", took)
	}
}
