package connect

import (
	"context"
	"errors"
	"time"
)

// # Pools and leases (issue 7)
//
// A pooled connection is registered like any other (Registry.Add) with a
// Provider that also implements Leaser (internal/pools does, wired by
// cmd/server). Its registry entry is the pool's face: its manifest (read
// from a probe server at Start) lets documents be validated, and its
// status shows pool usage; calls go only through leases.
//
// A document takes a connection of its own through a handle, a manifest
// entry {"from": "<pool>", "fresh": "execution"|"path", "setup": {…}}
// (see handles.go). Departures from DESIGN.md and the issue, chosen here:
//   - an entry that names a pool without fresh is leased per execution;
//   - setup values are literal JSON, or a top-level {"$expr"} over $input
//     alone, resolved when the execution is submitted so the allowlist
//     and the schema judge the values the lease will get;
//   - a lease held across a wait for a person (approval) stays renewed by
//     the process the run parked in (parkLease), however long the wait; if
//     that process dies, the lease is reclaimed after the window like any
//     other, and the decision's run gets a fresh one;
//   - a resumed run that takes a kept lease back on another connection
//     (the lease was reclaimed, or another process resumes) judges the
//     entries recorded on the old one by the pool's determinism, like a
//     replaced registry connection (recheckHandle); a scope that ended gave
//     its lease back and its results stand.

// Leaser is the provider of a pooled connection. Implementations must be
// safe for concurrent use.
type Leaser interface {
	Provider
	// CheckSetup validates the setup values a document gives against the
	// pool's setup schema and host-only fields. The error names the field.
	CheckSetup(setup map[string]any) error
	// Lease waits up to the pool's wait for a lease for req.Holder and
	// provisions a fresh connection with req.Setup. It returns an error
	// wrapping ErrLeaseTimeout when the wait passes.
	Lease(ctx context.Context, req LeaseRequest) (Lease, error)
	// PoolStatus is the pool's usage as last seen (it does no I/O, so a
	// status page never waits on Redis); nil before the first look.
	PoolStatus() *PoolStatus
}

// LeaseRequest asks a pool for a lease.
type LeaseRequest struct {
	// Holder is who holds the lease: "<execution>/<handle>" for the
	// execution, plus the parallel path for fresh: path.
	Holder string
	Setup  map[string]any
	// Resume is the lease this holder recorded before (a resumed or
	// taken-over run): taken back, with its connection when this process
	// still has it, if it has not been reclaimed.
	Resume *LeaseRecord
	// Waiting is called once when the pool is full and the request
	// queues.
	Waiting func()
}

// Lease is one holder's hold on a pooled connection.
type Lease interface {
	Record() LeaseRecord
	// Conn is the lease's own connection. Its calls are fenced: once the
	// lease is no longer held they are refused.
	Conn() Conn
	// RenewEvery is how often the holder must call Renew.
	RenewEvery() time.Duration
	// Renew restarts the reclaim window; an error wrapping ErrLeaseLost
	// says the lease was reclaimed (its connection is closed).
	Renew(ctx context.Context) error
	// Release gives the lease back and closes its connection.
	Release(ctx context.Context) error
	// Keep stops using the lease without giving it back: it is reclaimed
	// after the window unless a resume takes it back first.
	Keep()
}

// LeaseRecord is a lease as the execution record keeps it, so that a
// resumed run can take it back.
type LeaseRecord struct {
	Pool       string    `json:"pool"`
	Handle     string    `json:"handle"`
	Holder     string    `json:"holder"`
	ID         string    `json:"id"`
	Slot       int       `json:"slot"`
	Token      int64     `json:"token"`
	AcquiredAt time.Time `json:"acquiredAt"`
}

// PoolStatus is a pool's usage as status shows it.
type PoolStatus struct {
	Max    int         `json:"max"`
	Leased int         `json:"leased"`
	Queued int         `json:"queued"`
	Leases []PoolLease `json:"leases"`
	// Error says why usage could not be read (Redis unreachable).
	Error string `json:"error,omitempty"`
}

// PoolLease is one live lease in PoolStatus.
type PoolLease struct {
	// Holder is "<execution>/<handle>"; empty where the viewer may not
	// see the execution (PoolStatusFor).
	Holder string `json:"holder,omitempty"`
	Slot   int    `json:"slot"`
	AgeMs  int64  `json:"ageMs"`
	// SinceRenewMs is how long ago the holder last renewed.
	SinceRenewMs int64 `json:"sinceRenewMs"`
}

// Lease errors.
var (
	// ErrLeaseTimeout: no lease was free within the pool's wait. A run
	// fails with code lease_timeout.
	ErrLeaseTimeout = errors.New("no lease was free within the wait")
	// ErrLeaseLost: the lease was reclaimed or released; its connection
	// is gone and calls through it are refused.
	ErrLeaseLost = errors.New("the lease is no longer held")
)
