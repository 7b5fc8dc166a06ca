package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// Submitting an execution writes three things: its record, its entry in the
// time index (what GET /v1/executions pages through) and its work item on
// the work stream (what a worker claims). Written one after the other, a
// process (or Redis) dying in between leaves a record that is never listed,
// or a queued record that no worker will ever run. So submitScript writes
// all three in one step: Redis runs a script atomically, and with AOF it
// persists (or loses) the script's writes together. A script's first write
// is where Redis refuses one under memory pressure, so a refusal writes
// nothing.
//
// Redis Cluster cannot run a script over keys in different slots (the
// record is under {exec:ID}, the index and the stream are shared), so there
// the three are written in order (record, then index and item together)
// and the repair sweep closes the window a crash may leave open.
//
// The repair sweep (Repair) finds what an older version, a Cluster
// submission or anything else left behind: records missing from the time
// index are indexed, and queued records that have no work item get one.
// Each replica sweeps when it starts and every RepairEvery; a lock in Redis
// lets one replica sweep per half interval, and every repair is idempotent
// (the index entry is derived from the record; a second work item for one
// execution is harmless, as a worker skips an execution that is terminal
// or claimed), so replicas that sweep at once do no harm.

// DefaultRepairEvery is how often a replica sweeps for unindexed and
// unqueued executions. The sweep scans every execution record, so it runs
// rarely; with atomic submission it only ever finds what an older version
// or a Cluster submission's crash left behind.
const DefaultRepairEvery = 10 * time.Minute

// repairGrace: a queued record younger than this is left alone by the
// sweep, so a submission in flight on the Cluster path (record written,
// item not yet) is not given a second item.
const repairGrace = 30 * time.Second

// submitScript writes a new execution: the record only if absent, and with
// it its index entry and its work item. It returns 1 when it wrote them, 0
// when the record existed (written by an earlier attempt, possibly by an
// older version that did not index or queue it: the caller repairs it).
// Run twice (go-redis retries), the second run answers 0 and the caller's
// repair finds everything in place.
//
// Redis does not undo a script's writes when a later command fails, so
// the script checks first what could make one fail (a shared key of the
// wrong type) and then writes nothing.
//
// The execution's first event (queued) is written with them, saving the
// submission a round trip.
//
// KEYS: record, index, work stream, events. ARGV: record JSON, retention
// ms, index member, execution id, the queued event's data.
var submitScript = redis.NewScript(`
local ti = redis.call('TYPE', KEYS[2])
local tw = redis.call('TYPE', KEYS[3])
ti, tw = ti.ok or ti, tw.ok or tw
if (ti ~= 'zset' and ti ~= 'none') or (tw ~= 'stream' and tw ~= 'none') then
  return redis.error_reply('WRONGTYPE executions: the index or the work stream holds the wrong kind of value')
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[2], 0, ARGV[3])
redis.call('XADD', KEYS[3], '*', 'id', ARGV[4])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '` + strconv.Itoa(maxEvents) + `', '*', 'type', '` + EventState + `', 'data', ARGV[5])
redis.call('PEXPIRE', KEYS[4], ARGV[2])
return 1
`)

// queuedEvent is the data of the event a submission writes.
var queuedEvent = []byte(`{"status":"` + string(ExecQueued) + `"}`)

// clustered reports whether the store is a Redis Cluster, where a script
// cannot span the record's slot and the shared keys'.
func (e *Executions) clustered() bool {
	_, ok := e.store.Client.(*redis.ClusterClient)
	return ok
}

// write stores a new record with its index entry and work item, in one
// step where Redis allows it. fresh is false when the record existed;
// reported is true when the queued event was written with it.
func (e *Executions) write(ctx context.Context, id string, data []byte, member string) (fresh, reported bool, err error) {
	if !e.clustered() {
		n, err := submitScript.Run(ctx, e.store.Client, []string{e.recordKey(id), e.indexKey(), e.workKey(), e.eventsKey(id)},
			data, e.retention.Milliseconds(), member, id, queuedEvent).Int()
		if err != nil {
			return false, false, fmt.Errorf("executions: submit %s: %w", id, err)
		}
		return n == 1, n == 1, nil
	}
	fresh, err = e.writeClustered(ctx, id, data, member)
	return fresh, false, err
}

