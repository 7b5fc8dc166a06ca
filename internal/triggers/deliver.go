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
			sleep(ctx, time.Second)
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
	var ex *harness.Execution
	var created, joined bool
	if onThread {
		ex, created, joined, err = d.s.execs.SubmitOnThread(ctx, key, thread, t.Document, input)
	} else {
		ex, created, err = d.s.execs.SubmitOnce(ctx, key, t.Document, input)
	}
	if joined {
		d.in.count(ctx, "t:"+t.ID+":joined")
	}
	if err != nil {
		if isPermanent(err) {
			d.bury(ctx, m.ID, tid, ev, deliveries, "", "workflow does not validate: "+err.Error())
			return
		}
		d.in.count(ctx, "t:"+t.ID+":errors")
		d.s.logger.Warn("could not start the turn of an event; it is retried after the reclaim timeout", "trigger", t.ID, "event", ev.ID, "err", err)
		return
	}
	if created {
		d.in.count(ctx, "t:"+t.ID+":delivered")
		d.s.observer.Started(d.src.name, t.ID, time.Since(ev.ReceivedAt))
	}
	final, err := d.await(ctx, ex.ID)
	if err != nil {
		if ctx.Err() == nil {
			d.s.logger.Warn("lost track of an event's execution; it is retried after the reclaim timeout", "trigger", t.ID, "execution", ex.ID, "err", err)
		}
		return
	}
	outcome := "succeeded"
	if final.Status != harness.ExecSucceeded {
		outcome = "failed"
	}
	if err := d.in.done(context.WithoutCancel(ctx), m.ID, t.ID, outcome); err != nil {
		d.s.logger.Warn("could not record an event done", "trigger", t.ID, "entry", m.ID, "err", err)
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
		sleep(ctx, wait)
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

// renew resets the idle time of the entries this replica holds, so no
// other replica reclaims them while their turns run. XCLAIM with JUSTID
// leaves the delivery count alone.
func (d *deliverer) renew(ctx context.Context) {
	every := max(d.s.reclaimAfter/3, 100*time.Millisecond)
	for {
		sleep(ctx, every)
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
		sleep(ctx, every)
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

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
