package connect

import (
	"context"
	"errors"
	"time"
)

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

// HeldLeases is implemented by Leasers whose leases can be renewed and
// given back by their record alone, between the runs that use them: the
// lease an MCP session holds across its calls. Both act on this
// process's connection of the lease, if it has one.
type HeldLeases interface {
	// RenewRecord restarts the lease's reclaim window; an error wrapping
	// ErrLeaseLost says it was reclaimed (its connection is closed).
	RenewRecord(ctx context.Context, rec LeaseRecord) error
	// ReleaseRecord gives the lease back and closes its connection.
	ReleaseRecord(ctx context.Context, rec LeaseRecord) error
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