// writeClustered is write on Redis Cluster: in order, as the keys are in
// different slots.
func (e *Executions) writeClustered(ctx context.Context, id string, data []byte, member string) (fresh bool, err error) {
	// The record goes first so a worker never claims an id it cannot
	// read; a crash before the second step is repaired by the sweep.
	fresh, err = e.store.Client.SetNX(ctx, e.recordKey(id), data, e.retention).Result()
	if err != nil {
		return false, fmt.Errorf("executions: submit %s: %w", id, err)
	}
	if !fresh {
		return false, nil
	}
	_, err = e.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, e.indexKey(), redis.Z{Member: member})
		p.XAdd(ctx, &redis.XAddArgs{Stream: e.workKey(), Values: map[string]any{"id": id}})
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("executions: submit %s: index and queue: %w", id, err)
	}
	return true, nil
}

// ensure makes an existing record whole: indexed and, while queued, with a
// work item. It serves a submission that found its record written already
// (a retry, a redelivered event), which may have been written by a process
// that died before the rest. The queued item may be a second one, which is
// harmless.
func (e *Executions) ensure(ctx context.Context, rec *record) error {
	_, err := e.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, e.indexKey(), redis.Z{Member: indexMember(rec.CreatedAt, rec.ID)})
		if rec.Status == ExecQueued {
			p.XAdd(ctx, &redis.XAddArgs{Stream: e.workKey(), Values: map[string]any{"id": rec.ID}})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("executions: repair %s: %w", rec.ID, err)
	}
	return nil
}

// RepairReport counts what one repair sweep found and fixed.
type RepairReport struct {
	Records  int // execution records scanned
	Indexed  int // records that were missing from the time index
	Requeued int // queued records that had no work item
	Resumed  int // waiting records whose approval was decided with no run after it
}

func (e *Executions) repairLockKey() string { return e.store.Key("repair-lock") }

// repairLoop sweeps at start and every repairEvery. The lock lets one
// replica sweep per half interval; a replica that finds it held skips.
func (e *Executions) repairLoop(ctx context.Context) {
	for ctx.Err() == nil {
		ok, err := e.store.Client.SetNX(ctx, e.repairLockKey(), e.consumer, e.repairEvery/2).Result()
		switch {
		case err != nil:
			if ctx.Err() == nil {
				e.logger.Warn("repair sweep: lock", "err", err)
			}
		case ok:
			rep, err := e.Repair(ctx)
			if err != nil && ctx.Err() == nil {
				e.logger.Warn("repair sweep failed", "err", err)
			}
			if rep.Indexed > 0 || rep.Requeued > 0 || rep.Resumed > 0 {
				e.logger.Warn("repair sweep fixed executions left unindexed, unqueued or parked after their approval",
					"records", rep.Records, "indexed", rep.Indexed, "requeued", rep.Requeued, "resumed", rep.Resumed)
			}
		}
		Sleep(ctx, e.repairEvery)
	}
}

