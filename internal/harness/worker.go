package harness

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Run claims work items from the shared stream with n workers until ctx is
// done, then waits for the executions in flight to finish. Items are
// acknowledged only after their execution reached a terminal state, so an
// item held by a replica that dies stays pending for another to take over.
func (e *Executions) Run(ctx context.Context, n int) error {
	err := e.store.Client.XGroupCreateMkStream(ctx, e.workKey(), workGroup, "0").Err()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("executions: create work group: %w", err)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { e.work(ctx, fmt.Sprintf("%s-%d", e.consumer, i)) })
	}
	wg.Wait()
	return nil
}

func (e *Executions) work(ctx context.Context, consumer string) {
	for ctx.Err() == nil {
		streams, err := e.store.Client.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: workGroup, Consumer: consumer, Streams: []string{e.workKey(), ">"}, Count: 1, Block: time.Second,
		}).Result()
		if errors.Is(err, redis.Nil) || ctx.Err() != nil {
			continue
		}
		if err != nil {
			e.logger.Error("claim work", "err", err)
			sleep(ctx, time.Second)
			continue
		}
		for _, msg := range streams[0].Messages {
			e.handle(context.WithoutCancel(ctx), msg)
		}
	}
}

// handle runs one work item. It runs detached from the worker's context so
// a shutdown lets executions in flight finish rather than leaving them half
// done; calls are bounded by their own timeouts.
func (e *Executions) handle(ctx context.Context, msg redis.XMessage) {
	id, _ := msg.Values["id"].(string)
	if err := e.execute(ctx, id); err != nil {
		// Left unacknowledged: the item stays pending for a later claim.
		e.logger.Error("execution interrupted", "execution", id, "err", err)
		return
	}
	e.store.Client.XAck(ctx, e.workKey(), workGroup, msg.ID)
	e.store.Client.XDel(ctx, e.workKey(), msg.ID)
}

// execute runs the execution id to a terminal state. It returns an error
// only when the state could not be read or written.
func (e *Executions) execute(ctx context.Context, id string) error {
	rec, err := e.load(ctx, id)
	if errors.Is(err, ErrNotFound) {
		e.logger.Warn("work item for an unknown execution dropped", "execution", id)
		return nil
	}
	if err != nil || rec.Status.Terminal() {
		return err
	}
	now := time.Now().UTC()
	rec.Status, rec.StartedAt = ExecRunning, &now
	if err := e.save(ctx, rec); err != nil {
		return err
	}
	e.observer.ExecutionEntered(ExecRunning)
	e.logger.Info("execution started", "execution", id)

	r := &run{e: e, rec: rec, steps: map[string]any{}}
	doc, err := ParseDocument(rec.Workflow, e.reg, "/workflow")
	var out any
	if err == nil {
		out, err = r.node(ctx, doc.Root)
	}
	return e.finish(ctx, rec, out, err)
}

func (e *Executions) finish(ctx context.Context, rec *record, out any, runErr error) error {
	now := time.Now().UTC()
	rec.FinishedAt = &now
	rec.Status, rec.Output = ExecSucceeded, out
	if runErr != nil {
		rec.Status, rec.Output, rec.Error = ExecFailed, nil, asExecError(runErr)
	}
	if err := e.save(ctx, rec); err != nil {
		return err
	}
	e.observer.ExecutionEntered(rec.Status)
	e.store.Client.Publish(ctx, e.doneKey(rec.ID), string(rec.Status))
	e.logger.Info("execution finished", "execution", rec.ID, "status", rec.Status, "duration", now.Sub(*rec.StartedAt))
	return nil
}

// run is the state of one execution while it runs.
type run struct {
	e     *Executions
	rec   *record
	steps map[string]any // outputs of finished steps, by id
}

func (r *run) node(ctx context.Context, n *Node) (any, error) {
	switch n.Kind {
	case KindSequence:
		var out any
		for _, s := range n.Steps {
			var err error
			if out, err = r.node(ctx, s); err != nil {
				return nil, err
			}
		}
		r.steps[n.ID] = out
		return out, nil
	case KindCall:
		return r.call(ctx, n)
	}
	return nil, &stepError{step: n.ID, code: "STEP_FAILED", err: fmt.Errorf("kind %q cannot run", n.Kind)}
}

func (r *run) call(ctx context.Context, n *Node) (any, error) {
	started := time.Now().UTC()
	r.rec.Steps = append(r.rec.Steps, StepRecord{ID: n.ID, Kind: n.Kind, Connection: n.Connection, Op: n.Op, Status: "running", StartedAt: started})
	step := &r.rec.Steps[len(r.rec.Steps)-1]
	if err := r.e.save(ctx, r.rec); err != nil {
		return nil, err
	}
	out, err := r.send(ctx, n)
	finished := time.Now().UTC()
	step.FinishedAt, step.DurationMs = &finished, finished.Sub(started).Milliseconds()
	r.e.observer.CallDone(n.Connection, n.Op, outcome(err), finished.Sub(started))
	if err != nil {
		se := &stepError{step: n.ID, code: callErrorCode(err), err: err}
		step.Status, step.Error = "failed", asExecError(se)
		return nil, se
	}
	step.Status, step.Output = "succeeded", out
	r.steps[n.ID] = out
	if err := r.e.save(ctx, r.rec); err != nil {
		return nil, err
	}
	return out, nil
}

func (r *run) send(ctx context.Context, n *Node) (any, error) {
	sc := scope{Input: r.rec.Input, Steps: r.steps}
	args, err := object(n.Args).eval(sc)
	if err != nil {
		return nil, err
	}
	conn, err := r.e.reg.Get(n.Connection)
	if err != nil {
		return nil, err
	}
	return conn.Call(ctx, CallRequest{Op: n.Op, Args: args.(map[string]any), IdempotencyKey: r.rec.ID + ":" + n.ID})
}

// stepError is a step's failure with the code shown in the execution.
type stepError struct {
	step string
	code string
	err  error
}

func (e *stepError) Error() string { return "step " + e.step + ": " + e.err.Error() }
func (e *stepError) Unwrap() error { return e.err }

func asExecError(err error) *ExecError {
	var se *stepError
	if errors.As(err, &se) {
		return &ExecError{Code: se.code, Message: se.err.Error(), Step: se.step}
	}
	var ve *ValidationError
	if errors.As(err, &ve) {
		return &ExecError{Code: string(ve.Code()), Message: ve.Error()}
	}
	return &ExecError{Code: "EXECUTION_FAILED", Message: err.Error()}
}

func callErrorCode(err error) string {
	var ce *CallError
	var he *Error
	var xe *exprError
	switch {
	case errors.As(err, &ce):
		return "CALL_FAILED"
	case errors.Is(err, ErrUnavailable):
		return string(CodeConnectionUnavailable)
	case errors.As(err, &he):
		return string(he.Code)
	case errors.As(err, &xe):
		return "EXPRESSION_FAILED"
	case errors.Is(err, context.DeadlineExceeded):
		return "CALL_TIMEOUT"
	}
	return "CALL_ERROR"
}

func outcome(err error) string {
	var ce *CallError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ce):
		return "error"
	default:
		return "failure"
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
