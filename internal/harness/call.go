package harness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// call runs one call step through the gates, replaying the ledger: a done
// entry returns its recorded output without calling again; a pending one is
// re-sent with the same idempotency key; a waiting one checks its approval.
func (r *run) call(ctx context.Context, f *frame, n *document.Node) (any, error) {
	key := n.ID + f.suffix
	conn := n.Connection
	if n.ConnFromItem {
		conn = f.item
	}
	if err := r.recheckHandle(ctx, f, conn, key); err != nil {
		return nil, err
	}
	if out, err, ok := r.replayed(key, n); ok {
		return out, err
	}
	r.beginHeld(n, key, conn)
	ctx, span := r.traceCall(ctx, n, key, conn)
	started := time.Now()
	out, _, err := r.send(ctx, f, n, &key)
	span.end(err)
	if interruption(err) {
		return nil, err
	}
	r.e.observer.CallDone(conn, n.Op, outcome(err), time.Since(started))
	if err != nil {
		return nil, r.fail(ctx, key, n, err)
	}
	return r.done(ctx, key, n, out)
}

// send evaluates a call's arguments, passes the gates and sends it. With a
// ledger key, a guarded call asks for approval and the pending entry is
// written before the call leaves; without one (a verify's read) a guarded
// call is refused, since a check cannot wait for a person.
func (r *run) send(ctx context.Context, f *frame, n *document.Node, key *string) (any, connect.Identity, error) {
	args, conn, err := r.prepare(ctx, f, n)
	if err != nil {
		return nil, connect.Identity{}, err
	}
	marks := profileOp(n, conn)
	args, approval, err := r.passGates(ctx, n, conn, marks, args, key)
	if err != nil {
		return nil, connect.Identity{}, err
	}
	filled, err := r.e.pipeline.FillSecrets(ctx, args)
	if err != nil {
		return nil, connect.Identity{}, err
	}
	id, idemKey, err := r.pending(ctx, conn, key)
	if err != nil {
		return nil, id, err
	}
	req := connect.CallRequest{Op: n.Op, Args: filled.(map[string]any), IdempotencyKey: idemKey, Principal: r.rec.Principal, Approval: approval}
	return r.sendOnce(ctx, n, conn, id, marks, req, args, key)
}

// prepare evaluates a call's arguments and finds its connection, ready:
// reset first when a costly replay asked for it, refused when it acts as a
// user and the execution runs for no one.
func (r *run) prepare(ctx context.Context, f *frame, n *document.Node) (map[string]any, *registry.Connection, error) {
	r.mu.Lock()
	sc := r.scope(f)
	v, err := document.Object(n.Args).Eval(sc)
	r.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	name := n.Connection
	if n.ConnFromItem {
		name = f.item
	}
	conn, err := r.connFor(ctx, f, n.ID, name)
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	reset := r.resets[name]
	delete(r.resets, name)
	r.mu.Unlock()
	if reset {
		r.e.logger.InfoContext(ctx, "resetting a costly connection before running live", "execution", r.rec.ID, "connection", name)
		if err := conn.Reset(ctx); err != nil {
			return nil, nil, err
		}
	}
	if conn.Access().ActsAsUser() && forNoOne(r.rec.Principal) {
		// Hidden, not unavailable: there is no user for it to act as.
		return nil, nil, fault.Deny(fault.GateDeclared, fmt.Sprintf("connection %s acts as a user and this execution runs for no principal", conn.Name()))
	}
	if st := conn.State(); st != connect.StateReady {
		return nil, nil, fmt.Errorf("connection %s is %s: %w", conn.Name(), st, connect.ErrUnavailable)
	}
	return v.(map[string]any), conn, nil
}

// passGates runs gates 1 to 5 for a call: the pipeline's checks, the
// profile's argument types, then a person when the policy or the server
// asked for one. It returns the arguments with refs opened and the
// approval the call goes out with ("" when none was needed).
func (r *run) passGates(ctx context.Context, n *document.Node, conn *registry.Connection, marks *profiles.Operation, args map[string]any, key *string) (map[string]any, string, error) {
	verdict, args, err := r.e.pipeline.Check(ctx, gates.Call{Conn: conn, Op: n.Op, Guarded: marks != nil && marks.Guarded, Args: args, Thread: r.refScope()})
	traceGates(ctx, verdict, err)
	if err != nil {
		return nil, "", err
	}
	if err := document.CheckProfileArgs(n, args); err != nil {
		return nil, "", err
	}
	switch {
	case verdict == gates.NeedsApproval && key == nil:
		return nil, "", fault.Deny(fault.GateApprover, "a verify read cannot wait for approval; the policy guards "+n.Op)
	case verdict == gates.NeedsApproval, key != nil && r.askedApproval(*key):
		// Either the policy asks a person, or the server refused this call
		// as guarded before the run parked: the call sent now is the
		// approved one, and only it (sent bare it would only be refused
		// again).
		if err := r.approve(ctx, n, *key, conn.Name(), args); err != nil {
			return nil, "", err
		}
		return args, gates.ApprovalID(r.rec.ID, *key), nil
	}
	return args, "", nil
}

