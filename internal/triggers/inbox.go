package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// group is the consumer group every replica reads the inboxes through.
const group = "triggers"

// inbox is the Redis side of one connection's inbox.
type inbox struct {
	st   *store.Store
	conn string
	tag  string
}

func newInbox(st *store.Store, conn string) *inbox {
	return &inbox{st: st, conn: conn, tag: "{in:" + conn + "}"}
}

func (in *inbox) key(parts ...string) string {
	return in.st.Key(append([]string{in.tag}, parts...)...)
}
func (in *inbox) stream() string { return in.key("stream") }
func (in *inbox) state() string  { return in.key("state") }
func (in *inbox) log() string    { return in.key("log") }
func (in *inbox) dead() string   { return in.key("dead") }

// ingestScript dedupes, appends and advances the cursor in one step.
//
// KEYS: stream, state, log, dedupe keys…
// ARGV: nonce, dedupe ttl ms, event JSON, cursor ("" for none), cursor
// must advance ("1"/"0"), received ms, accepted receipt, duplicate
// receipt, log size, trigger ids…
//
// A retry of the same call (same nonce) finds its own marks and answers
// accepted again without appending twice.
var ingestScript = redis.NewScript(`
local nd = #KEYS - 3
for i = 1, nd do
  local v = redis.call('GET', KEYS[3 + i])
  if v then
    if v == ARGV[1] then return {1} end
    redis.call('HINCRBY', KEYS[2], 'duplicate', 1)
    redis.call('LPUSH', KEYS[3], ARGV[8])
    redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[9]) - 1)
    return {0}
  end
end
if ARGV[4] ~= '' and ARGV[5] == '1' then
  local cur = redis.call('HGET', KEYS[2], 'cursor')
  if cur and tonumber(cur) >= tonumber(ARGV[4]) then
    redis.call('HINCRBY', KEYS[2], 'duplicate', 1)
    return {0}
  end
end
for i = 1, nd do
  redis.call('SET', KEYS[3 + i], ARGV[1], 'PX', ARGV[2])
end
for i = 10, #ARGV do
  redis.call('XADD', KEYS[1], '*', 't', ARGV[i], 'e', ARGV[3])
  redis.call('HINCRBY', KEYS[2], 't:' .. ARGV[i] .. ':received', 1)
end
redis.call('HINCRBY', KEYS[2], 'accepted', 1)
redis.call('HSET', KEYS[2], 'lastEventAt', ARGV[6])
if ARGV[4] ~= '' then
  local cur = redis.call('HGET', KEYS[2], 'cursor')
  if not cur or tonumber(cur) < tonumber(ARGV[4]) then
    redis.call('HSET', KEYS[2], 'cursor', ARGV[4])
  end
end
redis.call('LPUSH', KEYS[3], ARGV[7])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[9]) - 1)
return {1}
`)

// advanceScript moves the cursor forward, never back.
var advanceScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'cursor')
if not cur or tonumber(cur) < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'cursor', ARGV[1])
  return 1
end
return 0
`)

// doneScript records an entry done: acknowledged, deleted and counted,
// once even when two replicas finish it.
var doneScript = redis.NewScript(`
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('XDEL', KEYS[1], ARGV[2])
  redis.call('HINCRBY', KEYS[2], 't:' .. ARGV[3] .. ':' .. ARGV[4], 1)
  return 1
end
return 0
`)

// deadScript moves an entry that is still pending to the dead letters.
var deadScript = redis.NewScript(`
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('XDEL', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[4])
  redis.call('HINCRBY', KEYS[2], 't:' .. ARGV[3] .. ':dead', 1)
  return 1
end
return 0
`)

// redeliverScript takes a dead letter out and appends it again.
var redeliverScript = redis.NewScript(`
if redis.call('HDEL', KEYS[3], ARGV[1]) == 1 then
  local id = redis.call('XADD', KEYS[1], '*', 't', ARGV[2], 'e', ARGV[3])
  redis.call('HINCRBY', KEYS[2], 't:' .. ARGV[2] .. ':redelivered', 1)
  return id
