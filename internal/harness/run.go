package harness

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// execute runs the execution id until it is terminal or waiting. It returns
// an error only when the run was cut short (storage failed, or the claim was
// lost) and should be retried from the ledger. A run that ended lets go of
// its claim and acknowledges the work item (item) in one round trip
// (acked); one cut short leaves the item pending.
func (e *Executions) execute(ctx context.Context, id, item string) (acked bool, err error) {
	// Listen before the claim reads the cancel flag, so a Cancel is seen
	// either by the flag or by the message.
	cancels, unlisten := e.notify.listen(ctx, e.cancelKey(id))
	defer unlisten()
	token := rand.Text()
	c, err := e.claimRun(ctx, id, token)
	if errors.Is(err, fault.ErrNotFound) {
		e.logger.Warn("work item for an unknown execution dropped", "execution", id)
		return false, nil
	}
	if err != nil {
		// errClaimed included: the item stays pending, because the runner
		// holding the claim may die before it finishes (or enqueues again
		// on release); a later claim of this item then takes over.
		return false, err
	}
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if c.cancelled {
		cancel(errCancelled)
	}
	stopRenew := e.renew(runCtx, cancel, id, token)
	stopWatch := e.watchCancel(runCtx, cancel, cancels)
	r := &run{e: e, rec: c.rec, epoch: c.epoch, synced: !c.legacy, expiring: c.ledger}
	if !e.clustered() {
		r.leave = &leave{token: token, item: item}
	}
	e.finished.begin(id)
	defer func() {
		var finished *Execution
		if r.handed {
			finished = &r.rec.Execution
		}
		e.finished.end(id, finished)
		stopWatch()
		stopRenew()
		if r.leave != nil && r.leave.done {
			acked = true // by the run's last save
			return
		}
		ack := ""
		if err == nil {
			ack = item
		}
		acked = e.releaseAck(ctx, id, token, ack)
	}()
	if c.rec.Status.Terminal() {
		return false, nil
	}
	runCtx, endRun := e.traceRun(runCtx, c.rec, c.epoch)
	defer func() { endRun(err) }()
	return false, r.execute(runCtx)
}

// run is the state of one run of an execution. Parallel paths share it;
// mu guards the record and the frames' step outputs.
type run struct {
	e     *Executions
	rec   *record
	epoch int64
	mu    sync.Mutex
	// saving serializes the run's saves (parallel paths save at once):
	// each sends what changed since the one before, so they must reach
	// Redis in the order they were taken, and a save that returns has
	// everything changed before it written.
	saving sync.Mutex
	// resets names costly connections to rebuild before their next call.
	resets map[string]bool
	// doc is the document being run; attached are the servers it brought,
	// connected on first use and closed when the run ends.
	doc      *document.Document
	attached map[string]*registry.Connection
	// leases are the pool leases the run holds (see handles.go).
	leases leaseSet
	// parking: the run ends waiting for a person, so its kept leases are
	// still renewed (parkLease).
	parking bool
	// held are events written with the next save (see beginHeld).
	held []event
	// What the ledger hash holds, so a save writes only what changed
	// (see saveWith): synced is false until the hash holds the entries
	// as loaded (a run made without the worker's claim, a record written
	// before the ledger had a hash), and the first save then rewrites it
	// whole; dirty are the positions changed since the last save;
	// expiring: the hash exists with its retention set.
	synced   bool
	dirty    []int
	expiring bool
	// head is what a run changes of the head (mutableHead) as last
	// saved, and headAt when: a save whose head is unchanged does not
	// send it, unless half the retention has passed (the head's expiry is
	// renewed with it).
	head   []byte
	headAt time.Time
	// leave: a worker's run lets go of its claim and work item with its
	// last save (see saveLast).
	leave *leave
	// closing: the next save is the last of a turn on a thread, and
	// closes the thread (see threads.go).
	closing bool
	// soon is saveSoon's timer (armed while changes wait for a save);
	// broken is the error of a timer's save, returned by the next one.
	soon      *time.Timer
	soonArmed bool
	broken    error
	// handed: the run finished the execution and saved it; its record
	// goes to the waiters in this process (handoff.go).
	handed bool
}

// errWaiting unwinds a run whose execution waits for a person.
var errWaiting = errors.New("execution waits")