// pending writes the call's pending entry before the call leaves, so a
// crash after sending is re-sent with the same idempotency key, never
// lost. A call without a ledger key (a verify's read) has none.
func (r *run) pending(ctx context.Context, conn *registry.Connection, key *string) (connect.Identity, string, error) {
	id := conn.Identity()
	idemKey := ""
	if key == nil {
		return id, "", nil
	}
	r.update(*key, func(st *StepRecord) { st.Status, st.Identity, idemKey = StepPending, &id, st.IdempotencyKey })
	return id, idemKey, r.save(ctx)
}

// sendOnce sends req, unless a once-only operation's outcome is already
// recorded (then it answers from the record); a call the server refuses as
// guarded is sent again, once, after a person approves it.
func (r *run) sendOnce(ctx context.Context, n *document.Node, conn *registry.Connection, id connect.Identity, marks *profiles.Operation, req connect.CallRequest, args map[string]any, key *string) (any, connect.Identity, error) {
	once := ""
	if marks != nil && marks.Once && req.IdempotencyKey != "" {
		once = r.e.onceKey(conn, n.Op, req.IdempotencyKey)
		o, ok, err := r.e.onceRecorded(ctx, once)
		if err != nil {
			return nil, id, r.storage(ctx, err)
		}
		if ok {
			// Sent before and its outcome recorded, but the ledger did
			// not hear of it: answered from the record, not sent again.
			out, err := o.replay()
			return r.answered(ctx, n, conn, id, out, err)
		}
	}
	if key != nil {
		req.Task = r.taskWatch(ctx, n, *key, true)
		req.Ask, req.Park = r.asker(n, *key, conn), true
		resume, err := r.inputAnswered(ctx, *key)
		if err != nil {
			return nil, id, err
		}
		req.Resume = resume
	}
	out, err := r.deliver(ctx, conn, req)
	for round := 0; key != nil && round < maxInputRounds; round++ {
		var ir *connect.InputRequired
		if !errors.As(err, &ir) {
			break
		}
		// The server asks in its answer (2026-07-28): questions nobody
		// need see are answered at once; the others park the run.
		resume, perr := r.parkOnInput(ctx, n, *key, conn, ir)
		if perr != nil {
			return nil, id, perr
		}
		req.Resume = resume
		out, err = r.deliver(ctx, conn, req)
	}
	if key != nil {
		r.update(*key, func(st *StepRecord) { st.Input = nil })
	}
	if guardedRefusal(err) && req.Approval == "" && key != nil {
		// The server guards this target: a person decides, and the call
		// is sent again, once, with the approval (a new call, so a new
		// task if the server makes one).
		if err := r.approve(ctx, n, *key, conn.Name(), args); err != nil {
			return nil, id, err
		}
		req.Approval = gates.ApprovalID(r.rec.ID, *key)
		req.Task = r.taskWatch(ctx, n, *key, false)
		out, err = r.deliver(ctx, conn, req)
	}
	if once != "" && recordable(err) {
		o := onceOutcome{Output: out, Op: n.Op}
		if ce := (*connect.CallError)(nil); errors.As(err, &ce) {
			o.Error = ce.Message
		}
		if rerr := r.e.onceRecord(ctx, once, o); rerr != nil {
			return nil, id, r.storage(ctx, rerr)
		}
	}
	return r.answered(ctx, n, conn, id, out, err)
}

// askedApproval reports whether ledger entry key asked a person before:
// its call waited for an approval.
func (r *run) askedApproval(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.entry(key)
	return i >= 0 && r.rec.Steps[i].ApprovalID != ""
}

// guardedRefusal reports whether err is a server refusing the call's
// target as guarded.
func guardedRefusal(err error) bool {
	var ce *connect.CallError
	return errors.As(err, &ce) && ce.Code == connect.CodeGuarded
}

// answered checks and presents a call's answer.
func (r *run) answered(ctx context.Context, n *document.Node, conn *registry.Connection, id connect.Identity, out any, err error) (any, connect.Identity, error) {
	if err != nil {
		return nil, id, err
	}
	if err := document.CheckProfileResult(n, conn.Name(), out); err != nil {
		return nil, id, err
	}
	out, err = r.e.pipeline.Present(ctx, out, conn, r.refScope())
	return withholdReadTool(conn, n.Op, out), id, err
}

