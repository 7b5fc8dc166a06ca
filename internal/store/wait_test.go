package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestRequestWaitBoundsAFrozenRedis: under one request's mark, the first
// command to a Redis that stopped answering gives up after the wait (not
// after go-redis's read timeout times its retries), and the commands
// after it give up at once, so the request as a whole is bounded by one
// wait. Once the request has ended, the mark no longer applies.
func TestRequestWaitBoundsAFrozenRedis(t *testing.T) {
	t.Parallel()
	s, proxy := storetest.NewFreezable(t)
	key := s.Key("k")
	if err := s.Client.Set(t.Context(), key, "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.Freeze()

	const wait = 300 * time.Millisecond
	ctx, end := store.WithRequestWait(t.Context(), wait)
	start := time.Now()
	err := s.Client.Get(ctx, key).Err()
	first := time.Since(start)
	if !store.Unavailable(err) {
		t.Fatalf("GET on a frozen Redis: %v, want an unavailable error", err)
	}
	// The pipeline and script go the same way as single commands.
	_, perr := s.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, key)
		p.HGetAll(ctx, key+":h")
		return nil
	})
	serr := store.RenewScript.Run(ctx, s.Client, []string{key}, "token", 1000).Err()
	all := time.Since(start)
	t.Logf("frozen: first command gave up after %s, three after %s", first.Round(time.Millisecond), all.Round(time.Millisecond))
	if !store.Unavailable(perr) || !store.Unavailable(serr) {
		t.Errorf("after the first gave up: pipeline %v, script %v; want unavailable", perr, serr)
	}
	if first < wait || all > wait+time.Second {
		t.Errorf("gave up after %s (all three after %s), want after %s and within %s", first, all, wait, wait+time.Second)
	}

	// Thawed, a new request reads; the ended one does not fail at once
	// any more (work it started goes on normally).
	proxy.Thaw()
	end()
	if got, err := s.Client.Get(ctx, key).Result(); err != nil || got != "v" {
		t.Errorf("after the request ended: %q, %v", got, err)
	}
	ctx2, end2 := store.WithRequestWait(t.Context(), wait)
	defer end2()
	if got, err := s.Client.Get(ctx2, key).Result(); err != nil || got != "v" {
		t.Errorf("new request after the thaw: %q, %v", got, err)
	}
}

// TestRequestWaitCountsOnlyTheTimeWithoutAnswer: a command that failed
// quickly for want of Redis (here its caller's shorter deadline, as a
// refused dial to one dead cluster node would) uses up only its own time,
// so the request's clean-up still runs; and an answer gives the request
// its whole wait back.
func TestRequestWaitCountsOnlyTheTimeWithoutAnswer(t *testing.T) {
	t.Parallel()
	s, proxy := storetest.NewFreezable(t)
	key := s.Key("k")
	const wait = 400 * time.Millisecond
	ctx, end := store.WithRequestWait(t.Context(), wait)
	defer end()

	proxy.Freeze()
	short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	err := s.Client.Get(short, key).Err()
	cancel()
	if !store.Unavailable(err) {
		t.Fatalf("GET with a short deadline on a frozen Redis: %v", err)
	}
	proxy.Thaw()
	if err := s.Client.Set(ctx, key, "clean", 0).Err(); err != nil {
		t.Fatalf("clean-up after a short failure: %v", err)
	}

	// Redis answered: the next freeze is given the whole wait again.
	proxy.Freeze()
	defer proxy.Thaw()
	start := time.Now()
	if err := s.Client.Get(ctx, key).Err(); !store.Unavailable(err) {
		t.Fatalf("GET on a frozen Redis: %v", err)
	}
	if d := time.Since(start); d < wait {
		t.Errorf("gave up after %s, want the whole %s after an answer", d, wait)
	}
}

// TestRequestWaitLeavesTheBlockOfAStreamRead: a blocking XREAD may take
// its BLOCK time on a Redis that answers, beyond the request's wait.
func TestRequestWaitLeavesTheBlockOfAStreamRead(t *testing.T) {
	t.Parallel()
	s, _ := storetest.NewFreezable(t)
	ctx, end := store.WithRequestWait(t.Context(), 100*time.Millisecond)
	defer end()
	start := time.Now()
	err := s.Client.XRead(ctx, &redis.XReadArgs{Streams: []string{s.Key("events"), "$"}, Block: 400 * time.Millisecond}).Err()
	if !errors.Is(err, redis.Nil) {
		t.Fatalf("XREAD BLOCK 400ms with nothing new: %v, want redis.Nil", err)
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Errorf("XREAD answered after %s, before its block", d)
	}
}

// TestRequestWaitIgnoresCallerCancel: a request its client gave up on is
// not Redis being unavailable; the rest of the request still reads.
func TestRequestWaitIgnoresCallerCancel(t *testing.T) {
	t.Parallel()
	s, _ := storetest.NewFreezable(t)
	ctx, end := store.WithRequestWait(t.Context(), time.Second)
	defer end()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Client.Get(cancelled, s.Key("k")).Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled GET: %v", err)
	}
	if err := s.Client.Get(ctx, s.Key("k")).Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET after a cancelled one: %v, want redis.Nil", err)
	}
}
