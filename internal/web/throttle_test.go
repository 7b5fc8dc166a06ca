package web_test

import (
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/throttle"
	"github.com/patchbay-dev/patchbay/internal/web"
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

// TestFailedSignInsAreRateLimited: three wrong tokens are free, the fourth
// blocks the address for a minute; the right token works from another
// address meanwhile, and from the blocked one once the block lifts.
func TestFailedSignInsAreRateLimited(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	lim := throttle.New(&throttle.Options{Free: 3, Backoff: time.Minute, Now: clock.now})
	// The test server's peer is 127.0.0.1; trusting it lets
	// X-Forwarded-For stand for clients at different addresses.
	b := setupWith(t, func(o *web.Options) {
		o.Throttle, o.TrustedProxies = lim, throttle.Proxies{netip.MustParsePrefix("127.0.0.1/32")}
	})
	attempt := func(addr, token string) page {
		t.Helper()
		c := newClient(t, b.url)
		c.get("/admin/sign-in")
		return c.do(http.MethodPost, "/admin/sign-in", url.Values{"_csrf": {c.csrf}, "token": {token}, "next": {"/admin"}}, "X-Forwarded-For", addr)
	}
	const attacker, other = "203.0.113.1", "198.51.100.2"

	for i := range 4 {
		if p := attempt(attacker, "guess"); p.status != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i+1, p.status)
		}
	}
	p := attempt(attacker, adminToken)
	if p.status != http.StatusTooManyRequests || p.header.Get("Retry-After") != "60" {
		t.Fatalf("right token while blocked: %d Retry-After %q, want 429 and 60", p.status, p.header.Get("Retry-After"))
	}
	if got := text(p.doc.Find("#signin-error")); !strings.Contains(got, "Too many failed sign-ins") || !strings.Contains(got, "60 seconds") {
		t.Fatalf("blocked page says %q", got)
	}
	if p.doc.Find(`form[action="/admin/sign-in"] input[name="_csrf"]`).Length() != 1 {
		t.Fatal("the blocked page has no sign-in form to try again with")
	}

	if p := attempt(other, adminToken); p.status != http.StatusSeeOther {
		t.Fatalf("right token from another address: %d, want 303", p.status)
	}

	clock.add(time.Minute)
	if p := attempt(attacker, adminToken); p.status != http.StatusSeeOther || p.header.Get("Location") != "/admin" {
		t.Fatalf("right token after the backoff: %d %q", p.status, p.header.Get("Location"))
	}
}
