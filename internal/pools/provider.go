package pools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/proctree"
)

// Provisioner opens a fresh connection with the given setup values (the
// pool's defaults and host-only values already merged in). cmd/server
// gives one that starts a new MCP server per call.
type Provisioner func(ctx context.Context, setup map[string]any) (connect.Conn, error)

// ProviderOptions configure a Provider.
type ProviderOptions struct {
	// Wait is how long Lease waits for a free slot; 0: one try.
	Wait time.Duration
	// Schema is the JSON Schema of setup values; nil: any object.
	Schema map[string]any
	// HostOnly names setup fields documents may not set: their value is
	// the schema's default only.
	HostOnly []string
	// Provision opens the connection of a lease. Required.
	Provision Provisioner
	Logger    *slog.Logger
	// RefreshEvery is how often usage is read for status and kept leases
	// are checked for reclaim (their connections closed); default 1s.
	RefreshEvery time.Duration
}

// Provider is the connect.Leaser of one pooled connection. Registered as
// the connection's provider, its Connect reads the manifest from a probe
// connection (provisioned with the default setup and closed again) and
// returns the pool's face, which refuses calls: calls go through leases.
type Provider struct {
	pool      *Pool
	wait      time.Duration
	props     map[string]any
	hostOnly  []string
	schema    *jsonschema.Schema
	provision Provisioner
	logger    *slog.Logger
	every     time.Duration

	mu   sync.Mutex
	live map[string]*leased // this process's leases with a connection, by lease ID
	tags map[string]string  // process tree tag -> lease ID, of this process's connections (live or starting)
	stop chan struct{}
	wg   sync.WaitGroup

	// procs is the Redis hash of the process trees of every replica's
	// leased connections (see trees.go); owner is this process.
	procs string
	owner proctree.Owner

	usage atomic.Pointer[connect.PoolStatus]
}

var _ connect.Leaser = (*Provider)(nil)

// NewProvider returns the provider of pool p.
func NewProvider(p *Pool, o ProviderOptions) (*Provider, error) {
	if p == nil || o.Provision == nil {
		return nil, fmt.Errorf("%w: a provider needs a pool and a provisioner", ErrInvalid)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.RefreshEvery <= 0 {
		o.RefreshEvery = time.Second
	}
	pr := &Provider{pool: p, wait: o.Wait, hostOnly: o.HostOnly, provision: o.Provision, logger: o.Logger,
		every: o.RefreshEvery, live: map[string]*leased{}, tags: map[string]string{},
		procs: p.st.Key("{pool:" + p.name + "}:procs"), owner: proctree.Self()}
	if o.Schema != nil {
		pr.props, _ = o.Schema["properties"].(map[string]any)
		sch, err := compileSchema(p.name, o.Schema)
		if err != nil {
			return nil, err
		}
		pr.schema = sch
	}
	return pr, nil
}

func compileSchema(name string, schema map[string]any) (*jsonschema.Schema, error) {
	raw, err := json.Marshal(schema)
	if err != nil {
		return nil, fmt.Errorf("pools: setup schema of %s: %w", name, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("pools: setup schema of %s: %w", name, err)
	}
	c := jsonschema.NewCompiler()
	url := "mem://pools/" + name + "/setup"
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("pools: setup schema of %s: %w", name, err)
	}
	sch, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("pools: setup schema of %s does not compile: %w", name, err)
	}
	return sch, nil
}

// effective is the setup a lease's connection gets: the schema's defaults
// overlaid with the document's values, host-only fields left at their
// defaults.
func (pr *Provider) effective(setup map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range pr.props {
		if s, ok := v.(map[string]any); ok {
			if d, ok := s["default"]; ok {
				out[k] = d
			}
		}
	}
	for k, v := range setup {
		if !slices.Contains(pr.hostOnly, k) {
			out[k] = v
		}
	}
	return out
}

