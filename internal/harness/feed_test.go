package harness_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// eachSmallPool is storetest.Each with go-redis's pool cut to size
// connections: on a miniredis of the test's own, and on the real Redis
// when there is one.
func eachSmallPool(t *testing.T, size int, fn func(t *testing.T, st *store.Store)) {
	t.Helper()
	url := storetest.URL(t)
	t.Run("miniredis", func(t *testing.T) { fn(t, openSmallPool(t, "redis://"+miniredis.RunT(t).Addr(), size, "")) })
	if url != "" {
		t.Run("redis", func(t *testing.T) { fn(t, openSmallPool(t, url, size, "")) })
	}
}

// openSmallPool opens a store of the test's own on the Redis at base with
// a pool of size connections, each named name when it is not empty (so
// that a test can find its own on the server).
func openSmallPool(t *testing.T, base string, size int, name string) *store.Store {
	t.Helper()
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	url := fmt.Sprintf("%s%spool_size=%d", base, sep, size)
	if name != "" {
		url += "&client_name=" + name
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.Open(context.Background(), url, storetest.Prefix(), logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := storetest.DeletePrefix(ctx, st); err != nil {
			t.Errorf("delete keys under %s: %v", st.Prefix, err)
		}
		_ = st.Close()
	})
	return st
}

// holdBundle runs workers over a memory connection whose "hold"
// operation waits until released, so that an execution stays
// running, with its stream open, for as long as a test likes.
type holdBundle struct {
	execs   *harness.Executions
	release func()
}