// deliver sends req with the principal's credentials (gate 6's last
// part), replacing them once when the server rejects them.
func (r *run) deliver(ctx context.Context, conn *registry.Connection, req connect.CallRequest) (any, error) {
	headers, err := r.e.pipeline.CallerHeaders(ctx, conn, r.rec.Principal)
	if err != nil {
		return nil, err
	}
	req.Headers = headers
	out, err := conn.Call(ctx, req)
	if errors.Is(err, connect.ErrNeedsSignIn) && headers != nil {
		// The server rejected the principal's credentials before acting
		// (a token revoked before its expiry): replaced once, sent again.
		if fresh, ok := r.e.pipeline.RefreshHeaders(ctx, conn.Name(), r.rec.Principal, headers); ok {
			req.Headers = fresh
			out, err = conn.Call(ctx, req)
		}
		if errors.Is(err, connect.ErrNeedsSignIn) && conn.Access().SignIn == registry.SignInShared {
			// The shared token is refused even fresh: everyone's sign-in
			// is gone, so the connection says so until someone signs in.
			conn.NeedSignIn(r.e.redactor.String(err.Error()))
		}
	}
	return out, err
}

// conn returns the named connection: a server the document brought
// (attached on first use), else the host's.
func (r *run) conn(ctx context.Context, name string) (*registry.Connection, error) {
	r.mu.Lock()
	step, ok := r.attached[name] // a server the document or a model node attached
	r.mu.Unlock()
	if ok {
		return step, nil
	}
	var spec document.AttachSpec
	if r.doc != nil {
		spec, ok = r.doc.Attached[name]
	}
	if !ok {
		return r.e.reg.Get(name)
	}
	return r.attach(ctx, spec)
}

// attach connects a server the document or a model node brings, on first
// use. It joins the run's attached servers (so calls find it by name) and
// is closed when the run ends. The lock is not held while connecting; two
// paths that attach the same server at once keep the first.
func (r *run) attach(ctx context.Context, spec document.AttachSpec) (*registry.Connection, error) {
	r.mu.Lock()
	c, ok := r.attached[spec.Name]
	r.mu.Unlock()
	if ok {
		return c, nil
	}
	if r.e.attacher == nil {
		return nil, fault.Deny(fault.GateDeclared, fmt.Sprintf("this deployment does not attach servers that documents bring (%s)", spec.Name))
	}
	values := map[string]string{}
	for _, sec := range spec.Secrets() {
		if r.e.secrets == nil {
			return nil, fault.Deny(fault.GateSecrets, fmt.Sprintf("secret %q: no secret store is configured", sec))
		}
		v, err := r.e.secrets.Resolve(ctx, sec)
		if err != nil {
			return nil, fault.Deny(fault.GateSecrets, fmt.Sprintf("secret %q could not be resolved", sec))
		}
		r.e.redactor.Add(v)
		values[sec] = v
	}
	conn, err := r.e.attacher.Attach(ctx, spec, values)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %s", spec.Name, r.e.redactor.String(err.Error()))
	}
	c = registry.NewAttached(spec.Name, conn)
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.attached[spec.Name]; ok { // attached meanwhile by a parallel path
		_ = c.Close()
		return prev, nil
	}
	if r.attached == nil {
		r.attached = map[string]*registry.Connection{}
	}
	r.attached[spec.Name] = c
	return c, nil
}

// detach closes the servers the document brought.
func (r *run) detach() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, c := range r.attached {
		if err := c.Close(); err != nil {
			r.e.logger.Warn("closing an attached server", "execution", r.rec.ID, "connection", name, "err", err)
		}
	}
	r.attached = nil
}

// approve is gate 5: it asks for (or finds) the step's approval. It returns
// nil once approved, errWaiting while pending, and a refusal when denied or
// expired.
func (r *run) approve(ctx context.Context, n *document.Node, key, conn string, args map[string]any) error {
	now := time.Now().UTC()
	ap, err := r.e.approvals.Request(ctx, &gates.Approval{
		ID: gates.ApprovalID(r.rec.ID, key), State: gates.ApprovalPending, Execution: r.rec.ID, Step: n.ID,
		Connection: conn, Op: n.Op, Args: r.e.redact(jsonValueMap(args)).(map[string]any),
		RequestedBy: r.rec.Principal, CreatedAt: now, ExpiresAt: now.Add(r.e.approvalTTL),
	})
	if err != nil {
		return r.storage(ctx, err)
	}
	r.traceApproval(ctx, ap)
	switch ap.State {
	case gates.ApprovalApproved:
		return nil
	case gates.ApprovalPending:
		// The task that answered with the refusal is over: the approved
		// call is a new one.
		r.update(key, func(st *StepRecord) { st.Status, st.ApprovalID, st.Task = StepWaiting, ap.ID, "" })
		if err := r.save(ctx); err != nil {
			return err
		}
		r.e.emit(ctx, r.rec.ID, EventApprovalRequest, map[string]any{"approval": ap.ID, "step": n.ID, "connection": conn, "op": n.Op})
		return errWaiting
	}
	return fault.Deny(fault.GateApprover, fmt.Sprintf("approval %s was %s", ap.ID, ap.State))
}

// jsonValueMap shows evaluated arguments as JSON values (secrets as their
// placeholder), for approval records.
func jsonValueMap(args map[string]any) any {
	v := document.JSONValue(args)
	if m, ok := v.(map[string]any); ok {
		return m
	}
	return map[string]any{}
}