// CheckSetup refuses host-only fields and values the schema rejects.
func (pr *Provider) CheckSetup(setup map[string]any) error {
	for _, k := range slices.Sorted(maps.Keys(setup)) {
		if slices.Contains(pr.hostOnly, k) {
			return fmt.Errorf("setup field %q is host-only: only the pool's own config sets it", k)
		}
	}
	if pr.schema == nil {
		return nil
	}
	raw, err := json.Marshal(pr.effective(setup))
	if err != nil {
		return fmt.Errorf("setup is not JSON: %w", err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("setup is not JSON: %w", err)
	}
	if err := pr.schema.Validate(v); err != nil {
		return fmt.Errorf("setup does not match the setup schema of pool %s: %v", pr.pool.name, err)
	}
	return nil
}

// Connect starts the background refresh and returns the pool's face, with
// the manifest of a probe connection.
func (pr *Provider) Connect(ctx context.Context) (connect.Conn, error) {
	tag, _ := pr.track(ctx, &Lease{ID: "probe"})
	probe, err := pr.provision(proctree.WithTag(ctx, tag), pr.effective(nil))
	if err != nil {
		pr.untrack(tag)
		return nil, fmt.Errorf("pool %s: probe: %w", pr.pool.name, err)
	}
	m := probe.Manifest()
	if err := probe.Close(); err != nil {
		pr.logger.Warn("closing the pool's probe connection", "pool", pr.pool.name, "err", err)
	}
	pr.untrack(tag)
	pr.mu.Lock()
	if pr.stop == nil {
		pr.stop = make(chan struct{})
		stop := pr.stop
		pr.wg.Go(func() { pr.loop(stop) })
	}
	pr.mu.Unlock()
	pr.refresh(ctx)
	pr.sweep(ctx) // what a crash of this process (or another on this host) left
	return &face{pr: pr, manifest: m}, nil
}

// loop refreshes usage, closes the connections of kept leases that were
// reclaimed, and sweeps the process trees left by dead holders.
func (pr *Provider) loop(stop chan struct{}) {
	t := time.NewTicker(pr.every)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		pr.refresh(ctx)
		pr.mu.Lock()
		var kept []*leased
		for _, l := range pr.live {
			if l.kept.Load() {
				kept = append(kept, l)
			}
		}
		pr.mu.Unlock()
		for _, l := range kept {
			if err := pr.pool.Check(ctx, l.lease); errors.Is(err, ErrStaleLease) {
				pr.logger.Info("kept lease reclaimed; closing its connection", "pool", pr.pool.name, "lease", l.lease.ID)
				l.drop()
			}
		}
		pr.sweep(ctx)
		cancel()
	}
}

// refresh reads usage for PoolStatus.
func (pr *Provider) refresh(ctx context.Context) {
	u, err := pr.pool.Status(ctx)
	st := &connect.PoolStatus{Max: pr.pool.max, Leases: []connect.PoolLease{}}
	if err != nil {
		if old := pr.usage.Load(); old != nil {
			cp := *old
			st = &cp
		}
		st.Error = "pool usage could not be read from Redis"
		pr.usage.Store(st)
		return
	}
	st.Leased, st.Queued = u.Leased, u.Queued
	for _, l := range u.Leases {
		st.Leases = append(st.Leases, connect.PoolLease{Holder: l.Holder, Slot: l.Slot, AgeMs: l.Age.Milliseconds(), SinceRenewMs: l.SinceRenew.Milliseconds()})
	}
	pr.usage.Store(st)
}

// PoolStatus is the usage last read.
func (pr *Provider) PoolStatus() *connect.PoolStatus { return pr.usage.Load() }

// shutdown stops the loop and closes every connection this process still
// has; their leases stay in Redis until reclaimed, so a restarted process
// resuming within the window takes them back.
func (pr *Provider) shutdown() {
	pr.mu.Lock()
	stop := pr.stop
	pr.stop = nil
	live := slices.Collect(maps.Values(pr.live))
	pr.mu.Unlock()
	if stop != nil {
		close(stop)
		pr.wg.Wait()
	}
	for _, l := range live {
		l.drop()
	}
}