// Repair sweeps every execution record once: a record missing from the
// time index is indexed; a queued record older than a short grace period
// with no item on the work stream gets one; a waiting record whose
// approval was decided more than that grace period ago is enqueued. It is safe to run on several
// replicas at once. Records whose creation is older than the retention are
// left out of the index, as List would trim them at once.
func (e *Executions) Repair(ctx context.Context) (RepairReport, error) {
	var rep RepairReport
	var queued []string
	var waiting []string
	cutoff := time.Now().Add(-e.retention)
	graceEnd := time.Now().Add(-e.repairGrace)
	err := e.scanKeys(ctx, globEscape(e.store.Prefix)+"{exec:*}:record", func(keys []string) error {
		recs, err := e.readHeads(ctx, keys)
		if err != nil {
			return err
		}
		rep.Records += len(recs)
		members := make([]string, len(recs))
		scores := make([]*redis.FloatCmd, len(recs))
		_, err = e.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, r := range recs {
				members[i] = indexMember(r.CreatedAt, r.ID)
				scores[i] = p.ZScore(ctx, e.indexKey(), members[i])
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return fmt.Errorf("read index: %w", err)
		}
		var missing []redis.Z
		for _, r := range recs {
			if r.Status == ExecWaiting {
				waiting = append(waiting, r.ID)
			}
		}
		for i, r := range recs {
			if errors.Is(scores[i].Err(), redis.Nil) && r.CreatedAt.After(cutoff) {
				missing = append(missing, redis.Z{Member: members[i]})
			}
			if r.Status == ExecQueued && r.CreatedAt.Before(graceEnd) {
				queued = append(queued, r.ID)
			}
		}
		if len(missing) > 0 {
			if err := e.store.Client.ZAdd(ctx, e.indexKey(), missing...).Err(); err != nil {
				return fmt.Errorf("index: %w", err)
			}
			rep.Indexed += len(missing)
		}
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("executions: repair: %w", err)
	}
	if rep.Resumed, err = e.resumeDecided(ctx, waiting, graceEnd); err != nil {
		return rep, fmt.Errorf("executions: repair: %w", err)
	}
	if len(queued) == 0 {
		return rep, nil
	}
	// The stream is read after the records: an item that existed when its
	// record was seen queued stays until the execution has moved on, so a
	// queued record whose id is not on the stream now has no item.
	items, err := e.workItems(ctx)
	if err != nil {
		return rep, fmt.Errorf("executions: repair: %w", err)
	}
	for _, id := range queued {
		if items[id] {
			continue
		}
		rec, err := e.load(ctx, id)
		if errors.Is(err, fault.ErrNotFound) {
			continue
		}
		if err != nil {
			return rep, fmt.Errorf("executions: repair: %w", err)
		}
		if rec.Status != ExecQueued {
			continue // it moved on since it was read
		}
		if err := e.resume(ctx, id); err != nil {
			return rep, fmt.Errorf("executions: repair: %w", err)
		}
		rep.Requeued++
	}
	return rep, nil
}

// head is the part of a record the sweep needs.
type head struct {
	ID        string    `json:"id"`
	Status    ExecState `json:"status"`
	CreatedAt time.Time `json:"createdAt"`
}

// resumeDecided enqueues each waiting execution with a step still held at
// an approval decided (or expired) before graceEnd: a run resumed by the
// decision would have moved the step on, so the process that recorded the
// decision died before it enqueued the run. A second work item for an
// execution already on its way is harmless: a worker skips a run that is
// claimed or not waiting.
func (e *Executions) resumeDecided(ctx context.Context, waiting []string, graceEnd time.Time) (int, error) {
	resumed := 0
	for _, id := range waiting {
		rec, err := e.load(ctx, id)
		if errors.Is(err, fault.ErrNotFound) {
			continue
		}
		if err != nil {
			return resumed, err
		}
		due, err := e.decidedBefore(ctx, rec, graceEnd)
		if err != nil {
			return resumed, err
		}
		if !due {
			continue
		}
		if err := e.resume(ctx, id); err != nil {
			return resumed, err
		}
		resumed++
	}
	return resumed, nil
}

// decidedBefore reports whether a waiting record has a step held at an
// approval that was decided before t.
func (e *Executions) decidedBefore(ctx context.Context, rec *record, t time.Time) (bool, error) {
	if rec.Status != ExecWaiting {
		return false, nil
	}
	for _, st := range rec.Steps {
		if st.Status != StepWaiting || st.ApprovalID == "" {
			continue
		}
		ap, err := e.approvals.Get(ctx, st.ApprovalID)
		if errors.Is(err, gates.ErrApprovalNotFound) {
			continue
		}
		if err != nil {
			return false, err
		}
		if ap.State != gates.ApprovalPending && ap.DecidedAt != nil && ap.DecidedAt.Before(t) {
			return true, nil
		}
	}
	return false, nil
}

func (e *Executions) readHeads(ctx context.Context, keys []string) ([]head, error) {
	cmds := make([]*redis.StringCmd, len(keys))
	_, err := e.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Get(ctx, k)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read records: %w", err)
	}
	out := make([]head, 0, len(keys))
	for _, c := range cmds {
		data, err := c.Bytes()
		if err != nil {
			continue // expired since the scan saw it
		}
		var h head
		if json.Unmarshal(data, &h) == nil && h.ID != "" {
			out = append(out, h)
		}
	}
	return out, nil
}

// workItems returns the ids of the executions with an item on the work
// stream (new or pending).
func (e *Executions) workItems(ctx context.Context) (map[string]bool, error) {
	ids := map[string]bool{}
	start := "-"
	for {
		msgs, err := e.store.Client.XRangeN(ctx, e.workKey(), start, "+", 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("read work stream: %w", err)
		}
		for _, m := range msgs {
			if id, ok := m.Values["id"].(string); ok {
				ids[id] = true
			}
		}
		if len(msgs) < 1000 {
			return ids, nil
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}

// scanKeys calls fn with each batch of keys matching pattern, on every
// master of a Cluster.
func (e *Executions) scanKeys(ctx context.Context, pattern string, fn func([]string) error) error {
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
			if err != nil {
				return fmt.Errorf("scan: %w", err)
			}
			if len(keys) > 0 {
				if err := fn(keys); err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	if cc, ok := e.store.Client.(*redis.ClusterClient); ok {
		// Masters are scanned at once; fn sees one batch at a time.
		var mu sync.Mutex
		inner := fn
		fn = func(keys []string) error {
			mu.Lock()
			defer mu.Unlock()
			return inner(keys)
		}
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	}
	return scan(ctx, e.store.Client)
}

// globEscape escapes the glob characters of s for SCAN MATCH.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
