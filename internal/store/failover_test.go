package store_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// failoverBound is how soon after the promotion every write must succeed
// again: the goal is 2 s, with slack for a loaded machine.
const failoverBound = 3 * time.Second

// writer writes to keys (each in turn, as separate requests every 20 ms)
// until stopped, recording when writes failed.
type writer struct {
	mu       sync.Mutex
	failures []time.Time
	other    []error // failures that are not unavailability: a bug
	writes   int
	stop     chan struct{}
	done     chan struct{}
}

func startWriter(s *store.Store, keys []string) *writer {
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for i := 0; ; i++ {
			select {
			case <-w.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			ctx, end := store.WithRequestWait(context.Background(), store.RequestWait)
			err := s.Client.Set(ctx, keys[i%len(keys)], i, 0).Err()
			end()
			w.mu.Lock()
			w.writes++
			if err != nil {
				w.failures = append(w.failures, time.Now())
				if !store.Unavailable(err) {
					w.other = append(w.other, err)
				}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// finish stops the writer and returns the last failure (zero for none),
// the number of failed and of all writes, and the failures that were not
// unavailability.
func (w *writer) finish() (last time.Time, failed, all int, other []error) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.failures) > 0 {
		last = w.failures[len(w.failures)-1]
	}
	return last, len(w.failures), w.writes, w.other
}

func openQuiet(t *testing.T, url string) *store.Store {
	t.Helper()
	s, err := store.Open(t.Context(), url, storetest.Prefix(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// checkGap runs the writer while kill takes the master down, waits for
// promoted to report the promotion, and checks that writes succeed again
// within failoverBound of it.
func checkGap(t *testing.T, s *store.Store, keys []string, kill func(), promoted func() time.Time) {
	t.Helper()
	w := startWriter(s, keys)
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	kill()
	at := promoted()
	if at.IsZero() {
		w.finish()
		t.Fatal("no replica was promoted")
	}
	time.Sleep(failoverBound + time.Second)
	last, failed, all, other := w.finish()
	for _, err := range other {
		t.Errorf("a write failed with %v, not as unavailable", err)
	}
	gap := max(last.Sub(at), 0)
	t.Logf("promotion %s after the kill; writes failed until %s after the kill, %s after the promotion (%d of %d failed)",
		at.Sub(killed).Round(time.Millisecond), last.Sub(killed).Round(time.Millisecond), gap.Round(time.Millisecond), failed, all)
	if gap > failoverBound {
		t.Errorf("writes failed until %s after the promotion, want within %s", gap, failoverBound)
	}
	if failed == 0 {
		t.Error("no write failed: the master was not the one written to")
	}
}

// TestClusterFailoverReachesThePromotedReplica: on a real Redis Cluster,
// after the master serving a key is killed, writes to it succeed again
// within failoverBound of its replica's promotion (go-redis alone keeps
// dialing the dead master until its periodic reload, a minute later).
func TestClusterFailoverReachesThePromotedReplica(t *testing.T) {
	t.Parallel()
	c := storetest.StartCluster(t)
	s := openQuiet(t, c.URL())
	// Keys on every master, so the writer keeps going to the others.
	keys := make([]string, 12)
	for i := range keys {
		keys[i] = s.Key(fmt.Sprintf("{k%d}", i))
	}
	master, replica := c.MasterOf(t, keys[0])
	checkGap(t, s, keys, master.Kill, func() time.Time { return storetest.WaitMaster(t, replica, 30*time.Second) })
}

// TestSentinelFailoverReachesThePromotedReplica: through a sentinel,
// after the master is killed, writes succeed again within failoverBound
// of the sentinel naming the replica as the new master.
func TestSentinelFailoverReachesThePromotedReplica(t *testing.T) {
	t.Parallel()
	sn := storetest.StartSentinel(t)
	s := openQuiet(t, sn.URL())
	checkGap(t, s, []string{s.Key("k")}, sn.Master.Kill, func() time.Time { return sn.WaitSwitched(t, 30*time.Second) })
}