// Lease takes back req.Resume when it is still held, else waits for a new
// lease; either way the lease gets a connection (the one this process
// still has for a taken-back lease, or a fresh one).
func (pr *Provider) Lease(ctx context.Context, req connect.LeaseRequest) (connect.Lease, error) {
	if req.Resume != nil {
		l, err := pr.resume(ctx, req)
		if l != nil || err != nil {
			return l, err
		}
	}
	lease, err := pr.pool.AcquireNotify(ctx, req.Holder, pr.wait, req.Waiting)
	if errors.Is(err, ErrLeaseTimeout) {
		return nil, fmt.Errorf("pool %s (max %d, waited %s): %w", pr.pool.name, pr.pool.max, pr.wait, connect.ErrLeaseTimeout)
	}
	if err != nil {
		return nil, err
	}
	return pr.attach(ctx, lease, req.Setup)
}

var _ connect.HeldLeases = (*Provider)(nil)

// RenewRecord renews a lease no run holds now (see connect.HeldLeases).
func (pr *Provider) RenewRecord(ctx context.Context, rec connect.LeaseRecord) error {
	err := pr.pool.Renew(ctx, leaseOf(rec))
	if errors.Is(err, ErrStaleLease) {
		pr.dropLive(rec.ID)
		return fmt.Errorf("%w: %v", connect.ErrLeaseLost, err)
	}
	return err
}

// ReleaseRecord gives back a lease no run holds now.
func (pr *Provider) ReleaseRecord(ctx context.Context, rec connect.LeaseRecord) error {
	err := pr.pool.Release(ctx, leaseOf(rec))
	pr.dropLive(rec.ID)
	pr.refresh(ctx)
	return err
}

func leaseOf(rec connect.LeaseRecord) *Lease {
	return &Lease{ID: rec.ID, Holder: rec.Holder, Slot: rec.Slot, Token: rec.Token, AcquiredAt: rec.AcquiredAt}
}

// dropLive closes this process's connection of lease id, if it has one.
func (pr *Provider) dropLive(id string) {
	pr.mu.Lock()
	l := pr.live[id]
	pr.mu.Unlock()
	if l != nil {
		l.drop()
	}
}

