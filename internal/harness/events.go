package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// Event types on an execution's stream.
const (
	EventState           = "execution.state"    // {status}
	EventStepStarted     = "step.started"       // {key, id, connection, op}
	EventStepFinished    = "step.finished"      // {key, id, status, error?}
	EventApprovalRequest = "approval.requested" // {approval, step, op}
	EventFinished        = "execution.finished" // {status, error?}: the last event
	// EventStepTask reports a call the server runs as a task (MCP Tasks):
	// once when the task starts, then on each change of its status or
	// message.
	EventStepTask = "step.task" // {key, id, task, status, message?}
)

// maxEvents bounds an execution's event stream (approximate trimming).
const maxEvents = 1000

// Event is one entry of an execution's event stream.
type Event struct {
	ID   string         `json:"id"` // the Redis stream id: resume after it
	Type string         `json:"type"`
	Data map[string]any `json:"data"`
}

func (e *Executions) eventsKey(id string) string { return e.store.Key("{exec:"+id+"}", "events") }

// emit appends a redacted event to the execution's stream and announces
// it on the channel of the same name, which followers of the stream
// watch (see Follow). Events are progress reports: a failure to write one
// is logged, not fatal.
func (e *Executions) emit(ctx context.Context, exec, typ string, data map[string]any) {
	raw, err := json.Marshal(e.redact(data))
	if err != nil {
		return
	}
	key := e.eventsKey(exec)
	_, err = e.store.Client.Pipelined(context.WithoutCancel(ctx), func(p redis.Pipeliner) error {
		p.XAdd(ctx, &redis.XAddArgs{Stream: key, MaxLen: maxEvents, Approx: true, Values: map[string]any{"type": typ, "data": raw}})
		p.PExpire(ctx, key, e.retention)
		p.Publish(ctx, key, "")
		return nil
	})
	if err != nil {
		e.logger.WarnContext(ctx, "execution event not written", "execution", exec, "type", typ, "err", err)
	}
}

// ErrInvalidEventID is returned for a resume point that is not an event id
// (a Redis stream id, "<ms>-<seq>" or "<ms>"): a client error, which Redis
// would otherwise answer as a failure.
var ErrInvalidEventID = errors.New("invalid event id")

// ValidEventID reports whether s has the form of an event id.
func ValidEventID(s string) bool {
	ms, seq, found := strings.Cut(s, "-")
	if _, err := strconv.ParseUint(ms, 10, 64); err != nil {
		return false
	}
	if found {
		_, err := strconv.ParseUint(seq, 10, 64)
		return err == nil
	}
	return true
}

// Events returns the events after the stream id `after` ("" or "0": from
// the start), waiting up to block for new ones when there are none (as a
// Follow would, holding no pooled connection meanwhile). An unknown
// execution is ErrNotFound; an `after` that is no event id is
// ErrInvalidEventID.
func (e *Executions) Events(ctx context.Context, exec, after string, block time.Duration) ([]Event, error) {
	if block > 0 {
		f, err := e.Follow(ctx, exec, after)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return f.Next(ctx, block)
	}
	after, err := e.checkFollow(ctx, exec, after)
	if err != nil {
		return nil, err
	}
	return e.readEvents(ctx, exec, after)
}

// checkFollow checks a resume point and that the execution exists, and
// returns the resume point as a stream id.
func (e *Executions) checkFollow(ctx context.Context, exec, after string) (string, error) {
	if after == "" {
		after = "0"
	}
	if !ValidEventID(after) {
		return "", fmt.Errorf("events of %s after %.40q: %w", exec, after, ErrInvalidEventID)
	}
	if n, err := e.store.Client.Exists(ctx, e.recordKey(exec)).Result(); err != nil {
		return "", fmt.Errorf("executions: events %s: %w", exec, err)
	} else if n == 0 {
		return "", fmt.Errorf("execution %s: %w", exec, fault.ErrNotFound)
	}
	return after, nil
}

// readEvents reads up to 100 events after `after`, without blocking: a
// blocking XREAD would hold a pooled connection for as long as it waits,
// and a few dozen waiting readers would leave none for anything else.
func (e *Executions) readEvents(ctx context.Context, exec, after string) ([]Event, error) {
	streams, err := e.store.Client.XRead(ctx, &redis.XReadArgs{Streams: []string{e.eventsKey(exec), after}, Count: 100, Block: -1}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("executions: events %s: %w", exec, err)
	}
	var out []Event
	for _, s := range streams {
		for _, m := range s.Messages {
			ev := Event{ID: m.ID}
			ev.Type, _ = m.Values["type"].(string)
			if raw, ok := m.Values["data"].(string); ok {
				_ = json.Unmarshal([]byte(raw), &ev.Data)
			}
			out = append(out, ev)
		}
	}
	return out, nil
}

// EventFeed follows one execution's event stream for a reader that stays
// (an event stream served to a client). While it waits it holds no Redis
// connection: every event written is announced on a channel, which the
// process's one shared subscription watches for as long as some feed
// follows that execution, and a feed that hears it reads what is new
// without blocking. Announcements are hints: a feed also reads whenever
// Next's wait runs out, so one lost with a dropped subscription delays an
// event, never loses it.
type EventFeed struct {
	e     *Executions
	exec  string
	after string
	wake  <-chan struct{}
	stop  func()
}