// errParked unwinds a path that stopped because a sibling parked: a wait
// stops listening, its cursor and deadline kept in its entry (see the
// package doc). It is errWaiting to everything above the path.
var errParked = fmt.Errorf("a parallel path parked: %w", errWaiting)

// interruption reports whether err stops a run without being a step's own
// outcome: the run parks, lost its claim, or could not reach storage. The
// ledger entry of the step it cut short stays as it was, so the next run
// continues the step rather than replaying a failure.
func interruption(err error) bool {
	return errors.Is(err, errWaiting) || errors.Is(err, ErrFenced) || isStorage(err)
}

func (r *run) execute(ctx context.Context) error {
	if r.rec.StartedAt == nil {
		now := time.Now().UTC()
		r.rec.StartedAt = &now
	}
	r.rec.Status = ExecRunning
	// Written at once, not with the first call (saveSoon): a run may spend
	// long in its first expression or model turn, and whoever looks must
	// see it running.
	if err := r.saveWith(ctx, "", event{EventState, map[string]any{"status": ExecRunning, "epoch": r.epoch}}); err != nil {
		return err
	}
	r.e.observer.ExecutionEntered(ExecRunning)
	r.e.logger.InfoContext(ctx, "execution running", "execution", r.rec.ID, "epoch", r.epoch)

	doc, err := document.ParseDocument(r.rec.Workflow, r.e.reg, "/workflow")
	if err == nil {
		if problems := document.ResolveSetups(doc, r.e.reg, r.rec.Input, "/workflow"); len(problems) > 0 {
			err = &fault.ValidationError{Problems: problems}
		}
	}
	var out any
	if err == nil {
		r.doc = doc
		out, err = r.node(ctx, &frame{steps: map[string]any{}, ctx: ctx}, doc.Root)
		// Leases and attached servers end before the outcome is written, so
		// whoever sees the execution finished also sees them let go.
		r.runEnded(ctx, err)
		r.detach()
	}
	switch {
	case errors.Is(context.Cause(ctx), errCancelled):
		return r.finish(ctx, nil, errCancelled)
	case errors.Is(err, errWaiting):
		r.mu.Lock() // saveSoon's timer may be saving
		r.rec.Status, r.rec.Rerun = ExecWaiting, nil
		r.mu.Unlock()
		if err := r.saveLast(ctx, ""); err != nil {
			return err
		}
		r.e.observer.ExecutionEntered(ExecWaiting)
		r.e.emit(ctx, r.rec.ID, EventState, map[string]any{"status": ExecWaiting})
		return nil
	case errors.Is(err, ErrFenced), errors.Is(context.Cause(ctx), ErrFenced), isStorage(err):
		return err
	}
	return r.finish(ctx, out, err)
}

func (r *run) finish(ctx context.Context, out any, runErr error) error {
	ctx = context.WithoutCancel(ctx)
	now := time.Now().UTC()
	r.mu.Lock() // saveSoon's timer may be saving
	r.rec.FinishedAt, r.rec.Rerun = &now, nil
	r.rec.Status, r.rec.Output = ExecSucceeded, r.e.redact(out)
	switch {
	case errors.Is(runErr, errCancelled):
		r.rec.Status, r.rec.Output = ExecCancelled, nil
		r.rec.Error = &ExecError{Code: fault.Cancelled, Message: "cancelled on request"}
	case runErr != nil:
		r.rec.Status, r.rec.Output, r.rec.Error = ExecFailed, nil, asExecError(runErr)
		r.rec.Error.Message = r.e.redactor.String(r.rec.Error.Message)
	}
	data := map[string]any{"status": r.rec.Status}
	if r.rec.Error != nil {
		data["error"] = r.rec.Error
	}
	r.closing = r.rec.Thread != ""
	r.mu.Unlock()
	if err := r.saveLast(ctx, r.e.doneKey(r.rec.ID), event{EventFinished, data}); err != nil {
		return err
	}
	r.handed = true
	if r.closing && r.e.clustered() {
		// Another slot: the close follows the save (see threads.go).
		if err := r.e.EndTurn(ctx, r.rec.Thread, r.rec.ID); err != nil {
			r.e.logger.Warn("could not close the thread of a finished turn; the inbox closes it when it sees the turn ended", "execution", r.rec.ID, "err", err)
		}
	}
	r.e.observer.ExecutionEntered(r.rec.Status)
	started := now
	if r.rec.StartedAt != nil {
		started = *r.rec.StartedAt
	}
	r.e.logger.InfoContext(ctx, "execution finished", "execution", r.rec.ID, "status", r.rec.Status, "duration", now.Sub(started))
	return nil
}

