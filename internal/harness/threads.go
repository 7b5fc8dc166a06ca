package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// One turn per thread at a time.
//
// A trigger's event on a thread either starts a turn or joins the one open
// on the thread. Which, is decided once per event by threadDecideScript,
// over the thread's keys and nothing else: "is a turn open? then the event
// joins it, else it opens the thread with a new turn". A wait in the open
// turn takes an event of its connection with threadTakeScript, which
// refuses an event decided for another turn and records the others as
// joined to its own: an event the wait saw before its inbox entry was
// delivered then finds itself joined to that turn, never starting
// another. An event that joined but that no wait took stays pending; when
// the turn ends, closeLua either closes the thread (nothing pending) or
// opens it again for the earliest pending event, which starts the next
// turn, the later ones joining that one. So every event on a thread is
// seen by exactly one turn: the one it started, or the one whose wait
// took it.
//
// The turn's final save runs closeLua in the same script, so no event can
// join a turn that has ended. Redis Cluster cannot run a script over the
// record's slot and the thread's, so there the close is its own script
// (threadCloseScript) right after the save; an event joining in between
// is pending, and the close hands it over like any other. The close is
// idempotent and harmless once done, and the inbox runs it too when it
// sees a turn ended, so a replica that died between the save and the
// close leaves no thread open.
//
// Keys of a thread share the hash tag {th:<digest of the thread>}:
//
//	state    HASH  turn (the open turn; absent: closed), opened (turns
//	               started on the thread), thread (its name, cut to 200
//	               bytes)
//	decided  HASH  event id → "started:<execution>:<trigger>" or
//	               "joined:<execution>:<trigger>" (trigger "" when a wait
//	               took the event before its entry was delivered)
//	order    ZSET  event id → when it was decided (ms): decisions older
//	               than the retention are forgotten
//	pending  ZSET  events joined to the open turn that no wait of it took,
//	               in the order they joined (µs)
//	body     HASH  event id → the event as waits see it, for the pending
//	               events and those the open turn's waits took
//	taken    HASH  event id → the ledger key of the open turn's wait that
//	               took it, so a run resumed after a crash finds it again

// ThreadEvent is an inbox entry of an event on a thread.
type ThreadEvent struct {
	// Thread is "<connection>:<thread>".
	Thread string
	// Trigger is the trigger whose entry this is: one event may match
	// several triggers on its thread and starts (at most) one turn, run
	// by the document of the trigger whose entry was decided first.
	Trigger string
	// Event is the event as waits see it.
	Event ConnEvent
	// Workflow and Input are the turn the event starts, if it starts one.
	Workflow json.RawMessage
	Input    any
}

// Turn is where an event on a thread went.
type Turn struct {
	// ID is the turn's execution.
	ID string
	// Started: the entry's event started the turn; else it joined it.
	Started bool
	// Created: this call wrote the turn's record.
	Created bool
}

// How names the way the event came to the turn: "started" or "joined".
func (t Turn) How() string {
	if t.Started {
		return "started"
	}
	return "joined"
}

// ThreadState is a thread as Redis holds it.
type ThreadState struct {
	// Turn is the open turn ("" when the thread is closed).
	Turn string
	// Opened counts the turns started on the thread.
	Opened int64
	// Pending counts the events that joined the open turn and that none
	// of its waits took yet.
	Pending int64
}

// threadKeys are the keys of a thread, in the order the scripts take them.
// The thread is hashed into the tag: it is a value from an event (any
// length, braces included).
func (e *Executions) threadKeys(thread string) []string {
	sum := sha256.Sum256([]byte(thread))
	tag := "{th:" + hex.EncodeToString(sum[:16]) + "}"
	keys := make([]string, 0, 6)
	for _, k := range []string{"state", "decided", "order", "pending", "body", "taken"} {
		keys = append(keys, e.store.Key(tag, k))
	}
	return keys
}

// maxThreadLabel bounds the thread's name kept in its state: the name is
// a value from an event, and only there to be read by a person.
const maxThreadLabel = 200

func threadLabel(thread string) string {
	if len(thread) > maxThreadLabel {
		return thread[:maxThreadLabel]
	}
	return thread
}

// threadConn is the connection of a thread.
func threadConn(thread string) string {
	conn, _, _ := strings.Cut(thread, ":")
	return conn
}

