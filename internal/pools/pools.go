// Package pools owns the lease core of pooled connections: a Pool of max
// slots kept in Redis, shared by every replica, that hands each holder (an
// execution or one parallel path) a Lease of its own, queues waiters
// first-in first-out across replicas while the pool is full, takes back
// leases that are not renewed within the reclaim window, and fences every
// lease with a token so that a holder whose lease was reclaimed is refused.
//
// Provider (provider.go) puts a connection behind every lease: it is the
// connect.Leaser of a pooled connection, provisioning a fresh connection
// per lease (cmd/server gives it a function that starts a new MCP server)
// with setup values checked against the pool's setup schema, fencing every
// call with the lease's token, and closing the connection when the lease
// is released or reclaimed. It renews a lease while its server starts, and
// records each connection's process tree in Redis so that what a crashed
// holder left on a host is ended by the next replica on that host to
// sweep (trees.go).
//
// # Model
//
// A pool has slots 0..max-1. A lease holds one slot; a slot has at most one
// lease. Acquire enqueues a ticket (the future lease ID) in a Redis sorted
// set ordered by arrival; a waiter is served only when its ticket is at the
// head of the queue and a slot is free, so grants happen in arrival order
// whichever replica the waiters run in. The grant is made by whichever
// script first sees both (usually the Release that frees the slot, which
// wakes a waiter of the same process at once); the waiter picks it up on
// its next poll. Waiters in other processes poll, every 2 ms near the head
// and up to MaxPoll deeper in the queue. A waiter that stops polling for
// WaiterTTL (its process died) is dropped from the queue, and a slot handed
// to it but never picked up is taken back WaiterTTL after the grant, so a
// dead waiter cannot block the pool for long.
//
// Every lease records when it was last renewed. A lease not renewed for
// ReclaimAfter is reclaimed by whichever script runs next (any caller's
// Acquire, Renew, Release, Check, Status or Sweep): its slot becomes free.
// A holder that renews within the window keeps the same lease (same ID,
// slot and token), so a process restarted within the window can carry on.
//
// Fencing tokens come from one counter per pool, so they strictly increase
// in grant order. A slot remembers the lease (and so the token) holding it;
// Check refuses with ErrStaleLease a lease that no longer holds its slot or
// has outlived the window, which is what a provider must ask before acting
// for a holder.
//
// # Redis
//
// All keys of one pool share the hash tag {pool:NAME}, so each script
// touches one cluster slot. Time is Redis's (TIME inside the scripts), so
// replicas with skewed clocks agree on ages, and tests move it with
// miniredis SetTime. Every write script is idempotent: running it twice (as
// a go-redis retry may) leaves the same state as running it once. Max and
// the windows travel with each call, so all replicas must be configured
// alike (they share one config file).
package pools

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/store"
)

// Defaults for Options fields left zero.
const (
	// DefaultReclaimAfter is how long a lease lives without a renewal
	// (renewed every 15 s, reclaimed after 2 minutes).
	DefaultReclaimAfter = 2 * time.Minute
	// DefaultWaiterTTL is how long a queued waiter may go without polling
	// before it is taken for dead and dropped from the queue.
	DefaultWaiterTTL = 10 * time.Second
	// DefaultMaxPoll bounds the interval between a waiter's polls.
	DefaultMaxPoll = 50 * time.Millisecond
)

var (
	// ErrLeaseTimeout is returned by Acquire when no slot was granted
	// within the wait. Its code is "lease_timeout".
	ErrLeaseTimeout = &Error{Code: "lease_timeout", Msg: "no lease was free within the wait"}
	// ErrStaleLease is returned by Check and Renew for a lease that no
	// longer holds its slot: released, or reclaimed after the window and
	// perhaps granted to another holder with a newer fencing token.
	ErrStaleLease = &Error{Code: "stale_lease", Msg: "the lease is no longer held (released or reclaimed)"}
	// ErrInvalid is wrapped for bad arguments (empty holder, zero max).
	ErrInvalid = errors.New("pools: invalid argument")
)

// Error is a pool error with a stable code for API problems.
type Error struct {
	Code string
	Msg  string
}

func (e *Error) Error() string { return "pools: " + e.Msg + " (" + e.Code + ")" }

