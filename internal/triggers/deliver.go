package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// deliverer reads one connection's inbox: new entries, and entries of
// replicas that stopped renewing them.
type deliverer struct {
	s   *Service
	src *source
	in  *inbox

	sem chan struct{}

	mu   sync.Mutex
	held map[string]bool // entry ids this replica is working on
}

func newDeliverer(s *Service, src *source) *deliverer {
	return &deliverer{s: s, src: src, in: src.inbox, sem: make(chan struct{}, s.maxInFlight), held: map[string]bool{}}
}

func (d *deliverer) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { d.renew(ctx) })
	wg.Go(func() { d.reclaim(ctx) })
	consumer := d.s.consumer
	for ctx.Err() == nil {
		// Wait for room before reading, so entries are not claimed by a
		// replica that cannot start them.
		select {
		case d.sem <- struct{}{}:
			<-d.sem
		case <-ctx.Done():
			continue
		}
		room := cap(d.sem) - len(d.sem)
		streams, err := d.s.st.Client.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: group, Consumer: consumer, Streams: []string{d.in.stream(), ">"}, Count: int64(min(room, 256)), Block: time.Second,
		}).Result()
		if errors.Is(err, redis.Nil) || ctx.Err() != nil {
			continue
		}
		if err != nil {
			if isNoGroup(err) {
				_ = d.in.ensureGroup(ctx)
				continue
			}
			d.s.logger.Error("inbox read failed", "connection", d.src.name, "err", err)
			harness.Sleep(ctx, time.Second)
			continue
		}
		for _, m := range streams[0].Messages {
			d.start(ctx, &wg, m, 1)
		}
	}
	wg.Wait()
}

func isNoGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOGROUP")
}

func (d *deliverer) start(ctx context.Context, wg *sync.WaitGroup, m redis.XMessage, deliveries int64) {
	select {
	case d.sem <- struct{}{}:
	case <-ctx.Done():
		return
	}
	d.mu.Lock()
	d.held[m.ID] = true
	d.mu.Unlock()
	wg.Go(func() {
		defer func() {
			d.mu.Lock()
			delete(d.held, m.ID)
			d.mu.Unlock()
			<-d.sem
		}()
		d.handle(ctx, m, deliveries)
	})
}

// handle starts the entry's turn, waits for it to be terminal and records
// the entry done. On a failure that may pass, it returns with the entry
// still pending, for a reclaim after ReclaimAfter.
func (d *deliverer) handle(ctx context.Context, m redis.XMessage, deliveries int64) {
	tid, _ := m.Values["t"].(string)
	raw, _ := m.Values["e"].(string)
	var ev Event
	if err := json.Unmarshal([]byte(raw), &ev); err != nil {
		d.bury(ctx, m.ID, tid, ev, deliveries, "", "event cannot be decoded: "+err.Error())
		return
	}
	ctx = traceContext(ctx, &ev)
	t, ok := d.s.triggers[tid]
	if !ok || t.Connection != d.src.name {
		d.bury(ctx, m.ID, tid, ev, deliveries, "", "trigger "+tid+" is no longer configured")
		return
	}
	natural, err := d.s.naturalThread(ctx, ev)
	if err != nil {
		d.bury(ctx, m.ID, tid, ev, deliveries, "", err.Error())
		return
	}
	input, err := t.turnInput(ev, natural)
	if err != nil {
		d.bury(ctx, m.ID, tid, ev, deliveries, "", err.Error())
		return
	}
	key := d.src.name + ":" + t.ID + ":" + ev.ID
	thread, onThread, err := t.explicitThread(ev, natural)
	if err != nil {
		d.bury(ctx, m.ID, tid, ev, deliveries, "", err.Error())
		return
	}
	if onThread {
		d.followThread(ctx, m, t, ev, deliveries, harness.ThreadEvent{
			Thread: thread, Trigger: t.ID, Workflow: t.Document, Input: input,
			Event: harness.ConnEvent{Connection: ev.Connection, Type: ev.Type, ID: ev.ID, Payload: ev.Payload, ReceivedAt: ev.ReceivedAt},
		})
		return
	}
	ex, created, err := d.s.execs.SubmitOnce(ctx, key, t.Document, input)
	if err != nil {
		d.submitFailed(ctx, m, t, ev, deliveries, err)
		return
	}
	d.noteTurn(ctx, t, ev, harness.Turn{ID: ex.ID, Started: true, Created: created})
	final, err := d.await(ctx, ex.ID)
	if err != nil {
		if ctx.Err() == nil {
			d.s.logger.Warn("lost track of an event's execution; it is retried after the reclaim timeout", "trigger", t.ID, "execution", ex.ID, "err", err)
		}
		return
	}
	d.finish(ctx, m, t, final)
}

// submitFailed buries an entry whose turn can never start, and leaves one
// whose failure may pass for a reclaim.
func (d *deliverer) submitFailed(ctx context.Context, m redis.XMessage, t *trigger, ev Event, deliveries int64, err error) {
	if isPermanent(err) {
		d.bury(ctx, m.ID, t.ID, ev, deliveries, "", "workflow does not validate: "+err.Error())
		return
	}
	d.in.count(ctx, "t:"+t.ID+":errors")
	d.s.logger.Warn("could not start the turn of an event; it is retried after the reclaim timeout", "trigger", t.ID, "event", ev.ID, "err", err)
}

