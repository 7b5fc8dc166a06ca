package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/store"
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
		e.approvals.expire(ctx)
		sleep(ctx, e.sweepEvery)
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
				sleep(ctx, time.Second)
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

// claimScript takes an execution for one run. The owner key expires unless
// renewed, so a dead runner's claim lapses; the epoch key only grows, so a
// runner that lost its claim can never write again (see saveScript).
//
// A claim that fails leaves a note (KEYS[3]) for the holder: the work item
// that lost is dropped, and the holder enqueues the execution again when it
// releases (see releaseScript), so a resume that races a run is never lost.
//
// A refused claim answers minus the milliseconds the holder's claim has
// left, so the caller can try again the moment it would lapse.
var claimScript = redis.NewScript(refusedLua("-left") + `
local epoch = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return epoch
`)

// releaseScript drops the claim and reports (2) whether another claim
// came in meanwhile and must be served by enqueueing again.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if redis.call('GET', KEYS[2]) then
  redis.call('DEL', KEYS[2])
  return 2
end
return 1
`)

// releaseAckScript is releaseScript for a worker's run that ended: with
// the claim go the acknowledgement and deletion of its work item, and a
// claim refused meanwhile is served by a new item here rather than by
// another round trip. The work stream is the shared key, so on Redis
// Cluster (another slot) the steps go one by one instead.
//
// KEYS: owner, again, work stream. ARGV: token, group, item ("" for
// none), execution id. Answers as releaseScript.
var releaseAckScript = redis.NewScript(`
local held = redis.call('GET', KEYS[1]) == ARGV[1]
if held then redis.call('DEL', KEYS[1]) end
if ARGV[3] ~= '' then
  redis.call('XACK', KEYS[3], ARGV[2], ARGV[3])
  redis.call('XDEL', KEYS[3], ARGV[3])
end
if not held then return 0 end
if redis.call('GET', KEYS[2]) then
  redis.call('DEL', KEYS[2])
  redis.call('XADD', KEYS[3], '*', 'id', ARGV[4])
  return 2
end
return 1
`)

// saveScript writes what a save changed, only for the current epoch: no
// zombie writes from a runner whose claim was taken over. The record's
// head (the execution without its ledger entries) is written when it
// changed; each ledger entry is a field of the ledger hash (its position
// in the ledger), so a step writes its own entry rather than the whole
// record again. With them go the events that report the change (step
// started or finished, execution running or finished) and, when the
// execution finished, the message Wait listens for: one round trip, and a
// fenced runner's events are dropped with its writes. Written events are
// announced on the channel named like their stream, for followers (see
// EventFeed).
//
// KEYS: epoch, record, events, ledger. ARGV: epoch, retention ms, head
// JSON ("" unchanged), "1" to empty the ledger first, "1" to set the
// ledger's expiry, channel to publish the status on ("" for none),
// status, number of entries, number of events, then four used by
// leaveScript only, then position and JSON of each entry, then type and
// data of each event.
var saveScript = redis.NewScript(saveLua + `return 1`)

// leaveScript is saveScript for a worker's last save of a run (the
// execution finished or waits), with releaseAckScript's work after it:
// the claim let go, the work item acknowledged and deleted, a claim
// refused meanwhile served by a new item. One round trip for two.
//
// KEYS: saveScript's, then owner, again, work stream. ARGV: saveScript's,
// with token, group, item and execution id at 10 to 13.
var leaveScript = redis.NewScript(saveLua + leaveLua + `return 1`)

// leaveLua is leaveScript's work after the save.
const leaveLua = `
local held = redis.call('GET', KEYS[5]) == ARGV[10]
if held then redis.call('DEL', KEYS[5]) end
redis.call('XACK', KEYS[7], ARGV[11], ARGV[12])
redis.call('XDEL', KEYS[7], ARGV[12])
if held and redis.call('GET', KEYS[6]) then
  redis.call('DEL', KEYS[6])
  redis.call('XADD', KEYS[7], '*', 'id', ARGV[13])