// Options tune a Pool; nil or zero fields mean the defaults.
type Options struct {
	// ReclaimAfter is the window a lease survives without a renewal.
	ReclaimAfter time.Duration
	// WaiterTTL is how long a waiter may go without polling before it is
	// dropped from the queue; it must exceed MaxPoll by a wide margin.
	WaiterTTL time.Duration
	// MaxPoll bounds the back-off between a waiter's polls; a lower
	// value serves waiters sooner after a release in another replica at
	// the cost of more Redis calls.
	MaxPoll time.Duration
}

// Pool is one named pool of max slots in Redis. Its methods are safe for
// concurrent use; several Pools (in several processes) with the same store
// prefix, name and options share the same slots.
type Pool struct {
	st      *store.Store
	name    string
	max     int
	reclaim time.Duration
	waitTTL time.Duration
	maxPoll time.Duration
	keys    []string

	// local maps the tickets of this process's waiters to a channel
	// that wakes them when a script run here served them; waiters in
	// other processes find out by polling.
	mu    sync.Mutex
	local map[string]chan struct{}
}

// Lease is one holder's hold on one slot.
type Lease struct {
	// ID names the lease; it is also the ticket it waited with.
	ID string
	// Holder is who asked (an execution ID, or execution/path).
	Holder string
	// Slot is the slot index in 0..max-1.
	Slot int
	// Token is the fencing token: strictly increasing per pool in grant
	// order. A provider refuses work carrying a token Check rejects.
	Token int64
	// AcquiredAt is the Redis time of the grant.
	AcquiredAt time.Time
}

// Usage is a pool's state for status pages.
type Usage struct {
	Max    int
	Leased int
	Queued int
	Leases []LeaseUsage
}

// LeaseUsage is one live lease in Usage.
type LeaseUsage struct {
	Holder string
	Slot   int
	Age    time.Duration
	// SinceRenew is how long ago the lease was last renewed.
	SinceRenew time.Duration
}

// New returns the pool name of max slots on st. name is a connection name
// (no braces, so it can sit in a hash tag).
func New(st *store.Store, name string, max int, opts *Options) (*Pool, error) {
	if st == nil || max <= 0 || name == "" || strings.ContainsAny(name, "{}") {
		return nil, fmt.Errorf("%w: pool %q max %d", ErrInvalid, name, max)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.ReclaimAfter <= 0 {
		o.ReclaimAfter = DefaultReclaimAfter
	}
	if o.WaiterTTL <= 0 {
		o.WaiterTTL = DefaultWaiterTTL
	}
	if o.MaxPoll <= 0 {
		o.MaxPoll = DefaultMaxPoll
	}
	tag := "{pool:" + name + "}:"
	p := &Pool{
		st: st, name: name, max: max,
		reclaim: o.ReclaimAfter, waitTTL: o.WaiterTTL, maxPoll: o.MaxPoll,
		local: map[string]chan struct{}{},
	}
	for _, k := range []string{"leases", "info", "slots", "queue", "seen", "ctr", "waiters"} {
		p.keys = append(p.keys, st.Key(tag+k))
	}
	return p, nil
}

// Name is the pool's name.
func (p *Pool) Name() string { return p.name }

// Max is the number of slots.
func (p *Pool) Max() int { return p.max }

// The keys, in order, of every script:
//
//	KEYS[1] leases  zset  leaseID -> last renewal (ms)
//	KEYS[2] info    hash  leaseID -> "slot|token|acquiredMs|holder"
//	KEYS[3] slots   hash  slot -> leaseID
//	KEYS[4] queue   zset  ticket -> arrival number
//	KEYS[5] seen    zset  ticket -> last poll (ms)
//	KEYS[6] ctr     hash  "fence", "arrival" counters
//	KEYS[7] waiters hash  ticket -> holder
//
// ARGV[1] reclaim window ms, ARGV[2] waiter TTL ms, ARGV[3] max, then per
// script from ARGV[4].
//
// Every script runs sweep (reclaim expired leases, drop dead waiters) and
// serve (grant free slots to the head of the queue, one by one) first, and
// serve again after its own change. Granting in serve, not only when the
// head polls, hands a freed slot over inside the release that frees it.
// A slot handed to a waiter that has not yet picked it up expires WaiterTTL
// after the grant unless the waiter polls (which claims it: a renewal), so
// a waiter that dies in the queue holds a slot for WaiterTTL at most.
const luaPrelude = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reclaim = tonumber(ARGV[1])
local wttl = tonumber(ARGV[2])
local max = tonumber(ARGV[3])
local function fmt(n) return string.format('%d', n) end
local function drop(id)
  local v = redis.call('HGET', KEYS[2], id)
  if v then
    local slot = string.match(v, '^([^|]*)|')
    if redis.call('HGET', KEYS[3], slot) == id then redis.call('HDEL', KEYS[3], slot) end
    redis.call('HDEL', KEYS[2], id)
  end
  redis.call('ZREM', KEYS[1], id)
end
local function unqueue(id)
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id)
  redis.call('HDEL', KEYS[7], id)