// noteTurn records where the entry's event went and counts it (see
// inbox.noteTurn).
func (d *deliverer) noteTurn(ctx context.Context, t *trigger, ev Event, turn harness.Turn) {
	if err := d.in.noteTurn(ctx, ev.ID, t.ID, turn, d.src.dedupe); err != nil {
		d.s.logger.Warn("could not note an event's turn", "trigger", t.ID, "event", ev.ID, "err", err)
	}
	if turn.Created {
		d.s.observer.Started(d.src.name, t.ID, time.Since(ev.ReceivedAt))
	}
}

// finish records the entry done with its turn's outcome.
func (d *deliverer) finish(ctx context.Context, m redis.XMessage, t *trigger, final *harness.Execution) {
	outcome := "succeeded"
	if final.Status != harness.ExecSucceeded {
		outcome = "failed"
	}
	if err := d.in.done(context.WithoutCancel(ctx), m.ID, t.ID, outcome); err != nil {
		d.s.logger.Warn("could not record an event done", "trigger", t.ID, "entry", m.ID, "err", err)
	}
}

// followThread starts or joins the turn of an entry on a thread, and
// stays with the event until a turn has seen it: when the turn it joined
// ends without a wait of it taking the event, the event starts (or joins)
// the next turn on the thread, and the entry follows it there. The entry
// is done with the outcome of the turn that saw its event.
func (d *deliverer) followThread(ctx context.Context, m redis.XMessage, t *trigger, ev Event, deliveries int64, te harness.ThreadEvent) {
	turn, err := d.s.execs.SubmitOnThread(ctx, te)
	if err != nil {
		d.submitFailed(ctx, m, t, ev, deliveries, err)
		return
	}
	noted := harness.Turn{}
	unwritten := 50 * time.Millisecond
	for {
		if turn.ID != noted.ID || turn.Started != noted.Started {
			d.noteTurn(ctx, t, ev, turn)
			noted = turn
		}
		final, err := d.await(ctx, turn.ID)
		switch {
		case errors.Is(err, fault.ErrNotFound):
			// Joined a turn whose starting entry has not written its
			// record yet (its replica died in between, and the entry
			// waits for a reclaim): look again, it may also have been
			// given up (AbandonTurn) and the event handed on.
			harness.Sleep(ctx, unwritten)
			unwritten = min(2*unwritten, time.Second)
		case err != nil:
			if ctx.Err() == nil {
				d.s.logger.Warn("lost track of an event's turn; it is retried after the reclaim timeout", "trigger", t.ID, "execution", turn.ID, "err", err)
			}
			return
		default:
			// Closed by the turn's final save already, unless its replica
			// died in between on Redis Cluster.
			if err := d.s.execs.EndTurn(ctx, te.Thread, turn.ID); err != nil {
				d.s.logger.Warn("could not end a turn; the event is retried after the reclaim timeout", "trigger", t.ID, "execution", turn.ID, "err", err)
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		next, err := d.s.execs.FollowThread(ctx, te)
		if err != nil {
			d.s.logger.Warn("could not follow an event on its thread; it is retried after the reclaim timeout", "trigger", t.ID, "event", ev.ID, "err", err)
			return
		}
		if final != nil && next.ID == turn.ID {
			d.finish(ctx, m, t, final)
			return
		}
		turn = next
	}
}

// await polls the execution until it is terminal, backing off from 5 ms
// to 1 s: polling keeps one Redis connection per replica busy at most,
// where a subscription per event would open one each.
func (d *deliverer) await(ctx context.Context, id string) (*harness.Execution, error) {
	wait := 5 * time.Millisecond
	for {
		ex, err := d.s.execs.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if ex.Status.Terminal() {
			return ex, nil
		}
		harness.Sleep(ctx, wait)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		wait = min(wait*2, time.Second)
	}
}

func (d *deliverer) bury(ctx context.Context, entry, tid string, ev Event, deliveries int64, exec, reason string) {
	dl := DeadLetter{
		ID: d.src.name + ":" + entry, Connection: d.src.name, Trigger: tid, Event: ev,
		Deliveries: deliveries, Reason: reason, DeadAt: time.Now().UTC(), Execution: exec,
	}
	if ev.ID != "" {
		if turns, err := d.in.turnsOf(ctx, []string{ev.ID}); err == nil {
			for _, et := range turns[ev.ID] {
				if et.Trigger == tid {
					dl.Execution, dl.Turn = et.Execution, et.How
				}
			}
		}
		d.abandon(ctx, tid, ev)
	}
	ok, err := d.in.bury(context.WithoutCancel(ctx), entry, dl)
	if err != nil {
		d.s.logger.Error("could not dead-letter an event", "connection", d.src.name, "entry", entry, "err", err)
		return
	}
	if ok {
		d.s.deadLettered(d.src.name)
		d.s.logger.Warn("event dead-lettered", "connection", d.src.name, "trigger", tid, "event", ev.ID, "reason", reason)
	}
}

// abandon lets the thread of an entry that goes to the dead letters move
// on when its event opened a turn whose record it never wrote (see
// harness.AbandonTurn).
func (d *deliverer) abandon(ctx context.Context, tid string, ev Event) {
	t, ok := d.s.triggers[tid]
	if !ok {
		return
	}
	natural, err := d.s.naturalThread(ctx, ev)
	if err != nil {
		return
	}
	thread, onThread, err := t.explicitThread(ev, natural)
	if err != nil || !onThread {
		return
	}
	if err := d.s.execs.AbandonTurn(context.WithoutCancel(ctx), thread, ev.ID, tid); err != nil {
		d.s.logger.Warn("could not let go of the thread of a dead-lettered event", "trigger", tid, "event", ev.ID, "err", err)
	}
}

// renew resets the idle time of the entries this replica holds, so no
// other replica reclaims them while their turns run. XCLAIM with JUSTID
// leaves the delivery count alone.
func (d *deliverer) renew(ctx context.Context) {
	every := max(d.s.reclaimAfter/3, 100*time.Millisecond)
	for {
		harness.Sleep(ctx, every)
		if ctx.Err() != nil {
			return
		}
		d.mu.Lock()
		ids := make([]string, 0, len(d.held))
		for id := range d.held {
			ids = append(ids, id)
		}
		d.mu.Unlock()
		for len(ids) > 0 {
			n := min(len(ids), 500)
			err := d.s.st.Client.XClaimJustID(ctx, &redis.XClaimArgs{
				Stream: d.in.stream(), Group: group, Consumer: d.s.consumer, MinIdle: 0, Messages: ids[:n],
			}).Err()
			if err != nil && ctx.Err() == nil {
				d.s.logger.Warn("could not renew held events", "connection", d.src.name, "err", err)
			}
			ids = ids[n:]
		}
	}
}

// reclaim takes entries that their replica stopped renewing, every half
// ReclaimAfter.
func (d *deliverer) reclaim(ctx context.Context) {
	every := max(d.s.reclaimAfter/2, 100*time.Millisecond)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		harness.Sleep(ctx, every)
		if ctx.Err() != nil {
			return
		}
		d.reclaimStalled(ctx, &wg)
	}
}

// reclaimBatch bounds the entries listed and claimed in one round trip.
const reclaimBatch = 500

// reclaimStalled claims the stalled entries in batches of as many as this
// replica has room for, and goes on while more are stalled, so the backlog
// a dead replica leaves (a thousand entries after a burst) is taken in one
// pass rather than a hundred per interval. XCLAIM with a minimum idle time
// is atomic, so two replicas never both take one entry; each takes what
// it claimed first.
func (d *deliverer) reclaimStalled(ctx context.Context, wg *sync.WaitGroup) {
	start := "-"
	for ctx.Err() == nil {
		room := cap(d.sem) - len(d.sem)
		if room == 0 {
			return // full: the rest waits for the next pass (or another replica)
		}
		count := int64(min(room, reclaimBatch))
		pend, err := d.s.st.Client.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: d.in.stream(), Group: group, Idle: d.s.reclaimAfter, Start: start, End: "+", Count: count,
		}).Result()
		if err != nil {
			if ctx.Err() == nil && !isNoGroup(err) {
				d.s.logger.Warn("could not list stalled events", "connection", d.src.name, "err", err)
			}
			return
		}
		if len(pend) == 0 {
			return
		}
		start = "(" + pend[len(pend)-1].ID
		retries := make(map[string]int64, len(pend))
		ids := make([]string, 0, len(pend))
		d.mu.Lock()
		for _, p := range pend {
			if !d.held[p.ID] {
				ids = append(ids, p.ID)
				retries[p.ID] = p.RetryCount
			}
		}
		d.mu.Unlock()
		if len(ids) > 0 {
			msgs, err := d.s.st.Client.XClaim(ctx, &redis.XClaimArgs{
				Stream: d.in.stream(), Group: group, Consumer: d.s.consumer, MinIdle: d.s.reclaimAfter, Messages: ids,
			}).Result()
			if err != nil && ctx.Err() == nil {
				d.s.logger.Warn("could not claim stalled events", "connection", d.src.name, "err", err)
				return
			}
			// Entries missing from msgs went to another replica first, or
			// were done meanwhile.
			for _, m := range msgs {
				deliveries := retries[m.ID] + 1
				if deliveries > d.s.maxDeliveries {
					tid, _ := m.Values["t"].(string)
					var ev Event
					_ = json.Unmarshal([]byte(str(m.Values["e"])), &ev)
					d.bury(ctx, m.ID, tid, ev, deliveries-1, "", "delivered without its turn completing")
					continue
				}
				d.s.logger.Info("reclaimed a stalled event", "connection", d.src.name, "entry", m.ID, "deliveries", deliveries)
				d.start(ctx, wg, m, deliveries)
			}
		}
		if int64(len(pend)) < count {
			return
		}
	}
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
