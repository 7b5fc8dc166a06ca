package harness

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/store"
)

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

// ErrFenced is returned to a runner whose claim was taken over.
var ErrFenced = errors.New("execution claimed by a newer run")

// errClaimed: another runner holds the execution now.
var errClaimed = errors.New("execution is being run elsewhere")

// heldError is errClaimed with how long the holder's claim has left
// unless renewed.
type heldError struct{ left time.Duration }

func (h *heldError) Error() string { return fmt.Sprintf("%v (claim lapses in %s)", errClaimed, h.left) }

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
		return nil, fmt.Errorf("execution %s: %w", id, fault.ErrNotFound)
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
