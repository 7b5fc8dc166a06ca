package harness

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// numsub is how many clients Redis has subscribed to channel (on every
// node of a cluster: a subscription lives on the node it was made on).
func numsub(t *testing.T, st *store.Store, channel string) int64 {
	t.Helper()
	var n atomic.Int64
	count := func(ctx context.Context, c redis.Cmdable) error {
		m, err := c.PubSubNumSub(ctx, channel).Result()
		n.Add(m[channel])
		return err
	}
	var err error
	if cc, ok := st.Client.(*redis.ClusterClient); ok {
		err = cc.ForEachShard(context.Background(), func(ctx context.Context, c *redis.Client) error { return count(ctx, c) })
	} else {
		err = count(context.Background(), st.Client)
	}
	if err != nil {
		t.Fatal(err)
	}
	return n.Load()
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

// BenchmarkFeedFanOut: one execution's events, each written once, read by
// feeds=N followers waiting on the shared subscription. ns/op is the time
// from an event's write until every feed has read it (events written
// back to back, so it is throughput, not latency); busy-conns is how
// many of the Redis pool's connections are in use while the feeds wait
// (none: the reads between waits are short).
func BenchmarkFeedFanOut(b *testing.B) {
	url := storetest.URL(b)
	for _, feeds := range []int{1, 32, 256} {
		b.Run(fmt.Sprintf("feeds=%d", feeds), func(b *testing.B) {
			var st *store.Store
			if url != "" {
				st = storetest.New(b)
			} else {
				st = storetest.NewEmbedded(b)
			}
			e := NewExecutions(st, registry.NewRegistry(nil), nil)
			ctx := context.Background()
			const id = "ex_bench"
			if err := st.Client.Set(ctx, e.recordKey(id), `{"status":"running"}`, time.Hour).Err(); err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			for range feeds {
				f, err := e.Follow(ctx, id, "")
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					defer f.Close()
					for seen := 0; seen < b.N; {
						evs, err := f.Next(ctx, 10*time.Second)
						if err != nil || len(evs) == 0 {
							b.Errorf("feed: %d of %d events, then %v", seen, b.N, err)
							return
						}
						seen += len(evs)
					}
				})
			}
			time.Sleep(100 * time.Millisecond) // every feed has read and waits
			ps := st.Client.PoolStats()
			busy := ps.TotalConns - ps.IdleConns
			b.ResetTimer()
			for range b.N {
				e.emit(ctx, id, "bench", map[string]any{"n": 1})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(busy), "busy-conns")
		})
	}
}