end
local function sweep()
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', fmt(now - reclaim))) do drop(id) end
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', fmt(now - wttl))) do unqueue(id) end
end
local served = {}
local function serve()
  while redis.call('ZCARD', KEYS[1]) < max do
    local id = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
    if not id then return end
    local slot = -1
    for i = 0, max - 1 do
      if redis.call('HEXISTS', KEYS[3], fmt(i)) == 0 then slot = i break end
    end
    if slot < 0 then return end
    local holder = redis.call('HGET', KEYS[7], id) or ''
    local token = redis.call('HINCRBY', KEYS[6], 'fence', 1)
    redis.call('HSET', KEYS[2], id, fmt(slot) .. '|' .. fmt(token) .. '|' .. fmt(now) .. '|' .. holder)
    redis.call('HSET', KEYS[3], fmt(slot), id)
    -- Not yet picked up: expires wttl from now unless claimed.
    redis.call('ZADD', KEYS[1], fmt(math.min(now, now - reclaim + wttl)), id)
    unqueue(id)
    table.insert(served, id)
  end
end
local function leasereply(id, v, status)
  local slot, token, acq, holder = string.match(v, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
  return {status, id, holder, slot, token, acq, fmt(now)}
end
sweep()
serve()
`

// acquireScript: ARGV[4] ticket, ARGV[5] holder, ARGV[6] "1" to enqueue the
// ticket when it is neither queued nor leased. Replies {"granted", id,
// holder, slot, token, acquiredMs, now} (claiming the lease), {"waiting",
// rank}, or {"gone"} when the ticket was dropped (or already released).
var acquireScript = redis.NewScript(luaPrelude + `
local id, holder = ARGV[4], ARGV[5]
if not redis.call('HGET', KEYS[2], id) and not redis.call('ZSCORE', KEYS[4], id) then
  if ARGV[6] ~= '1' then return {'gone'} end
  local n = redis.call('HINCRBY', KEYS[6], 'arrival', 1)
  redis.call('ZADD', KEYS[4], n, id)
  redis.call('HSET', KEYS[7], id, holder)
  redis.call('ZADD', KEYS[5], now, id)
  serve()
end
local v = redis.call('HGET', KEYS[2], id)
if v then
  redis.call('ZADD', KEYS[1], now, id)
  return leasereply(id, v, 'granted')
end
redis.call('ZADD', KEYS[5], now, id)
return {'waiting', fmt(redis.call('ZRANK', KEYS[4], id))}
`)

// cancelScript: ARGV[4] ticket. Leaves the queue and gives back a lease
// granted to the ticket (a grant the waiter never picked up). Replies the
// tickets served by the slot it freed.
var cancelScript = redis.NewScript(luaPrelude + `
local id = ARGV[4]
unqueue(id)
drop(id)
serve()
return served
`)

// leaseScript: ARGV[4] op (renew|release|check), ARGV[5] lease ID,
// ARGV[6] token. Replies {"ok"|"stale", served tickets…} (release replies
// "ok" for a lease already gone, so that a retry does not fail).
var leaseScript = redis.NewScript(luaPrelude + `
local op, id, token = ARGV[4], ARGV[5], ARGV[6]
local v = redis.call('HGET', KEYS[2], id)
local live = false
if v then
  local slot, tok = string.match(v, '^([^|]*)|([^|]*)|')
  live = tok == token and redis.call('HGET', KEYS[3], slot) == id
end
local status = 'ok'
if op == 'release' then
  if live then drop(id) serve() end
elseif not live then
  status = 'stale'
elseif op == 'renew' then
  redis.call('ZADD', KEYS[1], now, id)
end
table.insert(served, 1, status)
return served
`)

// statusScript replies {now, queued, id1, info1, renewed1, …}.
var statusScript = redis.NewScript(luaPrelude + `
local out = {fmt(now), fmt(redis.call('ZCARD', KEYS[4]))}
local ls = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #ls, 2 do
  local v = redis.call('HGET', KEYS[2], ls[i])
  if v then
    table.insert(out, ls[i]); table.insert(out, v); table.insert(out, ls[i+1])
  end
end
return out
`)

func (p *Pool) args(extra ...any) []any {
	return append([]any{p.reclaim.Milliseconds(), p.waitTTL.Milliseconds(), p.max}, extra...)
}

func newID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// pollResult is one acquire-script reply.
type pollResult struct {
	lease *Lease
	rank  int
	gone  bool
}

// poll runs the acquire script once for ticket.
func (p *Pool) poll(ctx context.Context, ticket, holder string, enqueue bool) (pollResult, error) {
	enq := "0"
	if enqueue {
		enq = "1"
	}
	res, err := acquireScript.Run(ctx, p.st.Client, p.keys, p.args(ticket, holder, enq)...).StringSlice()
	if err != nil {
		return pollResult{}, fmt.Errorf("pools: acquire %s: %w", p.name, err)
	}
	switch {
	case len(res) == 7 && res[0] == "granted":
		l, err := parseLease(res[1:])
		if err != nil {
			return pollResult{}, fmt.Errorf("pools: acquire %s: %w", p.name, err)
		}
		return pollResult{lease: l}, nil
	case len(res) == 2 && res[0] == "waiting":
		r, _ := strconv.Atoi(res[1])
		return pollResult{rank: r}, nil
	case len(res) == 1 && res[0] == "gone":
		return pollResult{gone: true}, nil
	}
	return pollResult{}, fmt.Errorf("pools: acquire %s: unexpected reply %q", p.name, res)
}

func parseLease(f []string) (*Lease, error) {
	slot, err1 := strconv.Atoi(f[2])
	token, err2 := strconv.ParseInt(f[3], 10, 64)
	acq, err3 := strconv.ParseInt(f[4], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return nil, fmt.Errorf("bad lease record %q: %w", f, err)
	}
	return &Lease{ID: f[0], Holder: f[1], Slot: slot, Token: token, AcquiredAt: time.UnixMilli(acq).UTC()}, nil
}

// wake tells local waiters whose tickets a script just served.
func (p *Pool) wake(tickets []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range tickets {
		if ch, ok := p.local[t]; ok {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// Acquire waits up to wait for a slot and returns the lease granted to
// holder. Waiters are served in arrival order across all replicas. When
// wait passes first it returns ErrLeaseTimeout; when ctx ends, ctx's error.
// Either way the waiter leaves the queue (and gives back a lease granted in
// the meantime). wait <= 0 means one try.
func (p *Pool) Acquire(ctx context.Context, holder string, wait time.Duration) (*Lease, error) {
	return p.AcquireNotify(ctx, holder, wait, nil)
}

// AcquireNotify is Acquire that calls queued once, if the first try finds
// no free slot and the waiter queues (so a run can show that it waits).
func (p *Pool) AcquireNotify(ctx context.Context, holder string, wait time.Duration, queued func()) (*Lease, error) {
	if holder == "" {
		return nil, fmt.Errorf("%w: empty holder", ErrInvalid)
	}
	ticket := newID()
	woken := make(chan struct{}, 1)
	p.mu.Lock()
	p.local[ticket] = woken
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.local, ticket)
		p.mu.Unlock()
	}()
	deadline := time.Now().Add(wait)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	enqueue := true
	for {
		r, err := p.poll(ctx, ticket, holder, enqueue)
		if err != nil {
			p.cancel(ticket)
			return nil, err
		}
		enqueue = false
		if r.lease != nil {
			return r.lease, nil
		}
		if r.gone {
			// Taken for dead (we did not poll within WaiterTTL, e.g. a
			// long GC pause or a partition): queue again at the back.
			enqueue = true
		}
		if !time.Now().Before(deadline) {
			p.cancel(ticket)
			return nil, ErrLeaseTimeout
		}
		if queued != nil {
			queued()
			queued = nil
		}
		// A release in this process wakes us at once; one in another
		// replica is seen by polling, sooner the nearer the head.
		d := min(p.maxPoll, time.Duration(1+r.rank/p.max)*2*time.Millisecond)
		poll := time.NewTimer(d)
		select {
		case <-ctx.Done():
			poll.Stop()
			p.cancel(ticket)
			return nil, ctx.Err()
		case <-timer.C:
			// One more poll at the deadline.
		case <-woken:
		case <-poll.C:
		}
		poll.Stop()
	}
}

// cancel leaves the queue, on a fresh context so that a cancelled ctx does
// not leave a ticket at the head until WaiterTTL.
func (p *Pool) cancel(ticket string) {
	ctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	served, err := cancelScript.Run(ctx, p.st.Client, p.keys, p.args(ticket)...).StringSlice()
	if err == nil {
		p.wake(served)
	}
}

func (p *Pool) leaseOp(ctx context.Context, op string, l *Lease) error {
	if l == nil {
		return fmt.Errorf("%w: nil lease", ErrInvalid)
	}
	res, err := leaseScript.Run(ctx, p.st.Client, p.keys, p.args(op, l.ID, strconv.FormatInt(l.Token, 10))...).StringSlice()
	if err != nil {
		return fmt.Errorf("pools: %s lease %s of %s: %w", op, l.ID, p.name, err)
	}
	if len(res) == 0 {
		return fmt.Errorf("pools: %s lease %s of %s: empty reply", op, l.ID, p.name)
	}
	p.wake(res[1:])
	if res[0] == "stale" {
		return fmt.Errorf("pools: %s lease %s (token %d) of %s: %w", op, l.ID, l.Token, p.name, ErrStaleLease)
	}
	return nil
}

// Renew restarts the reclaim window of l. A lease already reclaimed (or
// released) is not revived: Renew returns ErrStaleLease.
func (p *Pool) Renew(ctx context.Context, l *Lease) error { return p.leaseOp(ctx, "renew", l) }

// Release gives l's slot back, to the head of the queue if any. Releasing
// a lease that is already gone (released, or reclaimed) does nothing and
// returns nil.
func (p *Pool) Release(ctx context.Context, l *Lease) error { return p.leaseOp(ctx, "release", l) }

// Check returns nil when l still holds its slot within the window, and
// ErrStaleLease when its token is no longer the slot's.
func (p *Pool) Check(ctx context.Context, l *Lease) error { return p.leaseOp(ctx, "check", l) }

// Sweep reclaims leases past the window and drops dead waiters now; every
// other call does the same first, so Sweep is only for a pool nobody
// touches.
func (p *Pool) Sweep(ctx context.Context) error {
	_, err := p.Status(ctx)
	return err
}

// Status returns the pool's usage after reclaiming expired leases. Leases
// are ordered by last renewal, oldest first.
func (p *Pool) Status(ctx context.Context) (Usage, error) {
	res, err := statusScript.Run(ctx, p.st.Client, p.keys, p.args()...).StringSlice()
	if err != nil {
		return Usage{}, fmt.Errorf("pools: status %s: %w", p.name, err)
	}
	if len(res) < 2 || (len(res)-2)%3 != 0 {
		return Usage{}, fmt.Errorf("pools: status %s: unexpected reply %q", p.name, res)
	}
	now, _ := strconv.ParseInt(res[0], 10, 64)
	q, _ := strconv.Atoi(res[1])
	u := Usage{Max: p.max, Queued: q, Leases: []LeaseUsage{}}
	for i := 2; i < len(res); i += 3 {
		f := strings.SplitN(res[i+1], "|", 4)
		if len(f) != 4 {
			continue
		}
		l, err := parseLease([]string{res[i], f[3], f[0], f[1], f[2]})
		if err != nil {
			return Usage{}, fmt.Errorf("pools: status %s: %w", p.name, err)
		}
		renewed, _ := strconv.ParseFloat(res[i+2], 64)
		lu := LeaseUsage{
			Holder:     l.Holder,
			Slot:       l.Slot,
			Age:        time.Duration(now-l.AcquiredAt.UnixMilli()) * time.Millisecond,
			SinceRenew: time.Duration(now-int64(renewed)) * time.Millisecond,
		}
		// A slot handed over but not yet picked up is recorded as
		// renewed in the past (so it expires after WaiterTTL).
		lu.SinceRenew = min(lu.SinceRenew, lu.Age)
		u.Leases = append(u.Leases, lu)
	}
	u.Leased = len(u.Leases)
	return u, nil
}

// ReclaimAfter is the window a lease survives without a renewal.
func (p *Pool) ReclaimAfter() time.Duration { return p.reclaim }
