package pools

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// model is the reference the property test compares Redis against.
type model struct {
	max            int
	reclaim, wttl  int64 // ms
	now            int64 // ms; only meaningful with controlled time
	timed          bool
	leases         map[string]*mLease
	queue          []string // tickets in arrival order
	seen           map[string]int64
	lastToken      int64
	grantedTickets []string // in grant order
	arrival        []string // in arrival order (each enqueue)
	holders        map[string]string
}

type mLease struct {
	holder  string
	slot    int
	token   int64
	renewed int64
}

func (m *model) sweep() {
	if !m.timed {
		return
	}
	for id, l := range m.leases {
		if m.now-l.renewed >= m.reclaim {
			delete(m.leases, id)
		}
	}
	m.queue = slices.DeleteFunc(m.queue, func(t string) bool {
		if m.now-m.seen[t] >= m.wttl {
			delete(m.seen, t)
			return true
		}
		return false
	})
}

func (m *model) freeSlot() int {
	used := map[int]bool{}
	for _, l := range m.leases {
		used[l.slot] = true
	}
	for i := range m.max {
		if !used[i] {
			return i
		}
	}
	return -1
}

// pre is what every script does first: reclaim, drop dead waiters, serve.
func (m *model) pre() {
	m.sweep()
	m.serve()
}

// serve grants free slots to the head of the queue, one by one.
func (m *model) serve() {
	for len(m.leases) < m.max && len(m.queue) > 0 {
		head := m.queue[0]
		m.lastToken++
		m.leases[head] = &mLease{holder: m.holders[head], slot: m.freeSlot(), token: m.lastToken,
			renewed: min(m.now, m.now-m.reclaim+m.wttl)}
		m.queue = m.queue[1:]
		delete(m.seen, head)
		m.grantedTickets = append(m.grantedTickets, head)
	}
}

// poll predicts the acquire script: "granted", "waiting" or "gone".
func (m *model) poll(ticket, holder string, enqueue bool) string {
	m.pre()
	_, leased := m.leases[ticket]
	if !leased && !slices.Contains(m.queue, ticket) {
		if !enqueue {
			return "gone"
		}
		m.queue = append(m.queue, ticket)
		m.arrival = append(m.arrival, ticket)
		m.holders[ticket] = holder
		m.seen[ticket] = m.now
		m.serve()
	}
	if l, ok := m.leases[ticket]; ok {
		l.renewed = m.now // picked up
		return "granted"
	}
	m.seen[ticket] = m.now
	return "waiting"
}

func (m *model) live(l *Lease) bool {
	m.pre()
	ml, ok := m.leases[l.ID]
	return ok && ml.token == l.Token
}

// TestLeaseProperties runs random sequences of enqueue, poll, cancel, renew,
// release, check, status and (on miniredis) time advances against a model,
// and checks the invariants on the Redis state after every step.
func TestLeaseProperties(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		t.Parallel()
		seeds := 30
		steps := 150
		if s.Miniredis() == nil {
			seeds = 6
		}
		for seed := range seeds {
			embedded := s.Miniredis() != nil
			t.Run(strconv.Itoa(seed), func(t *testing.T) {
				st := s
				if embedded {
					// Time is per server: each seed gets a server of
					// its own so seeds can run in parallel.
					t.Parallel()
					st = storetest.NewEmbedded(t)
				}
				runMachine(t, st, uint64(seed), steps)
			})
		}
	})
}