// Follow opens a feed of exec's events after `after` ("" or "0": from the
// start). An unknown execution is ErrNotFound; an `after` that is no
// event id is ErrInvalidEventID. The caller must Close it.
func (e *Executions) Follow(ctx context.Context, exec, after string) (*EventFeed, error) {
	after, err := e.checkFollow(ctx, exec, after)
	if err != nil {
		return nil, err
	}
	// Watch before the first read, so an event written between the two
	// is heard.
	wake, stop := e.notify.watch(ctx, e.eventsKey(exec))
	return &EventFeed{e: e, exec: exec, after: after, wake: wake, stop: stop}, nil
}

// Next returns the events after the last one it returned (at most 100 at
// a time), in order, each once. When there are none it waits up to wait
// for some, and returns none if none came.
func (f *EventFeed) Next(ctx context.Context, wait time.Duration) ([]Event, error) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		evs, err := f.e.readEvents(ctx, f.exec, f.after)
		if err != nil || len(evs) > 0 {
			if len(evs) > 0 {
				f.after = evs[len(evs)-1].ID
			}
			return evs, err
		}
		select {
		case <-f.wake:
		case <-t.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Ended reports whether the execution is terminal; ErrNotFound once its
// record is gone (expired).
func (f *EventFeed) Ended(ctx context.Context) (bool, error) { return f.e.ended(ctx, f.exec) }

// Close stops following.
func (f *EventFeed) Close() { f.stop() }

// ErrNotResumable: resume was asked of an execution that is not failed.
var ErrNotResumable = errors.New("execution cannot be resumed")

// errCancelled is the cause of a run stopped by Cancel.
var errCancelled = errors.New("execution cancelled")

func (e *Executions) cancelKey(id string) string { return e.store.Key("{exec:"+id+"}", "cancel") }

// Cancel stops an execution promptly: a run in flight is told through Redis
// and cancels its in-flight call; an execution nobody runs (queued or
// waiting) is marked cancelled here. It returns the execution as it stands
// after at most a few seconds.
func (e *Executions) Cancel(ctx context.Context, id string) (*Execution, error) {
	ex, err := e.Get(ctx, id)
	if err != nil || ex.Status.Terminal() {
		return ex, err
	}
	if err := e.store.Client.Set(ctx, e.cancelKey(id), "1", e.retention).Err(); err != nil {
		return nil, fmt.Errorf("executions: cancel %s: %w", id, err)
	}
	e.store.Client.Publish(ctx, e.cancelKey(id), "cancel")
	// Nobody holds the execution: take it and write the cancellation.
	if err := e.cancelIdle(ctx, id); err != nil && !errors.Is(err, errClaimed) {
		return nil, err
	}
	return e.Wait(ctx, id, 5*time.Second)
}

func (e *Executions) cancelIdle(ctx context.Context, id string) error {
	token := "cancel-" + newExecutionID()
	epoch, err := e.claim(ctx, id, token)
	if err != nil {
		return err
	}
	defer e.release(ctx, id, token)
	rec, err := e.load(ctx, id)
	if err != nil || rec.Status.Terminal() {
		return err
	}
	r := &run{e: e, rec: rec, epoch: epoch}
	return r.finish(ctx, nil, errCancelled)
}

// watchCancel cancels a run when Cancel's message comes (msgs, from the
// process's shared subscription: not a connection per running
// execution). The caller listens before it reads the cancel flag, so a
// Cancel is seen either by the flag or by the message.
func (e *Executions) watchCancel(ctx context.Context, cancel context.CancelCauseFunc, msgs <-chan struct{}) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-msgs:
			cancel(errCancelled)
		case <-done:
		case <-ctx.Done():
		}
	}()
	return func() { close(done) }
}

// Resume runs a failed execution again from its ledger: done steps keep
// their results, the failed step and everything after it run anew. rerun
// names connections whose replaced identity may be run live for this run
// only (see the determinism rules).
func (e *Executions) Resume(ctx context.Context, id string, rerun []string) (*Execution, error) {
	token := "resume-" + newExecutionID()
	epoch, err := e.claim(ctx, id, token)
	if errors.Is(err, errClaimed) {
		return nil, fmt.Errorf("execution %s is running: %w", id, ErrNotResumable)
	}
	if err != nil {
		return nil, err
	}
	released := false
	defer func() {
		if !released {
			e.release(ctx, id, token)
		}
	}()
	rec, err := e.load(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.Status != ExecFailed {
		return nil, fmt.Errorf("execution %s is %s, not failed: %w", id, rec.Status, ErrNotResumable)
	}
	kept := rec.Steps[:0]
	for _, st := range rec.Steps {
		if st.Status == StepDone {
			kept = append(kept, st)
		}
	}
	rec.Steps, rec.Status, rec.Error, rec.Output, rec.FinishedAt, rec.Rerun = kept, ExecQueued, nil, nil, nil, rerun
	// synced is false: the save rewrites the ledger to the entries kept.
	r := &run{e: e, rec: rec, epoch: epoch}
	if err := r.save(ctx); err != nil {
		return nil, err
	}
	e.emit(ctx, id, EventState, map[string]any{"status": ExecQueued, "resumed": true})
	// Released before the work item goes out, so its worker can claim it.
	released = true
	e.release(ctx, id, token)
	if err := e.resume(ctx, id); err != nil {
		return nil, err
	}
	return &rec.Execution, nil
}