func setupHold(t *testing.T, st *store.Store) holdBundle {
	t.Helper()
	hold, release := connecttest.Held("hold")
	mem := connecttest.NewMemory(hold, connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})
	reg := registry.NewRegistry(nil)
	if err := reg.Add("mem", mem); err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	execs := startWorkers(t, st, reg, 2, "test", `{"connections":{"mem":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
	t.Cleanup(release)
	return holdBundle{execs: execs, release: release}
}

const holdThenTwo = `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"main","steps":[
	{"kind":"call","id":"h","connection":"mem","op":"hold"},
	{"kind":"call","id":"a","connection":"mem","op":"echo","args":{"n":1}},
	{"kind":"call","id":"b","connection":"mem","op":"echo","args":{"n":2}}]}}`

func (b holdBundle) submit(t *testing.T) string {
	t.Helper()
	ex, err := b.execs.Submit(context.Background(), harness.Request{Workflow: []byte(holdThenTwo), Principal: "tester", Allowlist: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return ex.ID
}

// follow reads a feed to execution.finished and returns the ids of its
// events, in the order it returned them.
func follow(ctx context.Context, f *harness.EventFeed) ([]string, error) {
	var ids []string
	for {
		evs, err := f.Next(ctx, 30*time.Second)
		if err != nil {
			return ids, err
		}
		if len(evs) == 0 {
			return ids, errors.New("no event for 30s")
		}
		for _, ev := range evs {
			ids = append(ids, ev.ID)
			if ev.Type == harness.EventFinished {
				return ids, nil
			}
		}
	}
}

func allIDs(t *testing.T, execs *harness.Executions, id string) []string {
	t.Helper()
	evs, err := execs.Events(context.Background(), id, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	return ids
}

// Many feeds waiting on one execution hold none of the pool's
// connections: with a pool of 2 and 24 feeds, other reads answer at
// once, and every feed then gets every event once, in order.
func TestFeedsHoldNoPooledConnection(t *testing.T) {
	t.Parallel()
	const feeds = 24
	eachSmallPool(t, 2, func(t *testing.T, st *store.Store) {
		b := setupHold(t, st)
		id := b.submit(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		results := make([][]string, feeds)
		errs := make([]error, feeds)
		var wg sync.WaitGroup
		for i := range feeds {
			f, err := b.execs.Follow(ctx, id, "")
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				defer f.Close()
				results[i], errs[i] = follow(ctx, f)
			})
		}
		// The feeds are waiting (the execution is held in its first
		// step). The store still answers at once.
		time.Sleep(200 * time.Millisecond)
		for range 10 {
			began := time.Now()
			if _, err := b.execs.Get(ctx, id); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(began); took > 2*time.Second {
				t.Fatalf("a read took %s while %d feeds waited on a pool of 2", took, feeds)
			}
		}
		b.release()
		wg.Wait()
		want := strings.Join(allIDs(t, b.execs, id), " ")
		for i := range feeds {
			if errs[i] != nil || strings.Join(results[i], " ") != want {
				t.Fatalf("feed %d: %v, %v; want every event once, in order: %s", i, results[i], errs[i], want)
			}
		}
	})
}

// A feed resumed after an event id starts after it, and an unknown
// execution or a malformed id is refused before anything is watched.
func TestFollowResumesAfterAnEvent(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		b := setupHold(t, st)
		id := b.submit(t)
		b.release()
		if _, err := b.execs.Wait(context.Background(), id, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		all := allIDs(t, b.execs, id)
		if len(all) < 6 {
			t.Fatalf("events = %v", all)
		}
		f, err := b.execs.Follow(context.Background(), id, all[2])
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		got, err := follow(context.Background(), f)
		if err != nil || strings.Join(got, " ") != strings.Join(all[3:], " ") {
			t.Fatalf("after %s: %v, %v; want %v", all[2], got, err, all[3:])
		}
		// Past the end, nothing comes, and the feed says it ended.
		if evs, err := f.Next(context.Background(), 10*time.Millisecond); err != nil || len(evs) != 0 {
			t.Fatalf("past the end: %v, %v", evs, err)
		}
		if ended, err := f.Ended(context.Background()); err != nil || !ended {
			t.Fatalf("Ended = %v, %v", ended, err)
		}
		if _, err := b.execs.Follow(context.Background(), "ex_missing", ""); !errors.Is(err, fault.ErrNotFound) {
			t.Fatalf("Follow of a missing execution = %v", err)
		}
		if _, err := b.execs.Follow(context.Background(), id, "garbage"); !errors.Is(err, harness.ErrInvalidEventID) {
			t.Fatalf("Follow after garbage = %v", err)
		}
	})
}

// When the shared subscription's connection is killed, go-redis
// reconnects and subscribes again; the feed hears the events written
// after (and is woken to read any written meanwhile). Real Redis only:
// miniredis has no CLIENT KILL.
func TestFeedOutlivesALostSubscription(t *testing.T) {
	t.Parallel()
	url := storetest.URL(t) // in CI, fails the test when there is none
	if url == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + "): miniredis has no CLIENT KILL")
	}
	name := "pbtest-lost-" + storetest.Prefix()[7:15]
	st := openSmallPool(t, url, 4, name)
	b := setupHold(t, st)
	id := b.submit(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := b.execs.Follow(ctx, id, "")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Read up to the held step.
	for {
		evs, err := f.Next(ctx, 300*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			break
		}
	}
	killed := killSubscriber(t, st, name)
	if killed == 0 {
		t.Fatal("found no subscriber connection to kill")
	}
	b.release()
	began := time.Now()
	got, err := follow(ctx, f)
	if err != nil || len(got) == 0 {
		t.Fatalf("after the kill: %v, %v", got, err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("the events after the kill took %s", took)
	}
}

// killSubscriber kills the connections named name that are subscribed
// to something (on every node of a cluster), and returns how many.
func killSubscriber(t *testing.T, st *store.Store, name string) int {
	t.Helper()
	var n atomic.Int64
	kill := func(ctx context.Context, c redis.Cmdable) error {
		list, err := c.ClientList(ctx).Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(list, "\n") {
			f := map[string]string{}
			for _, kv := range strings.Fields(line) {
				k, v, _ := strings.Cut(kv, "=")
				f[k] = v
			}
			if f["name"] != name || (f["sub"] == "0" && f["psub"] == "0") {
				continue
			}
			if err := c.ClientKillByFilter(ctx, "ID", f["id"]).Err(); err != nil {
				return err
			}
			n.Add(1)
		}
		return nil
	}
	var err error
	if cc, ok := st.Client.(*redis.ClusterClient); ok {
		err = cc.ForEachShard(context.Background(), func(ctx context.Context, c *redis.Client) error { return kill(ctx, c) })
	} else {
		err = kill(context.Background(), st.Client)
	}
	if err != nil {
		t.Fatal(err)
	}
	return int(n.Load())
}