func runMachine(t *testing.T, s *store.Store, seed uint64, steps int) {
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(seed, 7))
	mr := s.Miniredis()
	timed := mr != nil
	max := 1 + rng.IntN(4)
	opts := &Options{ReclaimAfter: 2 * time.Minute, WaiterTTL: 10 * time.Second}
	if !timed {
		// Real time passes unpredictably: keep every window out of reach.
		opts = &Options{ReclaimAfter: time.Hour, WaiterTTL: time.Hour}
	}
	p, err := New(s, fmt.Sprintf("prop%d", seed), max, opts)
	if err != nil {
		t.Fatal(err)
	}
	m := &model{
		max: max, reclaim: opts.ReclaimAfter.Milliseconds(), wttl: opts.WaiterTTL.Milliseconds(),
		timed: timed, leases: map[string]*mLease{}, seen: map[string]int64{}, holders: map[string]string{},
	}
	if timed {
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		mr.SetTime(start)
		m.now = start.UnixMilli()
	}
	var (
		held    []*Lease // every lease ever granted, live or stale
		tickets []string // every ticket ever used
		holders = map[string]string{}
		tokens  = map[string]int64{}
		log     []string
	)
	fail := func(format string, a ...any) {
		t.Helper()
		t.Fatalf("seed %d, after steps:\n  %s\n%s", seed, joinLines(log), fmt.Sprintf(format, a...))
	}
	checkPoll := func(ticket string, enqueue bool) {
		t.Helper()
		want := m.poll(ticket, holders[ticket], enqueue)
		r, err := p.poll(ctx, ticket, holders[ticket], enqueue)
		if err != nil {
			t.Fatal(err)
		}
		got := "waiting"
		switch {
		case r.lease != nil:
			got = "granted"
		case r.gone:
			got = "gone"
		}
		if got != want {
			fail("poll %s: got %s, model %s", ticket, got, want)
		}
		if r.lease == nil {
			return
		}
		ml := m.leases[ticket]
		if r.lease.Token != ml.token || r.lease.Slot != ml.slot || r.lease.Holder != ml.holder || r.lease.ID != ticket {
			fail("lease %+v, model %+v", r.lease, ml)
		}
		if _, ok := tokens[ticket]; !ok {
			held = append(held, r.lease)
		}
		tokens[ticket] = r.lease.Token
		// Fencing tokens strictly increase in grant order (which the
		// FIFO invariant ties to arrival order).
		var last int64
		for _, tk := range m.grantedTickets {
			if tok, ok := tokens[tk]; ok {
				if tok <= last {
					fail("token %d of %s not above %d", tok, tk, last)
				}
				last = tok
			}
		}
	}
	for step := range steps {
		var what string
		switch op := rng.IntN(100); {
		case op < 25: // a new waiter arrives
			ticket := fmt.Sprintf("t%d", len(tickets))
			tickets = append(tickets, ticket)
			holders[ticket] = fmt.Sprintf("exec%d", rng.IntN(5))
			what = "enqueue " + ticket
			checkPoll(ticket, true)
		case op < 45 && len(tickets) > 0: // a waiter polls (maybe one dropped or served)
			ticket := tickets[rng.IntN(len(tickets))]
			what = "poll " + ticket
			checkPoll(ticket, false)
		case op < 50 && len(tickets) > 0: // a waiter gives up
			ticket := tickets[rng.IntN(len(tickets))]
			what = "cancel " + ticket
			p.cancel(ticket)
			m.pre()
			m.queue = slices.DeleteFunc(m.queue, func(x string) bool { return x == ticket })
			delete(m.seen, ticket)
			delete(m.leases, ticket)
			m.serve()
		case op < 85 && len(held) > 0: // renew, release or check a lease, maybe stale
			l := held[rng.IntN(len(held))]
			live := m.live(l)
			var err error
			switch k := rng.IntN(3); k {
			case 0:
				what = "renew " + l.ID
				err = p.Renew(ctx, l)
				if live {
					m.leases[l.ID].renewed = m.now
				}
			case 1:
				what = "release " + l.ID
				err = p.Release(ctx, l)
				if live {
					delete(m.leases, l.ID)
					m.serve()
				}
				live = true // release of a gone lease is a no-op
			default:
				what = "check " + l.ID
				err = p.Check(ctx, l)
			}
			if err == nil && rng.IntN(2) == 0 {
				// The same lease with an older token is always refused.
				forged := *l
				forged.Token = l.Token - 1 - int64(rng.IntN(3))
				for _, f := range []func(context.Context, *Lease) error{p.Check, p.Renew} {
					if err := f(ctx, &forged); !errors.Is(err, ErrStaleLease) {
						fail("%s with older token %d: %v", what, forged.Token, err)
					}
				}
			}
			if live && err != nil || !live && !errors.Is(err, ErrStaleLease) {
				fail("%s: err %v, model live %v", what, err, live)
			}
		case op < 95 && timed: // time passes
			d := time.Duration(rng.IntN(20_000)) * time.Millisecond
			if rng.IntN(4) == 0 {
				d = opts.ReclaimAfter - time.Second + time.Duration(rng.IntN(2_000))*time.Millisecond
			}
			if len(m.leases) > 0 && rng.IntN(3) == 0 {
				// Land right on one lease's window edge (or a ms either side).
				ids := slices.Sorted(maps.Keys(m.leases))
				edge := m.leases[ids[rng.IntN(len(ids))]].renewed + m.reclaim + int64(rng.IntN(3)-1)
				if edge > m.now {
					d = time.Duration(edge-m.now) * time.Millisecond
				}
			}
			what = "advance " + d.String()
			m.now += d.Milliseconds()
			mr.SetTime(time.UnixMilli(m.now))
		default:
			what = "status"
			u, err := p.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			m.pre()
			if u.Max != max || u.Leased != len(m.leases) || u.Queued != len(m.queue) {
				fail("status %+v, model leased %d queued %d", u, len(m.leases), len(m.queue))
			}
			var got, want []string
			for _, l := range u.Leases {
				got = append(got, l.Holder+"@"+strconv.Itoa(l.Slot))
				if l.Age < 0 || l.SinceRenew < 0 || l.SinceRenew > l.Age {
					fail("status lease %+v", l)
				}
			}
			for _, l := range m.leases {
				want = append(want, l.holder+"@"+strconv.Itoa(l.slot))
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				fail("status leases %v, model %v", got, want)
			}
		}
		log = append(log, fmt.Sprintf("%d %s", step, what))
		checkInvariants(t, p, m, fail)
	}
}