// threadDecideScript starts a turn for the event or joins it to the open
// one, once: an event decided already keeps its decision, so the script
// may run twice and an entry delivered again finds where its event went.
//
// KEYS: the thread's. ARGV: event id, id of the turn to start, trigger,
// event JSON, retention ms, thread.
var threadDecideScript = redis.NewScript(`
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ms - tonumber(ARGV[5]), 'LIMIT', 0, 100)
for _, id in ipairs(old) do
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
local d = redis.call('HGET', KEYS[2], ARGV[1])
if d then return d end
local cur = redis.call('HGET', KEYS[1], 'turn')
if cur then
  d = 'joined:' .. cur .. ':' .. ARGV[3]
  redis.call('ZADD', KEYS[4], tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[1])
  redis.call('HSET', KEYS[5], ARGV[1], ARGV[4])
else
  d = 'started:' .. ARGV[2] .. ':' .. ARGV[3]
  redis.call('HSET', KEYS[1], 'turn', ARGV[2], 'thread', ARGV[6])
  redis.call('HINCRBY', KEYS[1], 'opened', 1)
end
redis.call('HSET', KEYS[2], ARGV[1], d)
redis.call('ZADD', KEYS[3], ms, ARGV[1])
for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
return d
`)

// threadTakeScript lets a wait of turn X take an event: one joined to X
// that no other wait of X took, or one not decided yet while X is the
// open turn (it is then joined to X, so its entry, delivered later,
// starts nothing). An event decided for another turn, or the one that
// started X, is refused. A turn that ended and was resumed takes the thread back when it
// is closed. It answers 1 when taken; taking twice answers 1 again.
//
// Like a save, a take is fenced by the run's epoch (KEYS[7]), so a runner
// whose claim was taken over cannot take an event it would never record:
// -1. Redis Cluster keeps the epoch in another slot; there the take is
// not fenced.
//
// KEYS: the thread's, then the run's epoch key (not on Cluster). ARGV:
// event id, X, the wait's ledger key, event JSON, retention ms, thread,
// the run's epoch.
var threadTakeScript = redis.NewScript(`
if KEYS[7] and redis.call('GET', KEYS[7]) ~= ARGV[7] then return -1 end
local d = redis.call('HGET', KEYS[2], ARGV[1])
if d then
  local mine = 'joined:' .. ARGV[2] .. ':'
  if d:sub(1, #mine) ~= mine then return 0 end
  local by = redis.call('HGET', KEYS[6], ARGV[1])
  if by and by ~= ARGV[3] then return 0 end
else
  local cur = redis.call('HGET', KEYS[1], 'turn')
  if cur and cur ~= ARGV[2] then return 0 end
  if not cur then redis.call('HSET', KEYS[1], 'turn', ARGV[2], 'thread', ARGV[6]) end
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[2], ARGV[1], 'joined:' .. ARGV[2] .. ':')
  redis.call('ZADD', KEYS[3], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ARGV[1])
end
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HSET', KEYS[6], ARGV[1], ARGV[3])
redis.call('HSETNX', KEYS[5], ARGV[1], ARGV[4])
for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
return 1
`)

// closeLua ends turn x on the thread whose six keys start at KEYS[k]: with
// nothing pending the thread closes; else the earliest pending event
// starts the next turn (nxt) and the others join it. A thread whose open
// turn is not x (closed already, or handed over) is left alone, so the
// close may run any number of times. It answers the event that starts the
// next turn, or false.
//
// The final save of a turn runs it after saveLua (see closingScripts),
// standalone it is threadCloseScript.
const closeLua = `
local function closeTurn(k, ret, x, nxt)
  local state, decided, pending, body, taken = KEYS[k], KEYS[k + 1], KEYS[k + 3], KEYS[k + 4], KEYS[k + 5]
  if redis.call('HGET', state, 'turn') ~= x then return false end
  for _, id in ipairs(redis.call('HKEYS', taken)) do redis.call('HDEL', body, id) end
  redis.call('DEL', taken)
  local ids = redis.call('ZRANGE', pending, 0, -1)
  if #ids == 0 then
    redis.call('HDEL', state, 'turn')
    redis.call('DEL', body)
    return false
  end
  redis.call('HSET', state, 'turn', nxt)
  redis.call('HINCRBY', state, 'opened', 1)
  for i, id in ipairs(ids) do
    local trig = string.match(redis.call('HGET', decided, id) or '', '^%a+:[^:]*:(.*)$') or ''
    local kind = 'joined:'
    if i == 1 then kind = 'started:' end
    redis.call('HSET', decided, id, kind .. nxt .. ':' .. trig)
  end
  redis.call('ZREM', pending, ids[1])
  redis.call('HDEL', body, ids[1])
  for i = 0, 5 do redis.call('PEXPIRE', KEYS[k + i], ret) end
  return ids[1]
end
`

// threadCloseScript is closeLua on its own. KEYS: the thread's. ARGV:
// retention ms, the turn that ended, id of the next turn.
var threadCloseScript = redis.NewScript(closeLua + `return closeTurn(1, ARGV[1], ARGV[2], ARGV[3])`)

