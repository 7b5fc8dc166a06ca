package harness

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
)

// # Pools and leases
//
// A pooled connection is registered like any other (Registry.Add) with a
// Provider that also implements connect.Leaser (internal/pools does, wired
// by cmd/server). Its registry entry is the pool's face: its manifest
// (read from a probe server at Start) lets documents be validated, and its
// status shows pool usage; calls go only through leases.
//
// A document takes a connection of its own through a handle, a manifest
// entry {"from": "<pool>", "fresh": "execution"|"path", "setup": {…}}
// (parsed in package document). Choices made here:
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

// Lease events on an execution's stream.
const (
	EventLeaseAcquired = "lease.acquired" // {pool, handle, holder, lease, slot, resumed}
	EventLeaseReleased = "lease.released" // {pool, handle, holder, lease}
)

// leaseSet is the leases one run holds, by holder.
type leaseSet struct {
	mu      sync.Mutex
	held    map[string]*heldLease
	waiting int
}

// heldLease is one lease of a run; ready is closed once it was acquired
// (or failed), so paths asking for the same holder wait for one acquire.
type heldLease struct {
	ready  chan struct{}
	err    error
	scope  string
	handle document.Handle
	rec    connect.LeaseRecord
	lease  connect.Lease
	conn   *registry.Connection
	stop   chan struct{}
	wg     sync.WaitGroup
}

// holder is who holds the lease of handle h in frame f: the execution, or
// the parallel path for fresh: path.
func (r *run) holder(h document.Handle, f *frame) string {
	scope := ""
	if h.Fresh == document.FreshPath {
		scope = f.scope
	}
	if r.rec.LeaseHolder != "" {
		return r.rec.LeaseHolder + "/" + h.Name + scope
	}
	return r.rec.ID + "/" + h.Name + scope
}

// heldAcross reports whether hl is held across executions (see
// record.LeaseHolder): the run neither gives it back nor forgets it.
func (r *run) heldAcross(hl *heldLease) bool {
	return r.rec.LeaseHolder != "" && strings.HasPrefix(hl.rec.Holder, r.rec.LeaseHolder+"/")
}

