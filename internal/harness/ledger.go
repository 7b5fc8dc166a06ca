package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

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

// saveSoonAfter bounds how long a change saved with saveSoon waits for
// the next save before a timer sends it.
const saveSoonAfter = 5 * time.Millisecond

// saveSoon is save without a round trip of its own: what changed, and
// events, go with the next save — a call's done entry with the next
// call's pending entry, the last with the run's last save — or, when no save comes within saveSoonAfter (a
// model turn, a wait, a pool slot), with a timer's. Only the record of
// an outcome waits: every pending entry is still written before its call
// leaves, so a crash in between costs what a crash during the call
// costs — the call re-sent with its idempotency key on resume. A timer's
// save that fails (fenced, storage) fails the run's next save.
func (r *run) saveSoon(ctx context.Context, events ...event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.broken != nil {
		return r.broken
	}
	r.held = append(r.held, events...)
	if r.soonArmed {
		return nil
	}
	r.soonArmed = true
	if r.soon == nil {
		ctx = context.WithoutCancel(ctx)
		r.soon = time.AfterFunc(saveSoonAfter, func() { r.flush(ctx) })
	} else {
		r.soon.Reset(saveSoonAfter)
	}
	return nil
}

// flush is saveSoon's timer: it sends what waits, unless a save did.
func (r *run) flush(ctx context.Context) {
	r.mu.Lock()
	r.soonArmed = false
	r.mu.Unlock()
	if err := r.save(ctx); err != nil {
		r.mu.Lock()
		if r.broken == nil {
			r.broken = err
		}
		r.mu.Unlock()
	}
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
	if r.broken != nil {
		err := r.broken
		r.mu.Unlock()
		return err
	}
	w, err := r.changes()
	events = append(r.held, events...)
	r.held = nil
	status, closing := string(r.rec.Status), r.closing
	// What the timer would have sent goes with this save: stop it, or it
	// wakes for an empty save. One that fired already is flushing and
	// disarms itself.
	if r.soon != nil && r.soon.Stop() {
		r.soonArmed = false
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	if w.head == nil && len(w.entries) == 0 && len(events) == 0 && publish == "" && !last && !closing {
		return nil // a lazy save (saveSoon) sent it already
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
	if closing && !r.e.clustered() {
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
	Leases     []connect.LeaseRecord
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

// The final save of a turn on a thread closes the thread in the same
// script (see threads.go): saveScript and leaveScript with closeLua after
// them, the thread's keys after theirs and its arguments after theirs.
var (
	saveCloseScript  = redis.NewScript(saveLua + closeLua + closeCall + `return 1`)
	leaveCloseScript = redis.NewScript(saveLua + leaveLua + closeLua + closeCall + `return 1`)
)
