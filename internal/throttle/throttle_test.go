package throttle

import (
	"fmt"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// clock is a fake time source the tests move by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func setup(t *testing.T, o Options) (*Limiter, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	o.Now = c.now
	return New(&o), c
}

func TestBackoffDoublesAndCaps(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, Options{Free: 2, Backoff: time.Second, MaxBackoff: 5 * time.Second})
	want := []time.Duration{0, 0, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i, w := range want {
		if got := l.Fail("a"); got != w {
			t.Fatalf("failure %d: blocked %v, want %v", i+1, got, w)
		}
	}
}

func TestBlockLiftsAndOthersAreUnaffected(t *testing.T) {
	t.Parallel()
	l, c := setup(t, Options{Free: 1, Backoff: 10 * time.Second})
	l.Fail("a")
	l.Fail("a")
	if d := l.Blocked("a"); d != 10*time.Second {
		t.Fatalf("a blocked %v, want 10s", d)
	}
	if d := l.Blocked("b"); d != 0 {
		t.Fatalf("b blocked %v, want 0", d)
	}
	c.add(10 * time.Second)
	if d := l.Blocked("a"); d != 0 {
		t.Fatalf("after the backoff a is still blocked for %v", d)
	}
	// The count is remembered: the next failure blocks again, longer.
	if d := l.Fail("a"); d != 20*time.Second {
		t.Fatalf("next failure blocks %v, want 20s", d)
	}
}

func TestForgottenAfterQuiet(t *testing.T) {
	t.Parallel()
	l, c := setup(t, Options{Free: 1, Backoff: time.Second, Forget: time.Minute})
	l.Fail("a")
	l.Fail("a")
	c.add(time.Minute)
	if d := l.Fail("a"); d != 0 {
		t.Fatalf("after a quiet minute the first failure blocks %v, want 0 (a clean slate)", d)
	}
}

func TestTableIsBounded(t *testing.T) {
	t.Parallel()
	l, c := setup(t, Options{MaxEntries: 100})
	for i := range 1000 {
		l.Fail(fmt.Sprint(i))
		c.add(time.Millisecond)
	}
	if n := l.Len(); n > 100 {
		t.Fatalf("%d entries held, want at most 100", n)
	}
	// The newest survive: the oldest made room.
	for i := 0; i < 6; i++ {
		l.Fail("999")
	}
	if l.Blocked("999") == 0 {
		t.Fatal("the newest address lost its count")
	}
}

func TestClient(t *testing.T) {
	t.Parallel()
	proxies := Proxies{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	tests := []struct {
		name    string
		proxies Proxies
		remote  string
		xff     []string
		want    string
	}{
		{"peer", nil, "203.0.113.5:4000", nil, "203.0.113.5"},
		{"untrusted peer's header ignored", nil, "203.0.113.5:4000", []string{"198.51.100.1"}, "203.0.113.5"},
		{"header of a proxy not in the list ignored", proxies, "203.0.113.5:4000", []string{"198.51.100.1"}, "203.0.113.5"},
		{"trusted proxy", proxies, "10.1.2.3:4000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"rightmost untrusted hop", proxies, "10.1.2.3:4000", []string{"1.1.1.1, 198.51.100.1, 10.9.9.9"}, "198.51.100.1"},
		{"several header lines", proxies, "10.1.2.3:4000", []string{"1.1.1.1", "198.51.100.1"}, "198.51.100.1"},
		{"garbage stops at the proxy", proxies, "10.1.2.3:4000", []string{"nonsense"}, "10.1.2.3"},
		{"no header from the proxy", proxies, "10.1.2.3:4000", nil, "10.1.2.3"},
		{"mapped v4", nil, "[::ffff:203.0.113.5]:4000", nil, "203.0.113.5"},
		{"ipv6 peer", nil, "[2001:db8::1]:4000", nil, "2001:db8::1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := tt.proxies.Client(r).String(); got != tt.want {
				t.Fatalf("Client = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestKeyGroupsIPv6By64(t *testing.T) {
	t.Parallel()
	key := func(remote string) string {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		return Proxies(nil).Key(r)
	}
	if a, b := key("[2001:db8:1:2::1]:1"), key("[2001:db8:1:2:ffff::9]:2"); a != b {
		t.Fatalf("one /64 gave two keys: %s, %s", a, b)
	}
	if a, b := key("[2001:db8:1:2::1]:1"), key("[2001:db8:1:3::1]:1"); a == b {
		t.Fatalf("two /64s gave one key: %s", a)
	}
	if got := key("192.0.2.7:1"); got != "192.0.2.7" {
		t.Fatalf("v4 key %s", got)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int{0: 1, time.Millisecond: 1, time.Second: 1, 1500 * time.Millisecond: 2, time.Minute: 60} {
		if got := RetryAfter(d); got != want {
			t.Errorf("RetryAfter(%v) = %d, want %d", d, got, want)
		}
	}
}

// TestParallelGuessesCountOneByOne: a burst of parallel wrong guesses is
// checked no further than the free failures and the one that blocks.
func TestParallelGuessesCountOneByOne(t *testing.T) {
	t.Parallel()
	l, _ := setup(t, Options{Free: 3, Backoff: time.Minute})
	var mu sync.Mutex
	checked, refused := 0, 0
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			res := l.Attempt("a", func() bool {
				mu.Lock()
				checked++
				mu.Unlock()
				return false
			})
			if res.Refused > 0 {
				mu.Lock()
				refused++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if checked != 4 || refused != 96 {
		t.Fatalf("checked %d, refused %d; want 4 and 96", checked, refused)
	}
	if res := l.Attempt("b", func() bool { return true }); !res.OK || res.Refused != 0 {
		t.Fatalf("another key's right credential: %+v", res)
	}
}