end
`

// The final save of a turn on a thread closes the thread in the same
// script (see threads.go): saveScript and leaveScript with closeLua after
// them, the thread's keys after theirs and its arguments after theirs.
var (
	saveCloseScript  = redis.NewScript(saveLua + closeLua + closeCall + `return 1`)
	leaveCloseScript = redis.NewScript(saveLua + leaveLua + closeLua + closeCall + `return 1`)
)

// saveLua is saveScript's body, which leaveScript shares.
var saveLua = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local ne, nv = tonumber(ARGV[8]), tonumber(ARGV[9])
if ARGV[3] ~= '' then redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2]) end
if ARGV[4] == '1' then redis.call('DEL', KEYS[4]) end
local at = 14
while ne > 0 do
  local n = math.min(ne, 100)
  redis.call('HSET', KEYS[4], unpack(ARGV, at, at + 2 * n - 1))
  at, ne = at + 2 * n, ne - n
end
if ARGV[5] == '1' then redis.call('PEXPIRE', KEYS[4], ARGV[2]) end
for i = 0, nv - 1 do
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', '` + strconv.Itoa(maxEvents) + `', '*', 'type', ARGV[at + 2 * i], 'data', ARGV[at + 2 * i + 1])
end
if nv > 0 and ARGV[3] ~= '' then redis.call('PEXPIRE', KEYS[3], ARGV[2]) end
if nv > 0 then redis.call('PUBLISH', KEYS[3], '') end
if ARGV[6] ~= '' then redis.call('PUBLISH', ARGV[6], ARGV[7]) end
`

// ErrFenced is returned to a runner whose claim was taken over.
var ErrFenced = errors.New("execution claimed by a newer run")

// errClaimed: another runner holds the execution now.
var errClaimed = errors.New("execution is being run elsewhere")

// heldError is errClaimed with how long the holder's claim has left
// unless renewed.
type heldError struct{ left time.Duration }

func (h *heldError) Error() string        { return fmt.Sprintf("%v (claim lapses in %s)", errClaimed, h.left) }
func (h *heldError) Is(target error) bool { return target == errClaimed }

// retrySlack puts the retry of a refused claim just after the holder's
// claim would lapse, not just before.
const retrySlack = 50 * time.Millisecond

// retryAt makes the pending item msgID due for XAUTOCLAIM when the
// holder's claim lapses (left from now), unless renewed by then. Without
// it the item would wait a whole visibility timeout from this attempt:
// an attempt made just before a dead runner's claim lapsed would leave
// the execution stalled for nearly two timeouts. XCLAIM with IDLE sets the
// item's idle time (JUSTID leaves its delivery count alone); an item that
// comes due while the claim is still held (renewed) is refused again and
// rescheduled the same way.
func (e *Executions) retryAt(ctx context.Context, msgID string, left time.Duration) {
	idle := max(e.visibility-left-retrySlack, 0)
	err := e.store.Client.Do(ctx, "XCLAIM", e.workKey(), workGroup, e.consumer, 0, msgID,
		"IDLE", idle.Milliseconds(), "JUSTID").Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		// The item is still pending: it comes due a timeout later.
		e.logger.Warn("reschedule a work item", "item", msgID, "err", err)
	}
}

func (e *Executions) ownerKey(id string) string { return e.store.Key("{exec:"+id+"}", "owner") }
func (e *Executions) againKey(id string) string { return e.store.Key("{exec:"+id+"}", "again") }

// release drops a claim, enqueueing the execution again when a claim was
// refused while it was held.
func (e *Executions) release(ctx context.Context, id, token string) {
	ctx = context.WithoutCancel(ctx)
	n, err := releaseScript.Run(ctx, e.store.Client, []string{e.ownerKey(id), e.againKey(id)}, token).Int()
	if err != nil {
		e.logger.Warn("release claim", "execution", id, "err", err)
		return
	}
	if n == 2 {
		if err := e.resume(ctx, id); err != nil {
			e.logger.Error("enqueue again", "execution", id, "err", err)
		}
	}
}

// releaseAck is release for a worker's run, acknowledging its work item
// (unless item is "") in the same round trip. It reports whether the item
// was acknowledged.
func (e *Executions) releaseAck(ctx context.Context, id, token, item string) bool {
	if e.clustered() {
		e.release(ctx, id, token)
		return false
	}
	ctx = context.WithoutCancel(ctx)
	_, err := releaseAckScript.Run(ctx, e.store.Client, []string{e.ownerKey(id), e.againKey(id), e.workKey()},
		token, workGroup, item, id).Int()
	if err != nil {
		// The claim lapses; the caller acknowledges the item by itself.
		e.logger.Warn("release claim", "execution", id, "err", err)
		return false
	}
	return item != ""
}