// closeCall runs closeLua at the end of a save script: the thread's keys
// are its last six keys and its arguments its last three.
const closeCall = `closeTurn(#KEYS - 5, ARGV[#ARGV - 2], ARGV[#ARGV - 1], ARGV[#ARGV])
`

// threadViewScript reads what a wait of the open turn considers besides
// the connection's event log: the event this wait took already (a run
// resumed after taking it) or else the events pending on the thread,
// oldest first.
//
// KEYS: pending, body, taken. ARGV: the wait's ledger key, how many
// pending events at most. Answers {1, id, event} or {0, id, event, …}.
var threadViewScript = redis.NewScript(`
local taken = redis.call('HGETALL', KEYS[3])
for i = 1, #taken, 2 do
  if taken[i + 1] == ARGV[1] then
    return {1, taken[i], redis.call('HGET', KEYS[2], taken[i]) or ''}
  end
end
local out = {0}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
end
return out
`)

// SubmitOnThread is SubmitOnce for an event on a thread (a trigger's
// entry): the document is validated first, so an event that can never
// start a turn decides nothing, then FollowThread decides.
func (e *Executions) SubmitOnThread(ctx context.Context, ev ThreadEvent) (Turn, error) {
	doc, err := document.ParseDocument(ev.Workflow, e.reg, "/workflow")
	if err != nil {
		return Turn{}, err
	}
	if problems := document.ResolveSetups(doc, e.reg, ev.Input, "/workflow"); len(problems) > 0 {
		return Turn{}, &fault.ValidationError{Problems: problems}
	}
	return e.FollowThread(ctx, ev)
}

// FollowThread answers where the entry's event went, deciding it on the
// first call (see threadDecideScript) and writing the record of the turn it
// starts. Any later call answers the same until the turn ends; after, the
// event has either been seen by that turn (same answer) or been handed to
// the next turn (which this call writes when the event starts it), so the
// inbox follows an event from turn to turn until one has seen it.
func (e *Executions) FollowThread(ctx context.Context, ev ThreadEvent) (Turn, error) {
	body, err := json.Marshal(ev.Event)
	if err != nil {
		return Turn{}, fmt.Errorf("executions: encode event %s: %w", ev.Event.ID, err)
	}
	d, err := threadDecideScript.Run(ctx, e.store.Client, e.threadKeys(ev.Thread),
		ev.Event.ID, newExecutionID(), ev.Trigger, body, e.retention.Milliseconds(), threadLabel(ev.Thread)).Text()
	if err != nil {
		return Turn{}, fmt.Errorf("executions: decide %s on thread %s: %w", ev.Event.ID, ev.Thread, err)
	}
	kind, id, trigger := parseDecision(d)
	turn := Turn{ID: id, Started: kind == "started" && trigger == ev.Trigger}
	if !turn.Started {
		return turn, nil
	}
	if rec, err := e.load(ctx, id); err == nil {
		// Written by an earlier call (this entry delivered again, or
		// followed after its turn ended): as SubmitOnce, make it whole.
		return turn, e.ensure(ctx, rec)
	} else if !errors.Is(err, fault.ErrNotFound) {
		return Turn{}, err
	}
	rec := newRecord(id, ev.Workflow, ev.Input, HostPrincipal, nil)
	rec.Thread = ev.Thread
	if _, turn.Created, err = e.enqueueRecord(ctx, rec); err != nil {
		return Turn{}, err
	}
	return turn, nil
}

// parseDecision splits "kind:execution:trigger".
func parseDecision(d string) (kind, id, trigger string) {
	kind, rest, _ := strings.Cut(d, ":")
	id, trigger, _ = strings.Cut(rest, ":")
	return kind, id, trigger
}

// EndTurn closes the thread after its turn id ended, or hands it to the
// next turn (see closeLua). The turn's final save does it already; the
// inbox calls it again when it sees the turn ended, which repairs a
// replica that died between the two on Redis Cluster. It is a no-op for a
// turn that is not the thread's open one.
func (e *Executions) EndTurn(ctx context.Context, thread, id string) error {
	err := threadCloseScript.Run(ctx, e.store.Client, e.threadKeys(thread), e.retention.Milliseconds(), id, newExecutionID()).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("executions: end turn %s on thread %s: %w", id, thread, err)
	}
	return nil
}

