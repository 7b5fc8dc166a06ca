// Package throttle slows credential guessing: it counts failed attempts
// (a wrong API key, a wrong admin token) per client address and, past a
// few free ones, blocks that address for a backoff that doubles with each
// further failure. Both the JSON API and the admin UI's sign-in use one
// Limiter, so guesses made on either count together.
//
// Only the address is blocked: the right credential keeps working from
// every other address. While an address is blocked every attempt from it
// is refused unchecked, even one with the right credential; answering
// those differently would tell a guesser when a guess was right.
//
// Memory is bounded: entries are forgotten a while after their last
// failure, and when the table is full the entry whose last failure is
// oldest makes room. An attacker holding more addresses than the table has
// room for is beyond what per-address limits can stop.
package throttle

import (
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Options tune a Limiter; zero fields take the defaults below.
type Options struct {
	// Free is how many failures an address may make before backoff
	// starts: people mistype.
	Free int
	// Backoff is the first block; each further failure doubles it.
	Backoff time.Duration
	// MaxBackoff caps the block.
	MaxBackoff time.Duration
	// Forget is how long after its last failure (and after any block has
	// lifted) an address starts again with a clean slate.
	Forget time.Duration
	// MaxEntries bounds the table.
	MaxEntries int
	// Now is the clock; tests pass a fake one.
	Now func() time.Time
}

// Defaults.
const (
	DefaultFree       = 5
	DefaultBackoff    = time.Second
	DefaultMaxBackoff = 5 * time.Minute
	DefaultForget     = 15 * time.Minute
	DefaultMaxEntries = 10000
)

// Limiter counts failures per address. It is safe for concurrent use.
type Limiter struct {
	o       Options
	mu      sync.Mutex
	entries map[string]*entry
}

type entry struct {
	failures int
	last     time.Time // of the last failure
	until    time.Time // blocked before this
}

// New returns a Limiter; o may be nil for the defaults.
func New(o *Options) *Limiter {
	var opts Options
	if o != nil {
		opts = *o
	}
	if opts.Free <= 0 {
		opts.Free = DefaultFree
	}
	if opts.Backoff <= 0 {
		opts.Backoff = DefaultBackoff
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = DefaultMaxBackoff
	}
	if opts.MaxBackoff < opts.Backoff {
		opts.MaxBackoff = opts.Backoff
	}
	if opts.Forget <= 0 {
		opts.Forget = DefaultForget
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Limiter{o: opts, entries: map[string]*entry{}}
}

// Blocked reports how long key is still blocked; 0 means it may try. A
// nil Limiter blocks nothing.
func (l *Limiter) Blocked(key string) time.Duration {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[key]
	if e == nil {
		return 0
	}
	if d := e.until.Sub(l.o.Now()); d > 0 {
		return d
	}
	return 0
}

// Result is what Attempt decided.
type Result struct {
	// Refused is how long key is still blocked when it was refused
	// unchecked; 0 when the check ran.
	Refused time.Duration
	// OK is the check's answer.
	OK bool
	// Blocks is how long this failure blocked key for (0 while it is
	// within its free failures, or on success).
	Blocks time.Duration
}

// Attempt runs check, which reports whether a presented credential is
// right, unless key is blocked, and counts a failure against key. Attempts
// are judged one at a time (check must be quick: a hash and a few
// comparisons), so a burst of parallel guesses cannot all pass the block
// check before the first of their failures counts. A nil Limiter only
// runs check.
func (l *Limiter) Attempt(key string, check func() bool) Result {
	if l == nil {
		return Result{OK: check()}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.entries[key]; e != nil {
		if d := e.until.Sub(l.o.Now()); d > 0 {
			return Result{Refused: d}
		}
	}
	if check() {
		return Result{OK: true}
	}
	return Result{Blocks: l.fail(key)}
}

// Fail records a failed attempt by key and returns how long key is now
// blocked (0 while it is within its free failures).
func (l *Limiter) Fail(key string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fail(key)
}

func (l *Limiter) fail(key string) time.Duration {
	now := l.o.Now()
	e := l.entries[key]
	if e != nil && l.stale(e, now) {
		e = nil
		delete(l.entries, key)
	}
	if e == nil {
		l.makeRoom(now)
		e = &entry{}
		l.entries[key] = e
	}
	e.failures++
	e.last = now
	over := e.failures - l.o.Free
	if over <= 0 {
		return 0
	}
	d := l.o.Backoff
	for i := 1; i < over && d < l.o.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, l.o.MaxBackoff)
	e.until = now.Add(d)
	return d
}

// Len is the number of addresses held, for tests and metrics.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}

// stale reports whether e may be forgotten: no block in force and no
// failure for Forget.
func (l *Limiter) stale(e *entry, now time.Time) bool {
	return !now.Before(e.until) && now.Sub(e.last) >= l.o.Forget
}

// makeRoom drops stale entries when the table is full and, if none was
// stale, the one whose last failure is oldest. The sweep is linear, but it
// runs only when the table is full.
func (l *Limiter) makeRoom(now time.Time) {
	if len(l.entries) < l.o.MaxEntries {
		return
	}
	var oldest string
	var oldestAt time.Time
	for k, e := range l.entries {
		if l.stale(e, now) {
			delete(l.entries, k)
			continue
		}
		if oldest == "" || e.last.Before(oldestAt) {
			oldest, oldestAt = k, e.last
		}
	}
	if len(l.entries) >= l.o.MaxEntries {
		delete(l.entries, oldest)
	}
}

// Proxies are the networks of the reverse proxies trusted to say, in
// X-Forwarded-For, whom they forward for. Without any, the client is
// always the TCP peer: a header anyone can send must not pick the address
// a guess is counted against.
type Proxies []netip.Prefix

// Client is the address of r's client: the TCP peer, or, when the peer
// is a trusted proxy, the nearest address in X-Forwarded-For that is not
// itself a trusted proxy (read from the right, since each proxy appends
// and only the entries our own proxies added can be believed).
func (p Proxies) Client(r *http.Request) netip.Addr {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		// Not an address (a unix socket, a test's made-up peer): one key
		// for all such clients.
		return netip.Addr{}
	}
	addr := peer.Addr().Unmap()
	if !p.trusted(addr) {
		return addr
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			// A hop our proxies did not write: stop at the last one we
			// could trust.
			return addr
		}
		addr = hop.Unmap()
		if !p.trusted(addr) {
			return addr
		}
	}
	return addr
}

// IP is Client as text, for logs (and echo's IPExtractor); a peer that is
// not an IP address is given as it is.
func (p Proxies) IP(r *http.Request) string {
	if a := p.Client(r); a.IsValid() {
		return a.String()
	}
	return r.RemoteAddr
}

func (p Proxies) trusted(a netip.Addr) bool {
	for _, n := range p {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// Key is the Limiter key of r's client. An IPv6 client is counted by its
// /64: one subscriber usually holds a whole /64, and counting its single
// addresses would give it 2^64 tries.
func (p Proxies) Key(r *http.Request) string { return AddrKey(p.Client(r)) }

// AddrKey is the key a client address is counted under: the address, or
// for IPv6 its /64.
func AddrKey(a netip.Addr) string {
	if !a.IsValid() {
		return "unknown"
	}
	if a.Is6() {
		return netip.PrefixFrom(a, 64).Masked().String()
	}
	return a.String()
}

// Trusted reports whether a is one of the proxies.
func (p Proxies) Trusted(a netip.Addr) bool { return p.trusted(a.Unmap()) }

// RetryAfter is d in whole seconds, rounded up, at least 1: the value of a
// Retry-After header.
func RetryAfter(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}