func (e *Executions) epochKey(id string) string { return e.store.Key("{exec:"+id+"}", "epoch") }

func (e *Executions) claim(ctx context.Context, id, token string) (int64, error) {
	epoch, err := claimScript.Run(ctx, e.store.Client, []string{e.ownerKey(id), e.epochKey(id), e.againKey(id)},
		token, e.visibility.Milliseconds(), e.retention.Milliseconds()).Int64()
	if err != nil {
		return 0, fmt.Errorf("executions: claim %s: %w", id, err)
	}
	if epoch <= 0 {
		return 0, &heldError{left: time.Duration(-epoch) * time.Millisecond}
	}
	return epoch, nil
}

// refusedLua is the start of the claim scripts: a claim held by another
// token is refused, leaving the note for the holder (KEYS[3]) and
// answering ret, made of the milliseconds the holder's claim has left.
func refusedLua(ret string) string {
	return `
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[3])
  local left = redis.call('PTTL', KEYS[1])
  if left < 1 then left = 1 end
  return ` + ret + `
end`
}

// claimRunScript is claimScript for a worker's run, with what the run
// reads first in the same round trip: the record's head, whether Cancel
// was asked and the ledger. An unknown execution is not claimed (0).
//
// KEYS: owner, epoch, again, record, ledger, cancel. ARGV: token,
// visibility ms, retention ms. Answers {-left} when refused, {0} when
// the record is gone, else {epoch, head, cancelled, ledger fields}.
var claimRunScript = redis.NewScript(refusedLua("{-left}") + `
local head = redis.call('GET', KEYS[4])
if not head then return {0} end
local epoch = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {epoch, head, redis.call('EXISTS', KEYS[6]), redis.call('HGETALL', KEYS[5])}
`)

// claimed is what a worker's claim read.
type claimed struct {
	epoch     int64
	rec       *record
	legacy    bool // the entries were in the head (see decodeRecord)
	ledger    bool // the ledger hash exists
	cancelled bool
}