// AbandonTurn lets the thread go when the event that started its open
// turn will never write that turn's record (its entry went to the dead
// letters before it could): the turn is ended as if it had run, so the
// events that joined it start the next one.
func (e *Executions) AbandonTurn(ctx context.Context, thread, eventID, trigger string) error {
	keys := e.threadKeys(thread)
	d, err := e.store.Client.HGet(ctx, keys[1], eventID).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("executions: read thread %s: %w", thread, err)
	}
	kind, id, trig := parseDecision(d)
	if kind != "started" || trig != trigger {
		return nil
	}
	if _, err := e.load(ctx, id); !errors.Is(err, fault.ErrNotFound) {
		return err // the record exists (or cannot be read): its run ends the turn
	}
	return e.EndTurn(ctx, thread, id)
}

// Thread reads a thread's state.
func (e *Executions) Thread(ctx context.Context, thread string) (ThreadState, error) {
	keys := e.threadKeys(thread)
	var state *redis.MapStringStringCmd
	var pending *redis.IntCmd
	_, err := e.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		state = p.HGetAll(ctx, keys[0])
		pending = p.ZCard(ctx, keys[3])
		return nil
	})
	if err != nil {
		return ThreadState{}, fmt.Errorf("executions: read thread %s: %w", thread, err)
	}
	opened, _ := strconv.ParseInt(state.Val()["opened"], 10, 64)
	return ThreadState{Turn: state.Val()["turn"], Opened: opened, Pending: pending.Val()}, nil
}

// onThread reports whether a wait on conn takes events through the run's
// thread: the run is a turn on a thread of that connection.
func (r *run) onThread(conn string) bool {
	return r.rec.Thread != "" && threadConn(r.rec.Thread) == conn
}

// maxPendingLook bounds the pending events one look of a wait reads.
const maxPendingLook = 100

// threadEvent looks for the event a wait of a turn takes from its thread
// rather than from the connection's log: the one this wait took before
// its run was cut short, else the earliest pending event it matches (one
// that joined before the wait began listening, or that the log lost).
// Events received after the deadline do not count, as in listen.
func (r *run) threadEvent(ctx context.Context, f *frame, n *document.Node, key string, deadline time.Time) (any, bool, error) {
	keys := r.e.threadKeys(r.rec.Thread)
	res, err := threadViewScript.Run(ctx, r.e.store.Client, []string{keys[3], keys[4], keys[5]}, key, maxPendingLook).Slice()
	if err != nil {
		return nil, false, r.storage(ctx, fmt.Errorf("executions: read thread %s: %w", r.rec.Thread, err))
	}
	mine, _ := res[0].(int64)
	for i := 1; i+1 < len(res); i += 2 {
		id, _ := res[i].(string)
		raw, _ := res[i+1].(string)
		var ev map[string]any
		if json.Unmarshal([]byte(raw), &ev) != nil {
			continue
		}
		if mine == 1 {
			return r.e.redact(ev), true, nil
		}
		if ev["type"] != n.Event || receivedAfter(ev, deadline) {
			continue
		}
		ok, err := r.matches(f, n, ev)
		if err != nil {
			return nil, false, &stepError{step: n.ID, code: fault.StepFailed, err: err}
		}
		if !ok {
			continue
		}
		took, err := r.take(ctx, key, id, []byte(raw))
		if err != nil || took {
			return r.e.redact(ev), took, err
		}
	}
	return nil, false, nil
}

// receivedAfter reports whether the event was received after t.
func receivedAfter(ev map[string]any, t time.Time) bool {
	s, _ := ev["receivedAt"].(string)
	at, err := time.Parse(time.RFC3339Nano, s)
	return err == nil && at.After(t)
}

// take records that the wait key of this turn takes the event (see
// threadTakeScript); false: the event belongs to another turn.
func (r *run) take(ctx context.Context, key, id string, raw []byte) (bool, error) {
	keys := r.e.threadKeys(r.rec.Thread)
	if !r.e.clustered() {
		keys = append(keys, r.e.epochKey(r.rec.ID))
	}
	n, err := threadTakeScript.Run(ctx, r.e.store.Client, keys,
		id, r.rec.ID, key, raw, r.e.retention.Milliseconds(), threadLabel(r.rec.Thread), r.epoch).Int()
	if err != nil {
		return false, r.storage(ctx, fmt.Errorf("executions: take %s on thread %s: %w", id, r.rec.Thread, err))
	}
	if n < 0 {
		return false, ErrFenced
	}
	return n == 1, nil
}

// takeLogged is take for an event read from the connection's log.
func (r *run) takeLogged(ctx context.Context, key string, m redis.XMessage) (bool, error) {
	raw, _ := m.Values["event"].(string)
	var ev struct {
		ID string `json:"id"`
	}
	if json.Unmarshal([]byte(raw), &ev) != nil || ev.ID == "" {
		return false, nil
	}
	return r.take(ctx, key, ev.ID, []byte(raw))
}