// checkInvariants reads the raw Redis state: at most max leases, one lease
// per slot and one slot per lease, and grants in arrival order.
func checkInvariants(t *testing.T, p *Pool, m *model, fail func(string, ...any)) {
	t.Helper()
	ctx := t.Context()
	c := p.st.Client
	slotsH, err := c.HGetAll(ctx, p.keys[2]).Result()
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.ZCard(ctx, p.keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(slotsH) > m.max || int(n) > m.max {
		fail("%d slots taken, %d leases, max %d", len(slotsH), n, m.max)
	}
	seen := map[string]bool{}
	for slot, id := range slotsH {
		if i, err := strconv.Atoi(slot); err != nil || i < 0 || i >= m.max {
			fail("slot %q out of range", slot)
		}
		if seen[id] {
			fail("lease %s holds two slots", id)
		}
		seen[id] = true
	}
	// FIFO: tickets are granted in the order they (last) arrived, among
	// those that were granted at all.
	pos := map[string]int{}
	for i, tk := range m.arrival {
		pos[tk] = i
	}
	for i := 1; i < len(m.grantedTickets); i++ {
		if pos[m.grantedTickets[i]] < pos[m.grantedTickets[i-1]] {
			fail("granted %s before %s, which arrived first", m.grantedTickets[i-1], m.grantedTickets[i])
		}
	}
}

func joinLines(s []string) string {
	if len(s) > 40 {
		s = s[len(s)-40:]
	}
	out := ""
	for _, l := range s {
		out += l + "\n  "
	}
	return out
}

func newPool(t *testing.T, s *store.Store, max int, opts *Options) *Pool {
	t.Helper()
	p, err := New(s, "browsers", max, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAcquireConcurrent has many goroutines, on two Pool values (as two
// replicas would), take and give back leases; no slot ever has two holders
// and never more than max are held.
func TestAcquireConcurrent(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		t.Parallel()
		const max = 3
		a, b := newPool(t, s, max, nil), newPool(t, s, max, nil)
		var (
			mu      sync.Mutex
			bySlot  = map[int]string{}
			granted int
			wg      sync.WaitGroup
		)
		for g := range 16 {
			wg.Go(func() {
				p := a
				if g%2 == 1 {
					p = b
				}
				for range 5 {
					l, err := p.Acquire(t.Context(), fmt.Sprintf("exec%d", g), 10*time.Second)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if h, ok := bySlot[l.Slot]; ok {
						t.Errorf("slot %d held by %s and %s", l.Slot, h, l.Holder)
					}
					bySlot[l.Slot] = l.Holder
					if len(bySlot) > max {
						t.Errorf("%d leases held, max %d", len(bySlot), max)
					}
					granted++
					mu.Unlock()
					if err := p.Check(t.Context(), l); err != nil {
						t.Error(err)
					}
					time.Sleep(time.Millisecond)
					mu.Lock()
					delete(bySlot, l.Slot)
					mu.Unlock()
					if err := p.Release(t.Context(), l); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if granted != 80 {
			t.Errorf("granted %d, want 80", granted)
		}
		u, err := a.Status(t.Context())
		if err != nil || u.Leased != 0 || u.Queued != 0 {
			t.Errorf("status after all released: %+v, %v", u, err)
		}
	})
}

// TestAcquireFIFO queues waiters one after another on a full pool and
// checks they are served in that order as slots free up.
func TestAcquireFIFO(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		t.Parallel()
		a, b := newPool(t, s, 1, nil), newPool(t, s, 1, nil)
		first, err := a.Acquire(t.Context(), "first", time.Second)
		if err != nil {
			t.Fatal(err)
		}
		order := make(chan string, 6)
		var wg sync.WaitGroup
		defer wg.Wait()
		for i := range 6 {
			p := a
			if i%2 == 1 {
				p = b
			}
			wg.Go(func() {
				l, err := p.Acquire(t.Context(), fmt.Sprintf("w%d", i), 10*time.Second)
				if err != nil {
					t.Error(err)
					order <- "error"
					return
				}
				order <- l.Holder
				time.Sleep(2 * time.Millisecond)
				if err := p.Release(t.Context(), l); err != nil {
					t.Error(err)
				}
			})
			waitQueued(t, a, i+1)
		}
		if err := a.Release(t.Context(), first); err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			if got := <-order; got != fmt.Sprintf("w%d", i) {
				t.Fatalf("served %s as number %d", got, i)
			}
		}
	})
}

func waitQueued(t *testing.T, p *Pool, n int) {
	t.Helper()
	for range 2500 {
		u, err := p.Status(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if u.Queued == n {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("queue never reached %d", n)
}

func TestAcquireTimeoutLeavesQueue(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, s *store.Store) {
		t.Parallel()
		p := newPool(t, s, 1, nil)
		if _, err := p.Acquire(t.Context(), "a", 0); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := p.Acquire(t.Context(), "b", 50*time.Millisecond)
		var pe *Error
		if !errors.Is(err, ErrLeaseTimeout) || !errors.As(err, &pe) || pe.Code != "lease_timeout" {
			t.Fatalf("err = %v, want lease_timeout", err)
		}
		if el := time.Since(start); el < 50*time.Millisecond || el > 5*time.Second {
			t.Errorf("timed out after %v", el)
		}
		u, err := p.Status(t.Context())
		if err != nil || u.Leased != 1 || u.Queued != 0 || u.Leases[0].Holder != "a" {
			t.Errorf("status %+v, %v", u, err)
		}
	})
}

// TestReclaim uses controlled time: a lease renewed within the window
// stays the same lease; one left alone for the window is reclaimed, the
// next waiter is served with a newer token and the old holder is fenced.
func TestReclaim(t *testing.T) {
	t.Parallel()
	s := storetest.NewEmbedded(t)
	mr := s.Miniredis()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mr.SetTime(now)
	p := newPool(t, s, 1, nil)
	ctx := t.Context()
	old, err := p.Acquire(ctx, "exec1", 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 { // 10 × 100 s, renewed every time: still the same lease
		now = now.Add(100 * time.Second)
		mr.SetTime(now)
		if err := p.Renew(ctx, old); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Check(ctx, old); err != nil {
		t.Fatal(err)
	}
	u, _ := p.Status(ctx)
	if u.Leased != 1 || u.Leases[0].Age != 1000*time.Second || u.Leases[0].SinceRenew != 0 {
		t.Errorf("status %+v", u)
	}
	if _, err := p.Acquire(ctx, "exec2", 0); !errors.Is(err, ErrLeaseTimeout) {
		t.Fatalf("second acquire on a full pool: %v", err)
	}
	now = now.Add(DefaultReclaimAfter - time.Millisecond)
	mr.SetTime(now)
	if err := p.Check(ctx, old); err != nil {
		t.Fatalf("just inside the window: %v", err)
	}
	now = now.Add(time.Millisecond)
	mr.SetTime(now)
	next, err := p.Acquire(ctx, "exec2", 0)
	if err != nil {
		t.Fatalf("after the window: %v", err)
	}
	if next.Token <= old.Token || next.Slot != old.Slot {
		t.Errorf("next %+v, old %+v", next, old)
	}
	for _, f := range []func() error{
		func() error { return p.Check(ctx, old) },
		func() error { return p.Renew(ctx, old) },
	} {
		if err := f(); !errors.Is(err, ErrStaleLease) {
			t.Errorf("stale lease: %v", err)
		}
	}
	if err := p.Release(ctx, old); err != nil {
		t.Errorf("release of a reclaimed lease: %v", err)
	}
	if err := p.Check(ctx, next); err != nil {
		t.Errorf("the stale release touched the new lease: %v", err)
	}
}

// TestReclaimWindowConfigurable checks Options.ReclaimAfter is honoured.
func TestReclaimWindowConfigurable(t *testing.T) {
	t.Parallel()
	s := storetest.NewEmbedded(t)
	mr := s.Miniredis()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	mr.SetTime(now)
	p := newPool(t, s, 1, &Options{ReclaimAfter: 5 * time.Second})
	l, err := p.Acquire(t.Context(), "x", 0)
	if err != nil {
		t.Fatal(err)
	}
	mr.SetTime(now.Add(5 * time.Second))
	if err := p.Check(t.Context(), l); !errors.Is(err, ErrStaleLease) {
		t.Errorf("after 5 s: %v", err)
	}
}

func TestNewInvalid(t *testing.T) {
	t.Parallel()
	s := storetest.NewEmbedded(t)
	for _, tc := range []struct {
		name string
		max  int
	}{{"", 1}, {"a", 0}, {"a{b}", 1}} {
		if _, err := New(s, tc.name, tc.max, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%q, %d) = %v", tc.name, tc.max, err)
		}
	}
	p := newPool(t, s, 1, nil)
	if _, err := p.Acquire(t.Context(), "", 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty holder: %v", err)
	}
}