// claimRun claims the execution for a worker's run and loads it (see
// claimRunScript): ErrNotFound for an unknown one, a *heldError while
// another runner holds it.
func (e *Executions) claimRun(ctx context.Context, id, token string) (*claimed, error) {
	res, err := claimRunScript.Run(ctx, e.store.Client,
		[]string{e.ownerKey(id), e.epochKey(id), e.againKey(id), e.recordKey(id), e.ledgerKey(id), e.cancelKey(id)},
		token, e.visibility.Milliseconds(), e.retention.Milliseconds()).Slice()
	if err != nil {
		return nil, fmt.Errorf("executions: claim %s: %w", id, err)
	}
	epoch, _ := res[0].(int64)
	switch {
	case epoch < 0:
		return nil, &heldError{left: time.Duration(-epoch) * time.Millisecond}
	case epoch == 0 || len(res) < 4:
		return nil, fmt.Errorf("execution %s: %w", id, ErrNotFound)
	}
	head, _ := res[1].(string)
	flat, _ := res[3].([]any)
	ledger := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		k, _ := flat[i].(string)
		v, _ := flat[i+1].(string)
		ledger[k] = v
	}
	rec, legacy, err := decodeRecord(id, []byte(head), ledger)
	if err != nil {
		return nil, err
	}
	n, _ := res[2].(int64)
	return &claimed{epoch: epoch, rec: rec, legacy: legacy, ledger: len(ledger) > 0, cancelled: n > 0}, nil
}

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
	if errors.Is(err, ErrNotFound) {
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
	defer func() {
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

// renew keeps the claim alive while the run lasts; losing it cancels the
// run.
func (e *Executions) renew(ctx context.Context, cancel context.CancelCauseFunc, id, token string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(e.visibility / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				n, err := store.RenewScript.Run(ctx, e.store.Client, []string{e.ownerKey(id)}, token, e.visibility.Milliseconds()).Int()
				if err == nil && n == 0 {
					cancel(ErrFenced)
					return
				}
			}
		}
	})
	return func() { close(done); wg.Wait() }
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
	doc      *Document
	attached map[string]*Connection
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
	if err := r.saveWith(ctx, "", event{EventState, map[string]any{"status": ExecRunning, "epoch": r.epoch}}); err != nil {
		return err
	}
	r.e.observer.ExecutionEntered(ExecRunning)
	r.e.logger.InfoContext(ctx, "execution running", "execution", r.rec.ID, "epoch", r.epoch)

	doc, err := ParseDocument(r.rec.Workflow, r.e.reg, "/workflow")
	if err == nil {
		if problems := resolveSetups(doc, r.e.reg, r.rec.Input, "/workflow"); len(problems) > 0 {
			err = &ValidationError{Problems: problems}
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
		r.rec.Status, r.rec.Rerun = ExecWaiting, nil
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
	r.rec.FinishedAt, r.rec.Rerun = &now, nil
	r.rec.Status, r.rec.Output = ExecSucceeded, r.e.redact(out)
	switch {
	case errors.Is(runErr, errCancelled):
		r.rec.Status, r.rec.Output = ExecCancelled, nil
		r.rec.Error = &ExecError{Code: KindCancelled, Message: "cancelled on request"}
	case runErr != nil:
		r.rec.Status, r.rec.Output, r.rec.Error = ExecFailed, nil, asExecError(runErr)
		r.rec.Error.Message = r.e.redactor.String(r.rec.Error.Message)
	}
	data := map[string]any{"status": r.rec.Status}
	if r.rec.Error != nil {
		data["error"] = r.rec.Error
	}
	r.closing = r.rec.Thread != ""
	if err := r.saveLast(ctx, r.e.doneKey(r.rec.ID), event{EventFinished, data}); err != nil {
		return err
	}
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

// event is one execution event to write.
type event struct {
	typ  string
	data map[string]any
}

// save writes the record, fenced by the run's epoch, with the events held
// for the next save (see hold).
func (r *run) save(ctx context.Context) error { return r.saveWith(ctx, "") }

// saveWith is save that also appends events after the held ones and, when
// publish names a channel, announces the execution's status on it, all in
// one script (saveScript). It sends the head only when it changed and the
// ledger entries changed since the last save.
func (r *run) saveWith(ctx context.Context, publish string, events ...event) error {
	return r.write(ctx, false, publish, events...)
}

// saveLast is saveWith for the last save of a run that ended (finished or
// waiting): a worker's run lets go of its claim and acknowledges its work
// item in the same script (leaveScript), so its release has nothing left
// to do (r.leave.done).
func (r *run) saveLast(ctx context.Context, publish string, events ...event) error {
	return r.write(ctx, r.leave != nil, publish, events...)
}

// leave is what a worker's run lets go of when it ends: its claim and its
// work item. Nil outside a worker's run, and on Redis Cluster (the work
// stream is in another slot).
type leave struct {
	token, item string
	done        bool
}

func (r *run) write(ctx context.Context, last bool, publish string, events ...event) error {
	r.saving.Lock()
	defer r.saving.Unlock()
	r.mu.Lock()
	w, err := r.changes()
	events = append(r.held, events...)
	r.held = nil
	status := string(r.rec.Status)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	id := r.rec.ID
	keys := []string{r.e.epochKey(id), r.e.recordKey(id), r.e.eventsKey(id), r.e.ledgerKey(id)}
	script := saveScript
	args := make([]any, 0, 13+len(w.entries)+2*len(events))
	args = append(args, r.epoch, r.e.retention.Milliseconds(), w.head, luaFlag(w.rewrite), luaFlag(w.expire), publish, status, len(w.entries)/2, 0)
	if last {
		script = leaveScript
		keys = append(keys, r.e.ownerKey(id), r.e.againKey(id), r.e.workKey())
		args = append(args, r.leave.token, workGroup, r.leave.item, id)
	} else {
		args = append(args, "", "", "", "")
	}
	args = append(args, w.entries...)
	for _, ev := range events {
		raw, err := json.Marshal(r.e.redact(ev.data))
		if err != nil {
			continue // a progress report, not worth failing the step
		}
		args = append(args, ev.typ, raw)
	}
	args[8] = (len(args) - 13 - len(w.entries)) / 2
	if r.closing && !r.e.clustered() {
		script = saveCloseScript
		if last {
			script = leaveCloseScript
		}
		keys = append(keys, r.e.threadKeys(r.rec.Thread)...)
		args = append(args, r.e.retention.Milliseconds(), id, newExecutionID())
	}
	ok, err := script.Run(context.WithoutCancel(ctx), r.e.store.Client, keys, args...).Int()
	if err != nil {
		return &storageError{fmt.Errorf("executions: save %s: %w", id, err)}
	}
	if ok == 0 {
		return ErrFenced
	}
	if last {
		r.leave.done = true
	}
	return nil
}

// writes is what one save sends.
type writes struct {
	head    []byte // nil: unchanged
	entries []any  // position, JSON, …
	rewrite bool   // empty the ledger hash first
	expire  bool   // set the ledger hash's expiry
}

// changes collects what changed since the last save and counts it as
// saved: a save that fails stops the run, and the next run loads what
// Redis holds. Callers hold r.mu.
func (r *run) changes() (writes, error) {
	var w writes
	// What a run may change of the head is compared, not the whole head:
	// the document and the input never change within a run, and encoding
	// them for every step was most of a save's own cost.
	moved, err := json.Marshal(mutableHead{r.rec.Status, r.rec.Output, r.rec.Error, r.rec.StartedAt, r.rec.FinishedAt, r.rec.Rerun, r.rec.Leases})
	if err != nil {
		return w, fmt.Errorf("executions: encode %s: %w", r.rec.ID, err)
	}
	if !bytes.Equal(moved, r.head) || time.Since(r.headAt) > r.e.retention/2 {
		if w.head, err = marshalHead(r.rec); err != nil {
			return w, err
		}
		r.head, r.headAt = moved, time.Now()
	}
	positions := r.dirty
	if !r.synced {
		w.rewrite = true
		positions = make([]int, len(r.rec.Steps))
		for i := range positions {
			positions[i] = i
		}
	}
	seen := map[int]bool{}
	for _, i := range positions {
		if i >= len(r.rec.Steps) || seen[i] {
			continue
		}
		seen[i] = true
		data, err := json.Marshal(&r.rec.Steps[i])
		if err != nil {
			return w, fmt.Errorf("executions: encode %s entry %d: %w", r.rec.ID, i, err)
		}
		w.entries = append(w.entries, i, data)
	}
	// The hash gets its expiry when this run creates it (or empties and
	// fills it), and again with every head, so both live as long.
	w.expire = len(w.entries) > 0 && (!r.expiring || w.rewrite) || w.head != nil && r.expiring
	if len(w.entries) > 0 {
		r.expiring = true
	} else if w.rewrite {
		r.expiring = false
	}
	r.dirty, r.synced = r.dirty[:0], true
	return w, nil
}

// mutableHead is what a run changes of a record's head.
type mutableHead struct {
	Status     ExecState
	Output     any
	Error      *ExecError
	StartedAt  *time.Time
	FinishedAt *time.Time
	Rerun      []string
	Leases     []LeaseRecord
}

// truncate drops the ledger entries from position i on; the next save
// rewrites the ledger hash. Callers hold r.mu.
func (r *run) truncate(i int) {
	r.rec.Steps = r.rec.Steps[:i]
	r.synced = false
}

func luaFlag(b bool) string {
	if b {
		return "1"
	}
	return ""
}

// storageError is a failure to read or write Redis: the run stops and is
// retried from the ledger rather than failing the execution.
type storageError struct{ err error }

func (e *storageError) Error() string { return e.err.Error() }
func (e *storageError) Unwrap() error { return e.err }

func isStorage(err error) bool {
	var se *storageError
	return errors.As(err, &se)
}

// storage classifies a failed Redis request of a step: a storage failure,
// unless the step's context ended first (a sibling failed or won, the run
// was cancelled), which is that cancellation and not a reason to retry
// the whole run.
func (r *run) storage(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	return &storageError{err}
}

func (r *run) node(ctx context.Context, f *frame, n *Node) (any, error) {
	var out any
	var err error
	ctx, step := r.traceStep(ctx, f, n)
	defer step.end(&err)
	switch n.Kind {
	case KindSequence:
		for _, s := range n.Steps {
			if out, err = r.node(ctx, f, s); err != nil {
				return nil, err
			}
		}
	case KindCall:
		out, err = r.call(ctx, f, n)
	case KindParallel:
		out, err = r.parallel(ctx, f, n)
	case KindVerify:
		out, err = r.verify(ctx, f, n)
	case KindWait:
		out, err = r.wait(ctx, f, n)
	case KindModel:
		out, err = r.model(ctx, f, n)
	default:
		err = &stepError{step: n.ID, code: KindStepFailed, err: fmt.Errorf("kind %q cannot run", n.Kind)}
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
func (r *run) replayed(key string, n *Node) (out any, err error, ok bool) {
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
	case mode == Replayable:
		return nil
	case mode == Costly || slices.Contains(r.rec.Rerun, st.Connection):
		// Everything from the first affected entry on runs live; a costly
		// connection is reset first, so it starts from a clean world.
		r.truncate(i)
		if mode == Costly {
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
func (r *run) begin(n *Node, key, conn string) {
	if ev, ok := r.enter(n, key, conn); ok {
		r.e.emit(context.Background(), r.rec.ID, ev.typ, ev.data)
	}
}

// beginHeld is begin for a step that saves the record soon (a call writes
// its pending entry before it is sent, or its failure): its started event
// goes out with that save, in the same round trip.
func (r *run) beginHeld(n *Node, key, conn string) {
	if ev, ok := r.enter(n, key, conn); ok {
		r.mu.Lock()
		r.held = append(r.held, ev)
		r.mu.Unlock()
	}
}

// enter adds the step's ledger entry unless it has one, and returns its
// started event.
func (r *run) enter(n *Node, key, conn string) (event, bool) {
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

func (r *run) done(ctx context.Context, key string, n *Node, out any) (any, error) {
	r.update(key, func(st *StepRecord) {
		finished := time.Now().UTC()
		st.Status, st.Output, st.FinishedAt, st.DurationMs = StepDone, out, &finished, finished.Sub(st.StartedAt).Milliseconds()
	})
	if err := r.saveWith(ctx, "", event{EventStepFinished, map[string]any{"key": key, "id": n.ID, "status": StepDone}}); err != nil {
		return nil, err
	}
	return out, nil
}

func (r *run) fail(ctx context.Context, key string, n *Node, err error) error {
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

// call runs one call step through the gates, replaying the ledger: a done
// entry returns its recorded output without calling again; a pending one is
// re-sent with the same idempotency key; a waiting one checks its approval.
func (r *run) call(ctx context.Context, f *frame, n *Node) (any, error) {
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
func (r *run) send(ctx context.Context, f *frame, n *Node, key *string) (any, Identity, error) {
	r.mu.Lock()
	sc := r.scope(f)
	v, err := object(n.Args).eval(sc)
	r.mu.Unlock()
	if err != nil {
		return nil, Identity{}, err
	}
	args := v.(map[string]any)
	name := n.Connection
	if n.ConnFromItem {
		name = f.item
	}
	conn, err := r.connFor(ctx, f, n.ID, name)
	if err != nil {
		return nil, Identity{}, err
	}
	r.mu.Lock()
	reset := r.resets[name]
	delete(r.resets, name)
	r.mu.Unlock()
	if reset {
		r.e.logger.InfoContext(ctx, "resetting a costly connection before running live", "execution", r.rec.ID, "connection", name)
		if err := conn.Reset(ctx); err != nil {
			return nil, Identity{}, err
		}
	}
	if conn.Access().ActsAsUser() && forNoOne(r.rec.Principal) {
		// Hidden, not unavailable: there is no user for it to act as.
		return nil, Identity{}, &denied{GateDeclared, fmt.Sprintf("connection %s acts as a user and this execution runs for no principal", conn.Name())}
	}
	if st := conn.State(); st != StateReady {
		return nil, Identity{}, fmt.Errorf("connection %s is %s: %w", conn.Name(), st, ErrUnavailable)
	}
	marks := profileOp(n, conn)
	verdict, args, err := r.e.gates(ctx, conn, n.Op, marks != nil && marks.Guarded, args, r.rec.ID)
	traceGates(ctx, verdict, err)
	if err != nil {
		return nil, Identity{}, err
	}
	if err := checkProfileArgs(n, args); err != nil {
		return nil, Identity{}, err
	}
	approval := ""
	if verdict == needsApproval {
		if key == nil {
			return nil, Identity{}, &denied{GateApprover, "a verify read cannot wait for approval; the policy guards " + n.Op}
		}
		if err := r.approve(ctx, n, *key, conn.Name(), args); err != nil {
			return nil, Identity{}, err
		}
		approval = approvalID(r.rec.ID, *key)
	} else if key != nil && r.askedApproval(*key) {
		// The server refused this call as guarded before the run parked:
		// the call sent now is the approved one, and only it (sent bare
		// it would only be refused again).
		if err := r.approve(ctx, n, *key, conn.Name(), args); err != nil {
			return nil, Identity{}, err
		}
		approval = approvalID(r.rec.ID, *key)
	}
	filled, err := r.e.fillSecrets(ctx, args)
	if err != nil {
		return nil, Identity{}, err
	}
	id := conn.Identity()
	idemKey := ""
	if key != nil {
		// The pending entry is written before the call leaves, so a crash
		// after sending is re-sent with the same key, never lost.
		r.update(*key, func(st *StepRecord) { st.Status, st.Identity, idemKey = StepPending, &id, st.IdempotencyKey })
		if err := r.save(ctx); err != nil {
			return nil, id, err
		}
	}
	once := ""
	if marks != nil && marks.Once && idemKey != "" {
		once = r.e.onceKey(conn, n.Op, idemKey)
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
	req := CallRequest{Op: n.Op, Args: filled.(map[string]any), IdempotencyKey: idemKey, Principal: r.rec.Principal, Approval: approval}
	if key != nil {
		req.Task = r.taskWatch(ctx, n, *key, true)
	}
	out, err := r.deliver(ctx, conn, req)
	if guardedRefusal(err) && approval == "" && key != nil {
		// The server guards this target: a person decides, and the call
		// is sent again, once, with the approval (a new call, so a new
		// task if the server makes one).
		if err := r.approve(ctx, n, *key, conn.Name(), args); err != nil {
			return nil, id, err
		}
		req.Approval = approvalID(r.rec.ID, *key)
		req.Task = r.taskWatch(ctx, n, *key, false)
		out, err = r.deliver(ctx, conn, req)
	}
	if once != "" && recordable(err) {
		o := onceOutcome{Output: out, Op: n.Op}
		if ce := (*CallError)(nil); errors.As(err, &ce) {
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
	var ce *CallError
	return errors.As(err, &ce) && ce.Code == CodeGuarded
}

// answered checks and presents a call's answer.
func (r *run) answered(ctx context.Context, n *Node, conn *Connection, id Identity, out any, err error) (any, Identity, error) {
	if err != nil {
		return nil, id, err
	}
	if err := checkProfileResult(n, conn.Name(), out); err != nil {
		return nil, id, err
	}
	out, err = r.e.present(ctx, out, conn, r.rec.ID)
	return withholdReadTool(conn, n.Op, out), id, err
}

// deliver sends req with the principal's credentials (gate 6's last
// part), replacing them once when the server rejects them.
func (r *run) deliver(ctx context.Context, conn *Connection, req CallRequest) (any, error) {
	headers, err := r.e.callerHeaders(ctx, conn, r.rec.Principal)
	if err != nil {
		return nil, err
	}
	req.Headers = headers
	out, err := conn.Call(ctx, req)
	if errors.Is(err, ErrNeedsSignIn) && headers != nil {
		// The server rejected the principal's credentials before acting
		// (a token revoked before its expiry): replaced once, sent again.
		if fresh, ok := r.e.refreshHeaders(ctx, conn.Name(), r.rec.Principal, headers); ok {
			req.Headers = fresh
			out, err = conn.Call(ctx, req)
		}
		if errors.Is(err, ErrNeedsSignIn) && conn.Access().SignIn == SignInShared {
			// The shared token is refused even fresh: everyone's sign-in
			// is gone, so the connection says so until someone signs in.
			conn.needSignIn(r.e.redactor.String(err.Error()))
		}
	}
	return out, err
}

// conn returns the named connection: a server the document brought
// (attached on first use), else the host's.
func (r *run) conn(ctx context.Context, name string) (*Connection, error) {
	r.mu.Lock()
	step, ok := r.attached[name] // a server the document or a model node attached
	r.mu.Unlock()
	if ok {
		return step, nil
	}
	var spec AttachSpec
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
func (r *run) attach(ctx context.Context, spec AttachSpec) (*Connection, error) {
	r.mu.Lock()
	c, ok := r.attached[spec.Name]
	r.mu.Unlock()
	if ok {
		return c, nil
	}
	if r.e.attacher == nil {
		return nil, &denied{GateDeclared, fmt.Sprintf("this deployment does not attach servers that documents bring (%s)", spec.Name)}
	}
	values := map[string]string{}
	for _, sec := range spec.secrets() {
		if r.e.secrets == nil {
			return nil, &denied{GateSecrets, fmt.Sprintf("secret %q: no secret store is configured", sec)}
		}
		v, err := r.e.secrets.Resolve(ctx, sec)
		if err != nil {
			return nil, &denied{GateSecrets, fmt.Sprintf("secret %q could not be resolved", sec)}
		}
		r.e.redactor.Add(v)
		values[sec] = v
	}
	conn, err := r.e.attacher.Attach(ctx, spec, values)
	if err != nil {
		return nil, fmt.Errorf("attach %s: %s", spec.Name, r.e.redactor.String(err.Error()))
	}
	c = &Connection{name: spec.Name, conn: conn, manifest: conn.Manifest(), state: StateReady, since: time.Now()}
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.attached[spec.Name]; ok { // attached meanwhile by a parallel path
		_ = c.close()
		return prev, nil
	}
	if r.attached == nil {
		r.attached = map[string]*Connection{}
	}
	r.attached[spec.Name] = c
	return c, nil
}

// detach closes the servers the document brought.
func (r *run) detach() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, c := range r.attached {
		if err := c.close(); err != nil {
			r.e.logger.Warn("closing an attached server", "execution", r.rec.ID, "connection", name, "err", err)
		}
	}
	r.attached = nil
}

// approve is gate 5: it asks for (or finds) the step's approval. It returns
// nil once approved, errWaiting while pending, and a refusal when denied or
// expired.
func (r *run) approve(ctx context.Context, n *Node, key, conn string, args map[string]any) error {
	now := time.Now().UTC()
	ap, err := r.e.approvals.request(ctx, &Approval{
		ID: approvalID(r.rec.ID, key), State: ApprovalPending, Execution: r.rec.ID, Step: n.ID,
		Connection: conn, Op: n.Op, Args: r.e.redact(jsonValueMap(args)).(map[string]any),
		RequestedBy: r.rec.Principal, CreatedAt: now, ExpiresAt: now.Add(r.e.approvalTTL),
	})
	if err != nil {
		return r.storage(ctx, err)
	}
	r.traceApproval(ctx, ap)
	switch ap.State {
	case ApprovalApproved:
		return nil
	case ApprovalPending:
		// The task that answered with the refusal is over: the approved
		// call is a new one.
		r.update(key, func(st *StepRecord) { st.Status, st.ApprovalID, st.Task = StepWaiting, ap.ID, "" })
		if err := r.save(ctx); err != nil {
			return err
		}
		r.e.emit(ctx, r.rec.ID, EventApprovalRequest, map[string]any{"approval": ap.ID, "step": n.ID, "connection": conn, "op": n.Op})
		return errWaiting
	}
	return &denied{GateApprover, fmt.Sprintf("approval %s was %s", ap.ID, ap.State)}
}

// jsonValueMap shows evaluated arguments as JSON values (secrets as their
// placeholder), for approval records.
func jsonValueMap(args map[string]any) any {
	v := jsonValue(args)
	if m, ok := v.(map[string]any); ok {
		return m
	}
	return map[string]any{}
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
	var d *denied
	if errors.As(err, &d) {
		return &stepError{step: step, code: KindSteeringDenied, gate: d.gate, err: err}
	}
	return &stepError{step: step, code: callErrorKind(err), err: err}
}

func asExecError(err error) *ExecError {
	var se *stepError
	if errors.As(err, &se) {
		return &ExecError{Code: se.code, Message: se.err.Error(), Step: se.step, Gate: se.gate}
	}
	var ve *ValidationError
	if errors.As(err, &ve) {
		return &ExecError{Code: string(ve.Code()), Message: ve.Error()}
	}
	return &ExecError{Code: KindStepFailed, Message: err.Error()}
}

func callErrorKind(err error) string {
	switch {
	case errors.Is(err, ErrUnavailable):
		return KindConnectionUnavailable
	case errors.Is(err, context.DeadlineExceeded):
		return KindTimeout
	case errors.Is(err, context.Canceled):
		return KindCancelled
	}
	return KindStepFailed
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