func (r *run) node(ctx context.Context, f *frame, n *document.Node) (any, error) {
	var out any
	var err error
	ctx, step := r.traceStep(ctx, f, n)
	defer step.end(&err)
	switch n.Kind {
	case document.KindSequence:
		for _, s := range n.Steps {
			if out, err = r.node(ctx, f, s); err != nil {
				return nil, err
			}
		}
	case document.KindCall:
		out, err = r.call(ctx, f, n)
	case document.KindParallel:
		out, err = r.parallel(ctx, f, n)
	case document.KindVerify:
		out, err = r.verify(ctx, f, n)
	case document.KindWait:
		out, err = r.wait(ctx, f, n)
	case document.KindModel:
		out, err = r.model(ctx, f, n)
	case document.KindACPAgent:
		out, err = r.acpAgent(ctx, f, n)
	default:
		err = &stepError{step: n.ID, code: fault.StepFailed, err: fmt.Errorf("kind %q cannot run", n.Kind)}
	}
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	f.steps[n.ID] = out
	r.mu.Unlock()
	return out, nil
}

// entry returns the index of the ledger entry of key, or -1. Callers hold
// r.mu.
func (r *run) entry(key string) int {
	for i := range r.rec.Steps {
		if r.rec.Steps[i].Key == key {
			return i
		}
	}
	return -1
}

// update changes the ledger entry of key under the lock.
func (r *run) update(key string, fn func(st *StepRecord)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i := r.entry(key); i >= 0 {
		fn(&r.rec.Steps[i])
		r.dirty = append(r.dirty, i)
	}
}

// replayed returns a recorded outcome: a done entry's output, or a failed
// entry's error. ok is false when the step must run.
func (r *run) replayed(key string, n *document.Node) (out any, err error, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.entry(key)
	if i < 0 {
		return nil, nil, false
	}
	st := r.rec.Steps[i]
	if st.Status == StepDone {
		if err := r.checkIdentity(i); err != nil {
			return nil, err, true
		}
		if r.entry(key) < 0 {
			return nil, nil, false // discarded: run live
		}
	}
	switch st.Status {
	case StepDone:
		return st.Output, nil, true
	case StepFailed:
		return nil, &stepError{step: n.ID, code: st.Error.Code, err: errors.New(st.Error.Message), gate: st.Error.Gate}, true
	}
	return nil, nil, false
}

// errIdentityChanged refuses to resume over results recorded against a
// connection that has been replaced.
var errIdentityChanged = errors.New("connection replaced since its results were recorded")

// checkIdentity applies the connection's determinism when the done entry i
// was recorded against another instance of its connection. Callers hold
// r.mu.
func (r *run) checkIdentity(i int) error {
	st := r.rec.Steps[i]
	if st.Identity == nil || st.Connection == "" {
		return nil
	}
	conn, err := r.e.reg.Get(st.Connection)
	if err != nil {
		return nil
	}
	now := conn.Identity()
	if now.Instance == "" || now.Instance == st.Identity.Instance {
		return nil // same thing, or an epoch-only change: results stand
	}
	mode := conn.Policy().Determinism
	switch {
	case mode == registry.Replayable:
		return nil
	case mode == registry.Costly || slices.Contains(r.rec.Rerun, st.Connection):
		// Everything from the first affected entry on runs live; a costly
		// connection is reset first, so it starts from a clean world.
		r.truncate(i)
		if mode == registry.Costly {
			if r.resets == nil {
				r.resets = map[string]bool{}
			}
			r.resets[st.Connection] = true
		}
		return nil
	}
	return &stepError{step: st.ID, code: "resume_refused", err: fmt.Errorf(
		"%w: %s (was instance %s, now %s); resume with rerun [%q] to run it live", errIdentityChanged, st.Connection, st.Identity.Instance, now.Instance, st.Connection)}
}

