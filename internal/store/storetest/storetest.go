// Package storetest gives tests a *store.Store of their own: on an embedded
// miniredis by default, on a real Redis when PATCHBAY_TEST_REDIS_URL is set.
// Every store gets a fresh key prefix (pbtest:<random>:) whose keys are
// deleted when the test ends, so tests can run in parallel on one server.
//
// In CI (CI=true) a real Redis is required: New and Each fail the test when
// PATCHBAY_TEST_REDIS_URL is empty, so nothing that needs the real server is
// silently skipped there.
//
// For faults it also starts what a test breaks: a FreezeProxy (a Redis that
// stops answering), and a Redis Cluster or a Sentinel setup of redis-server
// processes on loopback whose masters a test may kill (servers.go; they
// need Debian's redis-server and redis-cli, and fail the test under CI=true
// without them).
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/store"
)

// EnvURL names the variable holding the real Redis to test against.
const EnvURL = "PATCHBAY_TEST_REDIS_URL"

// URL returns the real Redis to test against, or "" for none. In CI it
// fails t when none is set.
func URL(t testing.TB) string {
	t.Helper()
	url := os.Getenv(EnvURL)
	if url == "" && os.Getenv("CI") == "true" {
		t.Fatal("CI requires " + EnvURL)
	}
	return url
}

// New returns a store with its own prefix, on the real Redis when
// PATCHBAY_TEST_REDIS_URL is set and on a fresh miniredis otherwise.
func New(t testing.TB) *store.Store {
	t.Helper()
	return open(t, URL(t))
}

// NewEmbedded returns a store on a fresh miniredis whatever the
// environment, for tests of behaviour only miniredis offers (FastForward).
func NewEmbedded(t testing.TB) *store.Store {
	t.Helper()
	return open(t, "")
}

// Each runs fn as subtest "miniredis" and, when PATCHBAY_TEST_REDIS_URL is
// set, again as subtest "redis", each with a store of its own. fn may call
// t.Parallel.
func Each(t *testing.T, fn func(t *testing.T, s *store.Store)) {
	t.Helper()
	url := URL(t)
	t.Run("miniredis", func(t *testing.T) { fn(t, open(t, "")) })
	if url != "" {
		t.Run("redis", func(t *testing.T) { fn(t, open(t, url)) })
	}
}

// Prefix returns a new unique test prefix.
func Prefix() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "pbtest:" + hex.EncodeToString(b) + ":"
}

func open(t testing.TB, url string) *store.Store {
	t.Helper()
	// Open's warnings (embedded store, durability) would repeat in every
	// test; the store tests check them directly.
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := store.Open(ctx, url, Prefix(), logger)
	if err != nil {
		t.Fatalf("storetest: %v", err)
	}
	t.Cleanup(func() {
		// t.Context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := DeletePrefix(ctx, s); err != nil {
			t.Errorf("storetest: delete keys under %s: %v", s.Prefix, err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("storetest: close: %v", err)
		}
	})
	return s
}

// DeletePrefix deletes every key under s.Prefix (on every master of a
// cluster). The prefix must hold no glob characters; test prefixes don't.
func DeletePrefix(ctx context.Context, s *store.Store) error {
	if s.Prefix == "" {
		panic("storetest: refusing to delete every key (empty prefix)")
	}
	if cc, ok := s.Client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var first error
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			if err := deleteOn(ctx, c, s.Prefix); err != nil {
				mu.Lock()
				first = cmpErr(first, err)
				mu.Unlock()
			}
			return nil
		})
		return cmpErr(first, err)
	}
	return deleteOn(ctx, s.Client, s.Prefix)
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func deleteOn(ctx context.Context, c redis.Cmdable, prefix string) error {
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"*", 500).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			// One DEL per key: keys of different hash slots cannot share
			// a DEL on a cluster node.
			_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Del(ctx, k)
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}