// recheckHandle applies determinism to a done entry recorded on a pooled
// handle whose lease the run kept (a failed run being resumed): the lease
// is taken back now, and when the connection behind it is not the one the
// entry was recorded against (the lease was reclaimed, or this process no
// longer has its server), the pool's determinism decides, as for a
// replaced registry connection; rerun may name the handle or the pool. A
// scope that ended gave its lease back, and its results stand.
func (r *run) recheckHandle(ctx context.Context, f *frame, name, key string) error {
	h, ok := document.Handle{}, false
	if r.doc != nil {
		h, ok = r.doc.Handles[name]
	}
	if !ok {
		return nil
	}
	holder := r.holder(h, f)
	r.mu.Lock()
	i := r.entry(key)
	var st StepRecord
	if i >= 0 {
		st = r.rec.Steps[i]
	}
	kept := slices.ContainsFunc(r.rec.Leases, func(l connect.LeaseRecord) bool { return l.Holder == holder })
	r.mu.Unlock()
	if i < 0 || st.Status != StepDone || st.Identity == nil || !kept {
		return nil
	}
	conn, err := r.connFor(ctx, f, st.ID, name)
	if err != nil {
		return err
	}
	now := conn.Identity()
	if now.Instance == st.Identity.Instance {
		return nil
	}
	mode := ""
	if pc, err := r.e.reg.Get(h.Pool); err == nil {
		mode = pc.Policy().Determinism
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if i = r.entry(key); i < 0 {
		return nil // discarded meanwhile: runs live
	}
	switch {
	case mode == registry.Replayable:
		return nil
	case mode == registry.Costly || slices.Contains(r.rec.Rerun, name) || slices.Contains(r.rec.Rerun, h.Pool):
		r.truncate(i) // from here on, live on the new connection
		return nil
	}
	return &stepError{step: st.ID, code: "resume_refused", err: fmt.Errorf(
		"%w: %s is a new %s connection (was instance %s, now %s); resume with rerun [%q] to run it live",
		errIdentityChanged, name, h.Pool, st.Identity.Instance, now.Instance, name)}
}

// connFor returns the connection a call on name uses: a handle's leased
// connection (acquired on first use in its scope), else r.conn's.
func (r *run) connFor(ctx context.Context, f *frame, step, name string) (*registry.Connection, error) {
	var h document.Handle
	ok := false
	if r.doc != nil {
		h, ok = r.doc.Handles[name]
	}
	if !ok {
		return r.conn(ctx, name)
	}
	holder := r.holder(h, f)
	ls := &r.leases
	ls.mu.Lock()
	if hl, ok := ls.held[holder]; ok {
		ls.mu.Unlock()
		select {
		case <-hl.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if hl.err == nil && hl.conn == nil {
			return nil, fmt.Errorf("handle %s: its lease was given back: %w", name, connect.ErrLeaseLost)
		}
		return hl.conn, hl.err
	}
	if ls.held == nil {
		ls.held = map[string]*heldLease{}
	}
	scope := ""
	if h.Fresh == document.FreshPath {
		scope = f.scope
	}
	hl := &heldLease{ready: make(chan struct{}), scope: scope, handle: h}
	ls.held[holder] = hl
	ls.mu.Unlock()
	hl.conn, hl.err = r.acquire(ctx, hl, holder, step)
	if hl.err != nil {
		ls.mu.Lock()
		delete(ls.held, holder)
		ls.mu.Unlock()
	}
	close(hl.ready)
	return hl.conn, hl.err
}

// acquire takes a lease for holder (back, when the record has one), records
// it and starts renewing it.
func (r *run) acquire(ctx context.Context, hl *heldLease, holder, step string) (*registry.Connection, error) {
	h := hl.handle
	pc, err := r.e.reg.Get(h.Pool)
	if err != nil {
		return nil, err
	}
	leaser, ok := pc.Leaser()
	if !ok {
		return nil, fault.Deny(fault.GateDeclared, fmt.Sprintf("connection %s is not a pool", h.Pool))
	}
	var prev *connect.LeaseRecord
	r.mu.Lock()
	for _, lr := range r.rec.Leases {
		if lr.Holder == holder {
			prev = &lr
		}
	}
	r.mu.Unlock()
	if v, ok := r.e.held.Load(holder); prev == nil && ok {
		rec := v.(connect.LeaseRecord)
		prev = &rec
	}
	var waited bool
	asked := time.Now()
	lease, err := leaser.Lease(ctx, connect.LeaseRequest{Holder: holder, Setup: h.Setup, Resume: prev, Waiting: func() {
		waited = true
		r.leaseWaiting(ctx, h, holder, true)
	}})
	if waited {
		r.leaseWaiting(ctx, h, holder, false)
	}
	r.e.leaseWaited(h.Pool, time.Since(asked))
	if errors.Is(err, connect.ErrLeaseTimeout) {
		return nil, &stepError{step: step, code: fault.LeaseTimeout, err: fmt.Errorf("pool %s: %w", h.Pool, err)}
	}
	if err != nil {
		// Wrapped, not flattened: a path whose lease was cut short because a
		// sibling failed must still read as cancelled (see firstReal).
		return nil, fmt.Errorf("lease from pool %s: %w", h.Pool, secrets.RedactError(r.e.redactor, err))
	}
	rec := lease.Record()
	rec.Pool, rec.Handle, rec.Holder = h.Pool, h.Name, holder
	// The lease's server speaks what the pool speaks: bound by the pool's
	// binding (its reads too), or checked against what it declares, as at
	// connect.
	conn, spoken, err := pc.Speak(lease.Conn())
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("lease from pool %s: %w", h.Pool, secrets.RedactError(r.e.redactor, err))
	}
	c := pc.LeasedFrom(h.Name, conn, rec.ID, spoken)
	hl.rec, hl.lease = rec, lease
	r.mu.Lock()
	r.rec.Leases = append(slices.DeleteFunc(r.rec.Leases, func(l connect.LeaseRecord) bool { return l.Holder == holder }), rec)
	r.mu.Unlock()
	if err := r.save(ctx); err != nil {
		lease.Keep()
		return nil, err
	}
	resumed := prev != nil && prev.ID == rec.ID
	r.e.emit(ctx, r.rec.ID, EventLeaseAcquired, map[string]any{"pool": h.Pool, "handle": h.Name, "holder": holder,
		"lease": rec.ID, "slot": rec.Slot, "resumed": resumed})
	r.e.logger.InfoContext(ctx, "lease acquired", "execution", r.rec.ID, "pool", h.Pool, "holder", holder, "lease", rec.ID, "resumed", resumed)
	hl.stop = make(chan struct{})
	hl.wg.Go(func() { r.renewLease(hl) })
	return c, nil
}

// renewLease renews hl until it is released or kept.
func (r *run) renewLease(hl *heldLease) {
	t := time.NewTicker(hl.lease.RenewEvery())
	defer t.Stop()
	for {
		select {
		case <-hl.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := hl.lease.Renew(ctx)
		cancel()
		if errors.Is(err, connect.ErrLeaseLost) {
			r.e.logger.WarnContext(inExecution(r.rec.ID), "lease lost: reclaimed while held", "execution", r.rec.ID, "holder", hl.rec.Holder, "lease", hl.rec.ID)
			return
		}
		if err != nil {
			r.e.logger.WarnContext(inExecution(r.rec.ID), "lease renewal failed; retrying", "execution", r.rec.ID, "holder", hl.rec.Holder, "err", err)
		}
	}
}

// leaseWaiting shows the execution as waiting while any of its paths
// waits for a lease, and as running again when none does.
func (r *run) leaseWaiting(ctx context.Context, h document.Handle, holder string, waiting bool) {
	ls := &r.leases
	ls.mu.Lock()
	before := ls.waiting
	if waiting {
		ls.waiting++
	} else {
		ls.waiting--
	}
	after := ls.waiting
	ls.mu.Unlock()
	if (before == 0) == (after == 0) {
		return
	}
	status := ExecRunning
	data := map[string]any{"status": status}
	if waiting {
		status = ExecWaiting
		data = map[string]any{"status": status, "waitingFor": "lease", "pool": h.Pool, "holder": holder}
	}
	r.mu.Lock()
	r.rec.Status = status
	r.mu.Unlock()
	if err := r.save(ctx); err != nil {
		r.e.logger.WarnContext(ctx, "execution state not saved", "execution", r.rec.ID, "err", err)
	}
	r.e.observer.ExecutionEntered(status)
	r.e.emit(ctx, r.rec.ID, EventState, data)
}

// pathEnded ends the fresh: path leases of a parallel path. A path that
// parked keeps them, still renewed, for the run to park with (runEnded).
// A path cut short by the run stopping (fenced, storage) keeps them,
// unrenewed, for the run that takes over. Otherwise the path is over (it
// succeeded, failed, lost an "any" race or was cancelled) and they go back
// at once: a failed run holds no browser until the reclaim window.
func (r *run) pathEnded(ctx context.Context, fr *frame, err error) {
	if errors.Is(err, errWaiting) {
		return
	}
	keep := interruption(err) || interruption(context.Cause(ctx))
	r.endLeases(func(hl *heldLease) bool {
		return hl.scope != "" && (hl.scope == fr.scope || strings.HasPrefix(hl.scope, fr.scope+"/"))
	}, !keep)
}

// runEnded ends every lease of the run: given back when it succeeded or
// was cancelled; kept, no longer renewed, when it failed, so a resume
// within the reclaim window takes them back; kept and still renewed while
// it waits for a person (parkLease).
func (r *run) runEnded(ctx context.Context, err error) {
	release := err == nil || errors.Is(context.Cause(ctx), errCancelled) || errors.Is(err, errCancelled)
	r.parking = errors.Is(err, errWaiting) && context.Cause(ctx) == nil
	r.endLeases(func(*heldLease) bool { return true }, release)
}

// parkLease keeps renewing, from this process, the lease of an execution
// that waits for a person (an approval): a wait is not a crash, and may
// be longer than the reclaim window. It stops when the execution no longer
// waits (its resume takes the lease back and renews it itself), when the
// lease is lost, or when the workers stop; a process that dies stops it
// too, so the lease is then reclaimed as any other. An execution
// cancelled while it waited is not run again, so the lease goes back as
// soon as Cancel's message comes (else at the next renewal), rather than
// after the reclaim window: Cancel sets the execution's cancel flag before
// it publishes, so the message means the execution will not run on.
func (e *Executions) parkLease(id string, hl *heldLease) {
	life := e.life
	if life == nil {
		life = context.Background()
	}
	go func() {
		cancels, unlisten := e.notify.listen(life, e.cancelKey(id))
		defer unlisten()
		t := time.NewTicker(hl.lease.RenewEvery())
		defer t.Stop()
		for {
			select {
			case <-life.Done():
				return
			case <-cancels:
				ctx, cancel := context.WithTimeout(life, 10*time.Second)
				e.giveBack(ctx, id, hl)
				cancel()
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(life, 10*time.Second)
			ex, err := e.Get(ctx, id)
			if err == nil && ex.Status == ExecCancelled {
				e.giveBack(ctx, id, hl)
			}
			if err == nil && ex.Status != ExecWaiting {
				cancel()
				return
			}
			err = hl.lease.Renew(ctx)
			cancel()
			if errors.Is(err, connect.ErrLeaseLost) {
				return
			}
			if err != nil {
				e.logger.WarnContext(inExecution(id), "renewing the lease of a waiting execution failed; retrying", "execution", id, "lease", hl.rec.ID, "err", err)
			}
		}
	}()
}

// giveBack releases the lease of an execution that ended while parked.
// Its token fences it: a lease that a later run released, or that was
// reclaimed and granted again, is left alone.
func (e *Executions) giveBack(ctx context.Context, id string, hl *heldLease) {
	if err := hl.lease.Release(ctx); err != nil {
		e.logger.WarnContext(inExecution(id), "lease of a cancelled execution not given back; it is reclaimed after the window", "execution", id, "lease", hl.rec.ID, "err", err)
		return
	}
	e.logger.InfoContext(inExecution(id), "lease of a cancelled execution given back", "execution", id, "holder", hl.rec.Holder, "lease", hl.rec.ID)
}

func (r *run) endLeases(match func(*heldLease) bool, release bool) {
	ls := &r.leases
	ls.mu.Lock()
	var ended []*heldLease
	for holder, hl := range ls.held {
		select {
		case <-hl.ready:
		default:
			continue // still acquiring: its path has not ended
		}
		if hl.lease == nil || !match(hl) {
			continue
		}
		ended = append(ended, hl)
		delete(ls.held, holder)
	}
	ls.mu.Unlock()
	for _, hl := range ended {
		close(hl.stop)
		hl.wg.Wait()
		if r.heldAcross(hl) {
			// Its holder outlives the run: kept for the next one, which
			// takes it back (acquire), renewed meanwhile by the holder's
			// owner (RenewHeld).
			hl.lease.Keep()
			r.e.held.Store(hl.rec.Holder, hl.rec)
			continue
		}
		if !release {
			hl.lease.Keep()
			if r.parking {
				r.e.parkLease(r.rec.ID, hl)
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := hl.lease.Release(ctx)
		cancel()
		if err != nil {
			r.e.logger.WarnContext(inExecution(r.rec.ID), "lease not given back; it is reclaimed after the window", "execution", r.rec.ID, "holder", hl.rec.Holder, "err", err)
			continue
		}
		r.mu.Lock()
		r.rec.Leases = slices.DeleteFunc(r.rec.Leases, func(l connect.LeaseRecord) bool { return l.ID == hl.rec.ID })
		r.mu.Unlock()
		r.e.emit(context.Background(), r.rec.ID, EventLeaseReleased, map[string]any{"pool": hl.rec.Pool, "handle": hl.rec.Handle,
			"holder": hl.rec.Holder, "lease": hl.rec.ID})
	}
}