// begin makes sure the step has a ledger entry, and reports it started.
func (r *run) begin(n *document.Node, key, conn string) {
	if ev, ok := r.enter(n, key, conn); ok {
		r.e.emit(context.Background(), r.rec.ID, ev.typ, ev.data)
	}
}

// beginHeld is begin for a step that saves the record soon (a call writes
// its pending entry before it is sent, or its failure): its started event
// goes out with that save, in the same round trip.
func (r *run) beginHeld(n *document.Node, key, conn string) {
	if ev, ok := r.enter(n, key, conn); ok {
		r.mu.Lock()
		r.held = append(r.held, ev)
		r.mu.Unlock()
	}
}

// enter adds the step's ledger entry unless it has one, and returns its
// started event.
func (r *run) enter(n *document.Node, key, conn string) (event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.entry(key) >= 0 {
		return event{}, false
	}
	r.rec.Steps = append(r.rec.Steps, StepRecord{
		Key: key, ID: n.ID, Kind: n.Kind, Connection: conn, Op: n.Op,
		IdempotencyKey: r.rec.ID + ":" + key, StartedAt: time.Now().UTC(),
	})
	r.dirty = append(r.dirty, len(r.rec.Steps)-1)
	return event{EventStepStarted, map[string]any{"key": key, "id": n.ID, "connection": conn, "op": n.Op}}, true
}

func (r *run) done(ctx context.Context, key string, n *document.Node, out any) (any, error) {
	r.update(key, func(st *StepRecord) {
		finished := time.Now().UTC()
		st.Status, st.Output, st.FinishedAt, st.DurationMs = StepDone, out, &finished, finished.Sub(st.StartedAt).Milliseconds()
	})
	if err := r.saveSoon(ctx, event{EventStepFinished, map[string]any{"key": key, "id": n.ID, "status": StepDone}}); err != nil {
		return nil, err
	}
	return out, nil
}

func (r *run) fail(ctx context.Context, key string, n *document.Node, err error) error {
	if cause := context.Cause(ctx); cause != nil && interruption(cause) {
		// Cut short by the run stopping (fenced, storage), not failed:
		// the step runs again, with its idempotency key, when resumed.
		return cause
	}
	se := asStepError(n.ID, err)
	r.update(key, func(st *StepRecord) {
		finished := time.Now().UTC()
		st.Status, st.Error = StepFailed, asExecError(se)
		st.Error.Message = r.e.redactor.String(st.Error.Message)
		st.FinishedAt, st.DurationMs = &finished, finished.Sub(st.StartedAt).Milliseconds()
	})
	if serr := r.saveWith(ctx, "", event{EventStepFinished, map[string]any{"key": key, "id": n.ID, "status": StepFailed, "error": asExecError(se)}}); serr != nil {
		return serr
	}
	return se
}

// stepError is a step's failure with the kind shown in the execution.
type stepError struct {
	step string
	code string
	gate int
	err  error
}

func (e *stepError) Error() string { return "step " + e.step + ": " + e.err.Error() }

func (e *stepError) Unwrap() error { return e.err }

func asStepError(step string, err error) *stepError {
	var se *stepError
	if errors.As(err, &se) {
		return se
	}
	var d *fault.Denied
	if errors.As(err, &d) {
		return &stepError{step: step, code: fault.SteeringDenied, gate: d.Gate, err: err}
	}
	return &stepError{step: step, code: callErrorKind(err), err: err}
}

func asExecError(err error) *ExecError {
	var se *stepError
	if errors.As(err, &se) {
		return &ExecError{Code: se.code, Message: se.err.Error(), Step: se.step, Gate: se.gate}
	}
	var ve *fault.ValidationError
	if errors.As(err, &ve) {
		return &ExecError{Code: string(ve.Code()), Message: ve.Error()}
	}
	return &ExecError{Code: fault.StepFailed, Message: err.Error()}
}

func callErrorKind(err error) string {
	switch {
	case errors.Is(err, connect.ErrUnavailable):
		return fault.ConnectionUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return fault.Timeout
	case errors.Is(err, context.Canceled):
		return fault.Cancelled
	}
	return fault.StepFailed
}

func outcome(err error) string {
	var ce *connect.CallError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ce):
		return "error"
	default:
		return "failure"
	}
}
