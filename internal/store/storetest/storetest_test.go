package storetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/store"
)

func TestNewPrefixAndCleanup(t *testing.T) {
	t.Parallel()
	var prefix string
	var s *store.Store
	t.Run("inner", func(t *testing.T) {
		s = New(t)
		prefix = s.Prefix
		if !strings.HasPrefix(prefix, "pbtest:") || !strings.HasSuffix(prefix, ":") || len(prefix) != len("pbtest:")+16+1 {
			t.Errorf("prefix = %q", prefix)
		}
		if other := New(t); other.Prefix == prefix {
			t.Errorf("two stores share prefix %q", prefix)
		}
		ctx := t.Context()
		for i := range 1200 { // more than one SCAN page
			if err := s.Client.Set(ctx, s.Key("k", fmt.Sprint(i)), "v", 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	})
	// The inner test's cleanup deleted the keys and closed the store.
	if err := s.Ping(context.Background()); err == nil {
		t.Error("store still open after its test ended")
	}
	// Check on a fresh connection to the same server (the embedded one is
	// gone with its store, so only the real server can be checked).
	if url := URL(t); url != "" {
		check, err := store.Open(context.Background(), url, prefix, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer check.Close()
		keys, err := check.Client.Keys(context.Background(), prefix+"*").Result()
		if err != nil || len(keys) != 0 {
			t.Errorf("left %d keys under %s (err %v)", len(keys), prefix, err)
		}
	}
}

func TestDeletePrefixKeepsOthers(t *testing.T) {
	t.Parallel()
	s := NewEmbedded(t)
	ctx := t.Context()
	mr := s.Miniredis()
	mr.Set("other:key", "x")
	mr.Set(s.Key("a"), "x")
	mr.Set(s.Key("b", "{tag}", "c"), "x")
	if err := DeletePrefix(ctx, s); err != nil {
		t.Fatal(err)
	}
	if keys := mr.Keys(); len(keys) != 1 || keys[0] != "other:key" {
		t.Errorf("keys left = %q", keys)
	}
}

func TestEach(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	ran := map[string]bool{}
	Each(t, func(t *testing.T, s *store.Store) {
		t.Parallel()
		mu.Lock()
		ran[t.Name()[strings.LastIndex(t.Name(), "/")+1:]] = s.Embedded()
		mu.Unlock()
		if err := s.Client.Set(t.Context(), s.Key("x"), "1", 0).Err(); err != nil {
			t.Fatal(err)
		}
	})
	t.Cleanup(func() {
		if embedded, ok := ran["miniredis"]; !ok || !embedded {
			t.Errorf("miniredis subtest: ran=%v", ran)
		}
		if _, ok := ran["redis"]; ok != (URL(t) != "") {
			t.Errorf("redis subtest ran = %v with %s=%q", ok, EnvURL, URL(t))
		}
		if embedded, ok := ran["redis"]; ok && embedded {
			t.Error("redis subtest ran on the embedded store")
		}
	})
}

// fakeTB records Fatal instead of stopping the goroutine.
type fakeTB struct {
	testing.TB
	fatal string
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Fatal(args ...any) { f.fatal = fmt.Sprint(args...) }

// Not parallel: it sets environment variables.
func TestURLRequiredInCI(t *testing.T) {
	for _, tt := range []struct {
		ci, url, fatal string
	}{
		{"true", "", "CI requires PATCHBAY_TEST_REDIS_URL"},
		{"true", "redis://h:1", ""},
		{"", "", ""},
		{"false", "", ""},
	} {
		t.Setenv("CI", tt.ci)
		t.Setenv(EnvURL, tt.url)
		f := &fakeTB{TB: t}
		if got := URL(f); got != tt.url || f.fatal != tt.fatal {
			t.Errorf("CI=%q url=%q: URL = %q, fatal = %q, want fatal %q", tt.ci, tt.url, got, f.fatal, tt.fatal)
		}
	}
}
