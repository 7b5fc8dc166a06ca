package harness

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// frame is what one path of a run sees: the outputs of the steps before it
// and, in a fan-out, its connection.
type frame struct {
	steps  map[string]any
	item   string // the fan-out's connection
	suffix string // appended to ledger keys inside a fan-out: "@<item>"
	scope  string // the parallel path fresh: path leases belong to
	// ctx is the path's context, so that its expressions stop when the
	// path is cancelled; nil (the root, for now) is context.Background,
	// and each expression is still bounded by sandbox.MaxDuration.
	ctx context.Context
}

func (f *frame) child(item string) *frame {
	c := &frame{steps: make(map[string]any, len(f.steps)), item: f.item, suffix: f.suffix, scope: f.scope, ctx: f.ctx}
	for k, v := range f.steps {
		c.steps[k] = v
	}
	if item != "" {
		c.item, c.suffix = item, f.suffix+"@"+item
	}
	return c
}

func (r *run) scope(f *frame) document.Scope {
	return document.Scope{Input: r.rec.Input, Steps: f.steps, Item: f.item, Ctx: f.ctx}
}

// parallel runs the paths (or the fan-out's steps per connection) at once.
// "all" fails on the first failure and cancels the rest; "any" takes the
// first success and cancels the rest. A path that parks (it waits for a
// person) cancels nothing: the others run on until each ends or parks too,
// and then the parallel parks (see the package doc).
func (r *run) parallel(ctx context.Context, f *frame, n *document.Node) (any, error) {
	type job struct {
		path *document.Node
		fr   *frame
	}
	var jobs []job
	if len(n.Over) > 0 {
		for _, item := range n.Over {
			jobs = append(jobs, job{n.Paths[0], f.child(item)})
		}
	} else {
		for _, p := range n.Paths {
			jobs = append(jobs, job{p, f.child("")})
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ctx, park := parkScope(ctx)
	defer park(nil)
	results := make([]any, len(jobs))
	errs := make([]error, len(jobs))
	var (
		wg     sync.WaitGroup
		once   sync.Once
		winner = -1
	)
	for i, j := range jobs {
		j.fr.scope = f.scope + "/" + n.ID + "/" + strconv.Itoa(i)
		j.fr.ctx = ctx
		wg.Go(func() {
			results[i], errs[i] = r.node(ctx, j.fr, j.path)
			err := errs[i]
			switch {
			case errors.Is(err, errWaiting):
				park(errParked) // the others stop only where they would wait
				return          // its leases end with the parallel (below)
			case n.Mode == "any" && err == nil:
				once.Do(func() { winner = i; cancel(errAnyWon) })
			case err != nil && (n.Mode == "all" || interruption(err)):
				cancel(err)
			}
			r.pathEnded(ctx, j.fr, err)
		})
	}
	wg.Wait()
	out, err := r.joined(n, errs, results, winner)
	for i, j := range jobs {
		if errors.Is(errs[i], errWaiting) {
			r.pathEnded(ctx, j.fr, err) // kept while the parallel parks
		}
	}
	if err != nil {
		return nil, err
	}
	if len(n.Over) == 0 && n.Mode != "any" {
		r.mu.Lock()
		for _, j := range jobs {
			maps.Copy(f.steps, j.fr.steps)
		}
		r.mu.Unlock()
	}
	if n.Merge != nil {
		sc := r.scope(f)
		if n.Mode == "any" {
			sc.Results = []any{out}
		} else {
			sc.Results = results
		}
		merged, err := n.Merge.Eval(sc)
		if err != nil {
			return nil, &stepError{step: n.ID, code: fault.StepFailed, err: err}
		}
		out = merged
	}
	return out, nil
}

// joined is the outcome of a parallel's paths: a run that stops (fenced,
// storage) before anything; then "any"'s winner; then a failure; then a
// park, when a path waits and none of the others failed.
func (r *run) joined(n *document.Node, errs []error, results []any, winner int) (any, error) {
	var waiting error
	for _, err := range errs {
		switch {
		case errors.Is(err, ErrFenced) || isStorage(err):
			return nil, err
		case errors.Is(err, errWaiting) && waiting == nil:
			waiting = err
		}
	}
	switch {
	case n.Mode == "any" && winner >= 0:
		return results[winner], nil
	case n.Mode == "any" && waiting != nil:
		return nil, waiting // a parked path may still win
	case n.Mode == "any":
		return nil, firstReal(errs)
	}
	if err := firstReal(errs); err != nil {
		return nil, err
	}
	if waiting != nil {
		return nil, waiting
	}
	return results, nil
}

// errAnyWon cancels the losing paths of an "any" parallel.
var errAnyWon = errors.New("another path finished first")

// firstReal is the first failure that is not a path cancelled because
// another finished or failed first; parked paths are not failures.
func firstReal(errs []error) error {
	var fallback error
	for _, err := range errs {
		if err == nil || errors.Is(err, errWaiting) {
			continue
		}
		if fallback == nil {
			fallback = err
		}
		if !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return fallback
}

// parkKey holds, in the context of a parallel's paths, the context that is
// done (cause errParked) once one of them, or of an enclosing parallel's,
// parked.
type parkKey struct{}

// parkScope returns ctx for the paths of a new parallel, and the function
// that tells them a path parked. It inherits the enclosing parallel's
// signal, so a park anywhere above reaches nested paths too.
func parkScope(ctx context.Context) (context.Context, context.CancelCauseFunc) {
	parent, ok := ctx.Value(parkKey{}).(context.Context)
	if !ok {
		parent = context.Background()
	}
	sig, park := context.WithCancelCause(parent)
	return context.WithValue(ctx, parkKey{}, sig), park
}

// parking reports whether a sibling path (of this or an enclosing
// parallel) parked: what would wait long stops, and parks too.
func parking(ctx context.Context) bool {
	sig, ok := ctx.Value(parkKey{}).(context.Context)
	return ok && sig.Err() != nil
}

// verify checks its claims until they all hold or its timeout passes. The
// result is one ledger entry: a replay returns the recorded subject.
func (r *run) verify(ctx context.Context, f *frame, n *document.Node) (any, error) {
	key := n.ID + f.suffix
	if out, err, ok := r.replayed(key, n); ok {
		return out, err
	}
	r.begin(n, key, "")
	deadline := time.Now().Add(n.Timeout)
	for {
		subject, err := r.subject(ctx, f, n)
		reason := ""
		if err == nil {
			reason = r.judge(n, f, subject)
			if reason == "" {
				return r.done(ctx, key, n, subject)
			}
		}
		if errors.Is(err, ErrFenced) || isStorage(err) {
			return nil, err
		}
		if time.Now().Add(n.Every).After(deadline) || ctx.Err() != nil {
			if err == nil {
				err = errors.New(reason)
			}
			return nil, r.fail(ctx, key, n, &stepError{step: n.ID, code: fault.StepFailed, err: fmt.Errorf("verify timed out after %s: %w", n.Timeout, err)})
		}
		Sleep(ctx, n.Every)
	}
}

func (r *run) subject(ctx context.Context, f *frame, n *document.Node) (any, error) {
	if n.Of != "" {
		r.mu.Lock()
		defer r.mu.Unlock()
		return f.steps[n.Of], nil
	}
	if n.Subject.Kind == document.KindRead {
		ctx, span := r.traceRead(ctx, "read", n.Subject.Connection, n.Subject.Op)
		rd, err := r.takeRead(ctx, f, n.ID, n.Subject.Connection, n.Subject.Op)
		if err != nil {
			span.end("", 0, err)
			return nil, err
		}
		span.end("", agent.EstimateTokens(rd.Text), nil)
		return rd.Value, nil
	}
	out, _, err := r.send(ctx, f, n.Subject, nil)
	return out, err
}

// judge returns "" when every claim holds, else which one did not and why.
func (r *run) judge(n *document.Node, f *frame, subject any) string {
	sc := r.scope(f)
	for i, c := range n.Claims {
		if ok, why := c.Holds(subject, sc); !ok {
			return fmt.Sprintf("claim %d (%s) did not hold: %s", i, c.Path, why)
		}
	}
	return ""
}
