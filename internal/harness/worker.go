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
// acknowledged only after their execution reached a terminal or waiting
// state, so an item held by a replica that dies stays pending; another
// replica takes it over after the visibility timeout and resumes from the
// ledger.
//
// One fetcher per process reads the stream for all the workers, as many
// items at a time as workers are idle, and hands them out: a worker does
// not hold a pooled Redis connection in a blocking read while it idles,
// so the pool serves the runs however many workers there are.
func (e *Executions) Run(ctx context.Context, n int) error {
	e.life = ctx
	err := e.store.Client.XGroupCreateMkStream(ctx, e.workKey(), workGroup, "0").Err()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("executions: create work group: %w", err)
	}
	idle := make(chan struct{}, n)
	items := make(chan redis.XMessage)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { e.work(ctx, idle, items) })
	}
	wg.Go(func() { e.fetch(ctx, idle, items) })
	wg.Go(func() { e.sweep(ctx) })
	wg.Go(func() { e.repairLoop(ctx) })
	wg.Wait()
	return nil
}

// sweep expires approvals nobody decided in time.
func (e *Executions) sweep(ctx context.Context) {
	for ctx.Err() == nil {
		e.approvals.Expire(ctx)
		e.questions.Expire(ctx)
		Sleep(ctx, e.sweepEvery)
	}
}

// work runs the items the fetcher hands it, saying on idle when it is
// ready for the next.
func (e *Executions) work(ctx context.Context, idle chan<- struct{}, items <-chan redis.XMessage) {
	for {
		select {
		case idle <- struct{}{}:
		case <-ctx.Done():
			return
		}
		select {
		case msg := <-items:
			e.handle(context.WithoutCancel(ctx), msg)
		case <-ctx.Done():
			return
		}
	}
}

// fetch reads work items for the idle workers and hands one to each. It
// reads only once a worker is idle, and no more items than workers are,
// so an item it reads starts at once rather than waiting in this process
// (where its idle time would run towards a takeover).
func (e *Executions) fetch(ctx context.Context, idle <-chan struct{}, items chan<- redis.XMessage) {
	w := &reclaim{cursor: "0-0"}
	ready := 0
	for ctx.Err() == nil {
		if ready == 0 {
			select {
			case <-idle:
				ready++
			case <-ctx.Done():
				return
			}
		}
		for more := true; more; {
			select {
			case <-idle:
				ready++
			default:
				more = false
			}
		}
		msgs, err := e.next(ctx, w, ready)
		if err != nil {
			if ctx.Err() == nil {
				e.logger.Error("claim work", "err", err)
				Sleep(ctx, time.Second)
			}
			continue
		}
		for _, msg := range msgs {
			select {
			case items <- msg:
				ready--
			case <-ctx.Done():
				return // still pending: taken over after the timeout
			}
		}
	}
}

// maxReclaimScans bounds the XAUTOCLAIM calls of one next: each looks at
// up to ten pending items (or count, when more), so one call of next
// covers at least 10,000 of them.
const maxReclaimScans = 1000

// reclaim is the fetcher's place in its scans of the pending list.
type reclaim struct {
	// cursor is where the current scan of the pending list goes on;
	// "0-0" between scans.
	cursor string
	// last is when the last scan ended.
	last time.Time
}

// next returns up to count work items: first those abandoned by a
// consumer that has held them past the visibility timeout, else new ones.
// XAUTOCLAIM looks at only ten pending items per call when asked for one,
// so next follows its cursor through the whole pending list (kept across
// calls in w) before it reads new items: otherwise an abandoned item
// behind ten held ones would never be found.
//
// A scan that found nothing is not repeated within pollEvery: a busy
// process would otherwise pay an XAUTOCLAIM for every read, while an
// abandoned item comes due only a whole visibility timeout after its last
// delivery, so looking once per poll keeps the takeover lag what it was
// (at most a poll).
func (e *Executions) next(ctx context.Context, w *reclaim, count int) ([]redis.XMessage, error) {
	if w.cursor == "0-0" && time.Since(w.last) < e.pollEvery() {
		return e.read(ctx, count)
	}
	cursor := &w.cursor
	for range maxReclaimScans {
		msgs, start, err := e.store.Client.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: e.workKey(), Group: workGroup, Consumer: e.consumer, MinIdle: e.visibility, Start: *cursor, Count: int64(count),
		}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			*cursor = "0-0"
			return nil, err
		}
		if start == "" {
			start = "0-0"
		}
		*cursor = start
		if len(msgs) > 0 {
			return msgs, nil
		}
		if start == "0-0" {
			break
		}
	}
	w.last = time.Now()
	return e.read(ctx, count)
}

// read waits up to pollEvery for up to count new work items.
func (e *Executions) read(ctx context.Context, count int) ([]redis.XMessage, error) {
	streams, err := e.store.Client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: workGroup, Consumer: e.consumer, Streams: []string{e.workKey(), ">"}, Count: int64(count), Block: e.pollEvery(),
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return streams[0].Messages, nil
}

// pollEvery is how long the fetcher waits for a new item before it looks
// for abandoned ones again: what a takeover may lag behind the moment the
// dead runner's claim lapsed. A second, or less under a short visibility
// timeout (tests), so the lag stays small beside the timeout.
func (e *Executions) pollEvery() time.Duration {
	return min(time.Second, max(e.visibility/4, 50*time.Millisecond))
}

// handle runs one work item. It runs detached from the worker's context so
// a shutdown lets executions in flight finish rather than leaving them half
// done; calls are bounded by their own timeouts.
func (e *Executions) handle(ctx context.Context, msg redis.XMessage) {
	id, _ := msg.Values["id"].(string)
	acked, err := e.execute(ctx, id, msg.ID)
	if err != nil {
		// Left unacknowledged: the item stays pending for a later claim.
		var held *heldError
		if errors.As(err, &held) {
			e.logger.Debug("execution is run elsewhere; its item waits", "execution", id, "for", held.left)
			e.retryAt(ctx, msg.ID, held.left)
			return
		}
		e.logger.Error("execution interrupted", "execution", id, "err", err)
		return
	}
	if !acked {
		e.ack(ctx, msg.ID)
	}
}

// ack acknowledges and deletes a work item.
func (e *Executions) ack(ctx context.Context, item string) {
	_, err := e.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.XAck(ctx, e.workKey(), workGroup, item)
		p.XDel(ctx, e.workKey(), item)
		return nil
	})
	if err != nil {
		// Still pending: taken again after the timeout, and dropped then.
		e.logger.Warn("acknowledge a work item", "item", item, "err", err)
	}
}

// Sleep waits for d, or until ctx is done, whichever comes first. The
// engine's loops and the triggers' delivery loops wait with it.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