end
return false
`)

// ingestArgs is one ingest call.
type ingestArgs struct {
	event       []byte
	dedupe      []string // keys, already built
	ttl         time.Duration
	cursor      string
	mustAdvance bool
	received    time.Time
	accepted    []byte // receipt JSON
	duplicate   []byte
	logSize     int
	triggers    []string
}

func (in *inbox) ingest(ctx context.Context, nonce string, a ingestArgs) (bool, error) {
	keys := append([]string{in.stream(), in.state(), in.log()}, a.dedupe...)
	adv := "0"
	if a.mustAdvance {
		adv = "1"
	}
	argv := []any{nonce, a.ttl.Milliseconds(), a.event, a.cursor, adv, a.received.UnixMilli(), a.accepted, a.duplicate, a.logSize}
	for _, t := range a.triggers {
		argv = append(argv, t)
	}
	res, err := ingestScript.Run(ctx, in.st.Client, keys, argv...).Slice()
	if err != nil {
		return false, fmt.Errorf("inbox %s: ingest: %w", in.conn, err)
	}
	return len(res) > 0 && res[0] == int64(1), nil
}

// reject counts a refused delivery and logs it.
func (in *inbox) reject(ctx context.Context, receipt []byte, logSize int) error {
	_, err := in.st.Client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HIncrBy(ctx, in.state(), "rejected", 1)
		p.LPush(ctx, in.log(), receipt)
		p.LTrim(ctx, in.log(), 0, int64(logSize-1))
		return nil
	})
	if err != nil {
		return fmt.Errorf("inbox %s: reject: %w", in.conn, err)
	}
	return nil
}

func (in *inbox) ensureGroup(ctx context.Context) error {
	err := in.st.Client.XGroupCreateMkStream(ctx, in.stream(), group, "0").Err()
	if err != nil && !strings.Contains(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("inbox %s: create group: %w", in.conn, err)
	}
	return nil
}

func (in *inbox) done(ctx context.Context, entry, trigger, outcome string) error {
	err := doneScript.Run(ctx, in.st.Client, []string{in.stream(), in.state()}, group, entry, trigger, outcome).Err()
	if err != nil {
		return fmt.Errorf("inbox %s: done %s: %w", in.conn, entry, err)
	}
	return nil
}

// turns is the hash of where an event's entries went, by trigger.
func (in *inbox) turns(eventID string) string { return in.key("turns", eventID) }

// noteTurn records that the entry of trigger for the event started or
// joined turn, for as long as the event is deduplicated (the delivery log
// and the dead letters show it), and counts it: joined, or delivered when
// this entry wrote the turn. One round trip, as the count alone took.
func (in *inbox) noteTurn(ctx context.Context, eventID, trigger string, turn harness.Turn, ttl time.Duration) error {
	key := in.turns(eventID)
	_, err := in.st.Client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, trigger, turn.How()+":"+turn.ID)
		p.PExpire(ctx, key, ttl)
		if !turn.Started {
			p.HIncrBy(ctx, in.state(), "t:"+trigger+":joined", 1)
		}
		if turn.Created {
			p.HIncrBy(ctx, in.state(), "t:"+trigger+":delivered", 1)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("inbox %s: note turn of %s: %w", in.conn, eventID, err)
	}
	return nil
}

// EntryTurn is where one entry of an event went: the turn its event
// started or joined.
type EntryTurn struct {
	Trigger string `json:"trigger"`
	// How is "started" or "joined".
	How       string `json:"how"`
	Execution string `json:"execution"`
}

// turnsOf reads where the entries of each event went, by event id.
func (in *inbox) turnsOf(ctx context.Context, eventIDs []string) (map[string][]EntryTurn, error) {
	cmds := make([]*redis.MapStringStringCmd, len(eventIDs))
	_, err := in.st.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range eventIDs {
			cmds[i] = p.HGetAll(ctx, in.turns(id))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("inbox %s: turns: %w", in.conn, err)
	}
	out := make(map[string][]EntryTurn, len(eventIDs))
	for i, id := range eventIDs {
		for _, trigger := range slices.Sorted(maps.Keys(cmds[i].Val())) {
			how, exec, _ := strings.Cut(cmds[i].Val()[trigger], ":")
			out[id] = append(out[id], EntryTurn{Trigger: trigger, How: how, Execution: exec})
		}
	}
	return out, nil
}

func (in *inbox) count(ctx context.Context, field string) {
	in.st.Client.HIncrBy(ctx, in.state(), field, 1)
}

// DeadLetter is an inbox entry that was delivered MaxDeliveries times
// without its turn completing, or that can never start one.
type DeadLetter struct {
	// ID is "<connection>:<entry id>", as the redeliver route takes it.
	ID         string    `json:"id"`
	Connection string    `json:"connection"`
	Trigger    string    `json:"trigger"`
	Event      Event     `json:"event"`
	Deliveries int64     `json:"deliveries"`
	Reason     string    `json:"reason"`
	DeadAt     time.Time `json:"deadAt"`
	// Execution is the turn the entry's event started or joined, when it
	// got that far; Turn says which ("started" or "joined").
	Execution string `json:"execution,omitempty"`
	Turn      string `json:"turn,omitempty"`
}

func (in *inbox) bury(ctx context.Context, entry string, dl DeadLetter) (bool, error) {
	data, err := json.Marshal(dl)
	if err != nil {
		return false, err
	}
	n, err := deadScript.Run(ctx, in.st.Client, []string{in.stream(), in.state(), in.dead()}, group, entry, dl.Trigger, data).Int()
	if err != nil {
		return false, fmt.Errorf("inbox %s: dead-letter %s: %w", in.conn, entry, err)
	}
	return n == 1, nil
}

func (in *inbox) deadLetters(ctx context.Context) ([]DeadLetter, error) {
	m, err := in.st.Client.HGetAll(ctx, in.dead()).Result()
	if err != nil {
		return nil, fmt.Errorf("inbox %s: dead letters: %w", in.conn, err)
	}
	out := make([]DeadLetter, 0, len(m))
	for _, v := range m {
		var dl DeadLetter
		if json.Unmarshal([]byte(v), &dl) == nil {
			out = append(out, dl)
		}
	}
	return out, nil
}

// ErrDeadLetterNotFound is returned for a dead-letter id that does not
// exist (or was redelivered already).
var ErrDeadLetterNotFound = errors.New("dead letter not found")

func (in *inbox) redeliver(ctx context.Context, entry string) (string, error) {
	v, err := in.st.Client.HGet(ctx, in.dead(), entry).Result()
	if errors.Is(err, redis.Nil) {
		return "", ErrDeadLetterNotFound
	}
	if err != nil {
		return "", fmt.Errorf("inbox %s: read dead letter: %w", in.conn, err)
	}
	var dl DeadLetter
	if err := json.Unmarshal([]byte(v), &dl); err != nil {
		return "", fmt.Errorf("inbox %s: decode dead letter: %w", in.conn, err)
	}
	ev, err := json.Marshal(dl.Event)
	if err != nil {
		return "", err
	}
	id, err := redeliverScript.Run(ctx, in.st.Client, []string{in.stream(), in.state(), in.dead()}, entry, dl.Trigger, ev).Text()
	if errors.Is(err, redis.Nil) {
		return "", ErrDeadLetterNotFound
	}
	if err != nil {
		return "", fmt.Errorf("inbox %s: redeliver: %w", in.conn, err)
	}
	return id, nil
}

// Receipt is one delivery to a connection as kept for the admin UI.
type Receipt struct {
	At time.Time `json:"at"`
	// Via is how it came: webhook, api or cron.
	Via string `json:"via"`
	// Outcome is accepted, duplicate or rejected.
	Outcome   string `json:"outcome"`
	Status    int    `json:"status,omitempty"`
	Reason    string `json:"reason,omitempty"`
	WebhookID string `json:"webhookId,omitempty"`
	EventID   string `json:"eventId,omitempty"`
	Type      string `json:"type,omitempty"`
	Triggers  int    `json:"triggers"`
	// Turns are where the event's entries went (one per trigger it
	// matched), once delivered.
	Turns []EntryTurn `json:"turns,omitempty"`
}

func (in *inbox) receipts(ctx context.Context, n int) ([]Receipt, error) {
	vals, err := in.st.Client.LRange(ctx, in.log(), 0, int64(n-1)).Result()
	if err != nil {
		return nil, fmt.Errorf("inbox %s: deliveries: %w", in.conn, err)
	}
	out := make([]Receipt, 0, len(vals))
	var ids []string
	for _, v := range vals {
		var r Receipt
		if json.Unmarshal([]byte(v), &r) == nil {
			out = append(out, r)
			if r.Outcome == "accepted" && r.Triggers > 0 {
				ids = append(ids, r.EventID)
			}
		}
	}
	turns, err := in.turnsOf(ctx, ids)
	if err != nil {
		return nil, err
	}
	for i := range out {
		if out[i].Outcome == "accepted" {
			out[i].Turns = turns[out[i].EventID]
		}
	}
	return out, nil
}

// stateOf reads the state hash.
func (in *inbox) stateOf(ctx context.Context) (map[string]string, error) {
	m, err := in.st.Client.HGetAll(ctx, in.state()).Result()
	if err != nil {
		return nil, fmt.Errorf("inbox %s: state: %w", in.conn, err)
	}
	return m, nil
}

func (in *inbox) cursor(ctx context.Context) (int64, bool, error) {
	v, err := in.st.Client.HGet(ctx, in.state(), "cursor").Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("inbox %s: cursor: %w", in.conn, err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil, err
}

// initCursor sets the cursor when none is set and returns the cursor.
func (in *inbox) initCursor(ctx context.Context, ms int64) (int64, error) {
	if err := in.st.Client.HSetNX(ctx, in.state(), "cursor", ms).Err(); err != nil {
		return 0, fmt.Errorf("inbox %s: cursor: %w", in.conn, err)
	}
	n, _, err := in.cursor(ctx)
	return n, err
}

func (in *inbox) advance(ctx context.Context, ms int64) error {
	if err := advanceScript.Run(ctx, in.st.Client, []string{in.state()}, ms).Err(); err != nil {
		return fmt.Errorf("inbox %s: advance cursor: %w", in.conn, err)
	}
	return nil
}
