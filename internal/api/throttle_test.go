package api_test

import (
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/throttle"
)

// fakeClock lets a test lift a block without waiting for it.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// throttled serves the API with a limiter allowing 3 wrong keys per
// address, then blocking for a minute, doubling; proxies are trusted.
func throttled(t *testing.T, proxies throttle.Proxies) (*bundle, *fakeClock) {
	t.Helper()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	lim := throttle.New(&throttle.Options{Free: 3, Backoff: time.Minute, MaxBackoff: time.Hour, Now: clock.now})
	b := setup(t, func(o *api.Options) { o.Throttle, o.TrustedProxies = lim, proxies })
	return b, clock
}

// The test server's peer is 127.0.0.1; trusting it lets X-Forwarded-For
// stand for clients at different addresses.
var loopback = throttle.Proxies{netip.MustParsePrefix("127.0.0.1/32")}

func TestWrongKeysAreRateLimited(t *testing.T) {
	t.Parallel()
	b, clock := throttled(t, loopback)
	as := func(addr, key string) reply {
		t.Helper()
		auth := ""
		if key != "" {
			auth = "Bearer " + key
		}
		return b.do(t, "GET", "/v1/connections", "", "", "Authorization", auth, "X-Forwarded-For", addr)
	}
	const attacker, other = "203.0.113.1", "198.51.100.2"

	// No key is no guess: never counted.
	for range 10 {
		if r := as(attacker, ""); r.status != 401 {
			t.Fatalf("no key = %d, want 401", r.status)
		}
	}
	// Three free wrong keys, then the fourth blocks.
	for i := range 4 {
		if r := as(attacker, "guess-"+strconv.Itoa(i)); r.status != 401 {
			t.Fatalf("wrong key %d = %d, want 401", i+1, r.status)
		}
	}
	r := as(attacker, testKey)
	if r.status != 429 || r.json(t)["code"] != "RATE_LIMITED" || r.header.Get("Retry-After") != "60" {
		t.Fatalf("right key while blocked = %d %v %s, want 429 RATE_LIMITED Retry-After 60", r.status, r.header, r.body)
	}
	if r = as(attacker, "guess-5"); r.status != 429 {
		t.Fatalf("wrong key while blocked = %d, want 429", r.status)
	}

	// Another address is unaffected: its right key works, its wrong key
	// is an ordinary 401.
	if r = as(other, testKey); r.status != 200 {
		t.Fatalf("right key from another address = %d %s", r.status, r.body)
	}
	if r = as(other, "guess"); r.status != 401 {
		t.Fatalf("wrong key from another address = %d", r.status)
	}

	// Every authenticated route refuses the blocked address, and says so
	// as openapi.yaml documents.
	for _, rt := range b.routes {
		if !strings.HasPrefix(rt.Path, "/v1/") {
			continue
		}
		path := strings.NewReplacer(":id", "x1", ":name", "x1").Replace(rt.Path)
		if r := b.do(t, rt.Method, path, "application/json", "{}", "X-Forwarded-For", attacker); r.status != 429 {
			t.Errorf("%s %s from a blocked address = %d, want 429", rt.Method, rt.Path, r.status)
		}
	}

	// The block lifts after its backoff: the right key works again.
	clock.add(time.Minute)
	if r = as(attacker, testKey); r.status != 200 {
		t.Fatalf("right key after the backoff = %d %s", r.status, r.body)
	}
	// The count is remembered: the next wrong key blocks for twice as long.
	if r = as(attacker, "guess-6"); r.status != 401 {
		t.Fatalf("wrong key after the backoff = %d", r.status)
	}
	if r = as(attacker, testKey); r.status != 429 || r.header.Get("Retry-After") != "120" {
		t.Fatalf("after another wrong key = %d Retry-After %q, want 429 and 120", r.status, r.header.Get("Retry-After"))
	}
}

// TestForwardedForIsIgnoredFromUntrustedPeers: without trusted proxies a
// guesser cannot dodge the count by making up X-Forwarded-For.
func TestForwardedForIsIgnoredFromUntrustedPeers(t *testing.T) {
	t.Parallel()
	b, _ := throttled(t, nil)
	for i := range 4 {
		r := b.do(t, "GET", "/v1/connections", "", "", "Authorization", "Bearer guess", "X-Forwarded-For", "192.0.2."+strconv.Itoa(i))
		if r.status != 401 {
			t.Fatalf("wrong key %d = %d", i+1, r.status)
		}
	}
	if r := b.do(t, "GET", "/v1/connections", "", "", "X-Forwarded-For", "192.0.2.99"); r.status != 429 {
		t.Fatalf("after four wrong keys under made-up addresses = %d, want 429", r.status)
	}
}