// resume returns the recorded lease when it still holds its slot, nil
// when it was reclaimed.
func (pr *Provider) resume(ctx context.Context, req connect.LeaseRequest) (connect.Lease, error) {
	lease := leaseOf(*req.Resume)
	r := req.Resume
	pr.mu.Lock()
	l := pr.live[r.ID]
	pr.mu.Unlock()
	err := pr.pool.Renew(ctx, lease)
	if errors.Is(err, ErrStaleLease) {
		if l != nil {
			l.drop()
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if l != nil && !l.gone() {
		l.kept.Store(false)
		return l, nil
	}
	return pr.attach(ctx, lease, req.Setup)
}

// attach provisions the connection of a granted lease; when that fails
// the lease goes back. The connection's process tree is recorded first
// (trees.go), and the lease renewed while its server starts, which may
// take longer than the reclaim window (npx fetching a package).
func (pr *Provider) attach(ctx context.Context, lease *Lease, setup map[string]any) (connect.Lease, error) {
	tag, at := pr.track(ctx, lease)
	renewed := pr.renewWhile(lease)
	conn, err := pr.provision(proctree.WithTag(ctx, tag), pr.effective(setup))
	if lost := renewed(); lost && err == nil {
		_ = conn.Close()
		err = fmt.Errorf("the lease was reclaimed while its server started: %w", connect.ErrLeaseLost)
	}
	if err != nil {
		pr.untrack(tag)
		_ = pr.pool.Release(context.WithoutCancel(ctx), lease)
		return nil, fmt.Errorf("pool %s: provision: %w", pr.pool.name, err)
	}
	l := &leased{pr: pr, lease: lease, conn: conn, tag: tag, at: at}
	pr.mu.Lock()
	if old := pr.live[lease.ID]; old != nil && old != l {
		defer old.drop()
	}
	pr.live[lease.ID] = l
	pr.mu.Unlock()
	pr.refresh(ctx)
	return l, nil
}

// leased is one lease of this process with its connection.
type leased struct {
	pr    *Provider
	lease *Lease
	conn  connect.Conn
	tag   string // its process tree's (trees.go)
	at    int64  // when the tree was recorded, unix ms
	kept  atomic.Bool
	once  sync.Once
	done  atomic.Bool
}

var _ connect.Lease = (*leased)(nil)

func (l *leased) Record() connect.LeaseRecord {
	return connect.LeaseRecord{Pool: l.pr.pool.name, Holder: l.lease.Holder, ID: l.lease.ID, Slot: l.lease.Slot,
		Token: l.lease.Token, AcquiredAt: l.lease.AcquiredAt}
}

func (l *leased) Conn() connect.Conn { return &fenced{l: l} }

// RenewEvery is 15 s, or a quarter of a shorter window.
func (l *leased) RenewEvery() time.Duration { return l.pr.renewEvery() }

func (pr *Provider) renewEvery() time.Duration { return min(15*time.Second, pr.pool.reclaim/4) }

func (l *leased) Renew(ctx context.Context) error {
	err := l.pr.pool.Renew(ctx, l.lease)
	if errors.Is(err, ErrStaleLease) {
		l.drop()
		return fmt.Errorf("%w: %v", connect.ErrLeaseLost, err)
	}
	return err
}

func (l *leased) Release(ctx context.Context) error {
	err := l.pr.pool.Release(ctx, l.lease)
	l.drop()
	l.pr.refresh(ctx)
	return err
}

func (l *leased) Keep() { l.kept.Store(true) }

// drop closes the connection and forgets the lease locally.
func (l *leased) drop() {
	l.once.Do(func() {
		l.done.Store(true)
		l.pr.mu.Lock()
		if l.pr.live[l.lease.ID] == l {
			delete(l.pr.live, l.lease.ID)
		}
		l.pr.mu.Unlock()
		if err := l.conn.Close(); err != nil {
			l.pr.logger.Warn("closing a leased connection", "pool", l.pr.pool.name, "lease", l.lease.ID, "err", err)
		}
		l.pr.untrack(l.tag)
	})
}

func (l *leased) gone() bool { return l.done.Load() }

// fenced is a leased connection as callers see it: every call first checks
// that the lease still holds its slot (fencing token), and Close is the
// lease's business, not the caller's.
type fenced struct{ l *leased }

func (f *fenced) Manifest() connect.Manifest { return f.l.conn.Manifest() }
func (f *fenced) Identity() connect.Identity { return f.l.conn.Identity() }
func (f *fenced) Close() error               { return nil }

func (f *fenced) Info() map[string]any {
	info := map[string]any{}
	maps.Copy(info, f.l.conn.Info())
	info["lease"] = f.l.lease.ID
	return info
}

func (f *fenced) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	if f.l.gone() {
		return nil, fmt.Errorf("lease %s of pool %s: %w", f.l.lease.ID, f.l.pr.pool.name, connect.ErrLeaseLost)
	}
	if err := f.l.pr.pool.Check(ctx, f.l.lease); err != nil {
		if errors.Is(err, ErrStaleLease) {
			f.l.drop()
			return nil, fmt.Errorf("lease %s (token %d) of pool %s: %w", f.l.lease.ID, f.l.lease.Token, f.l.pr.pool.name, connect.ErrLeaseLost)
		}
		return nil, err
	}
	return f.l.conn.Call(ctx, req)
}

// face is the pool's registry entry: its manifest for validation, no calls.
type face struct {
	pr       *Provider
	manifest connect.Manifest
}

func (f *face) Manifest() connect.Manifest { return f.manifest }
func (f *face) Identity() connect.Identity {
	return connect.Identity{Surface: "pool:" + f.pr.pool.name}
}
func (f *face) Info() map[string]any {
	return map[string]any{"pool": f.pr.pool.name, "max": f.pr.pool.max}
}

func (f *face) Call(context.Context, connect.CallRequest) (any, error) {
	return nil, fmt.Errorf("pool %s is called through a lease: declare it in a document's connections (fresh: execution or path): %w",
		f.pr.pool.name, connect.ErrUnavailable)
}

// Close stops the pool's background work and closes this process's leased
// connections (shutdown).
func (f *face) Close() error {
	f.pr.shutdown()
	return nil
}
