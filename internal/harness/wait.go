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

	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// maxConnEvents bounds each connection's event log (approximately).
const maxConnEvents = 10000

// ConnEvent is an event a connection delivered (a webhook, a push, a cron
// tick), as wait nodes see it.
type ConnEvent struct {
	Connection string         `json:"connection"`
	Type       string         `json:"type"`
	ID         string         `json:"id"`
	Payload    any            `json:"payload,omitempty"`
	ReceivedAt time.Time      `json:"receivedAt"`
	Meta       map[string]any `json:"meta,omitempty"`
}

func (e *Executions) connEventsKey(conn string) string { return e.store.Key("{ev:"+conn+"}", "log") }

// AppendEvent records an accepted event of a connection so that wait nodes
// listening on it see it. Sources call it once per accepted event (after
// dedupe), so a redelivered webhook is not seen twice.
func (e *Executions) AppendEvent(ctx context.Context, ev ConnEvent) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("executions: encode event: %w", err)
	}
	key := e.connEventsKey(ev.Connection)
	err = e.store.Client.XAdd(ctx, &redis.XAddArgs{Stream: key, MaxLen: maxConnEvents, Approx: true, Values: map[string]any{"event": data}}).Err()
	if err != nil {
		return fmt.Errorf("executions: append event of %s: %w", ev.Connection, err)
	}
	return nil
}

// cursorOf returns the id of the newest event of conn ("0-0" when none):
// listening from it sees every event appended after this moment.
func (e *Executions) cursorOf(ctx context.Context, conn string) (string, error) {
	msgs, err := e.store.Client.XRevRangeN(ctx, e.connEventsKey(conn), "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("executions: cursor of %s: %w", conn, err)
	}
	if len(msgs) == 0 {
		return "0-0", nil
	}
	return msgs[0].ID, nil
}

// wait listens for the event, runs the around steps once listening has
// started (so the event they cause cannot slip past), then waits for the
// first matching event until the timeout. The cursor and the deadline are
// in the ledger entry: a resumed run listens again from the same cursor
// until the same deadline. Its output is {event, around}.
func (r *run) wait(ctx context.Context, f *frame, n *document.Node) (any, error) {
	key := n.ID + f.suffix
	if out, err, ok := r.replayed(key, n); ok {
		return out, err
	}
	r.begin(n, key, n.Connection)
	var cursor string
	var deadline time.Time
	r.mu.Lock()
	if i := r.entry(key); i >= 0 && r.rec.Steps[i].Cursor != "" {
		cursor, deadline = r.rec.Steps[i].Cursor, *r.rec.Steps[i].Deadline
	}
	r.mu.Unlock()
	if cursor == "" {
		c, err := r.e.cursorOf(ctx, n.Connection)
		if err != nil {
			return nil, r.storage(ctx, err)
		}
		cursor, deadline = c, time.Now().Add(n.Timeout).UTC()
		r.update(key, func(st *StepRecord) { st.Status, st.Cursor, st.Deadline = StepPending, cursor, &deadline })
		if err := r.save(ctx); err != nil {
			return nil, err
		}
	}
	var around any
	if n.Around != nil {
		var err error
		if around, err = r.node(ctx, f, n.Around); err != nil {
			return nil, err
		}
	}
	ev, err := r.listen(ctx, f, n, key, cursor, deadline)
	if err != nil {
		if interruption(err) {
			return nil, err // parked: the entry keeps its cursor and deadline
		}
		return nil, r.fail(ctx, key, n, err)
	}
	return r.done(ctx, key, n, map[string]any{"event": ev, "around": around})
}

// listenBlock bounds one read of listen, so a wait notices within it that
// a sibling path parked.
const listenBlock = time.Second

// listen reads the connection's events after cursor until one matches or
// the deadline passes. An event counts when the event log received it by
// the deadline (its id is the log's time), even when it is read later: a
// run parked past the deadline still sees what arrived in time. When a
// sibling path parks, it reads what is there and returns errParked.
//
// In a turn on a thread of this connection, a matching event counts only
// when the turn takes it (see threads.go): one that started or joined
// another turn is passed over, and the events that joined this turn
// before the wait listened are looked at first.
func (r *run) listen(ctx context.Context, f *frame, n *document.Node, key, cursor string, deadline time.Time) (any, error) {
	onThread := r.onThread(n.Connection)
	for {
		left := time.Until(deadline)
		over := left <= 0 || parking(ctx)
		if onThread {
			if ev, ok, err := r.threadEvent(ctx, f, n, key, deadline); ok || err != nil {
				return ev, err
			}
		}
		args := &redis.XReadArgs{Streams: []string{r.e.connEventsKey(n.Connection), cursor}, Count: 100, Block: -1}
		if !over {
			// At least a millisecond: a zero BLOCK would wait for ever.
			args.Block = max(min(left, listenBlock), time.Millisecond)
		}
		streams, err := r.e.store.Client.XRead(ctx, args).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, &storageError{fmt.Errorf("executions: listen on %s: %w", n.Connection, err)}
		}
		var msgs []redis.XMessage
		if len(streams) > 0 {
			msgs = streams[0].Messages
		}
		late := false
		for _, m := range msgs {
			if left <= 0 && after(m.ID, deadline) {
				late = true
				break
			}
			cursor = m.ID
			ev, ok, err := r.event(f, n, m)
			if ok && onThread {
				ok, err = r.takeLogged(ctx, key, m)
			}
			if ok || err != nil {
				return ev, err
			}
		}
		switch {
		case !over || (int64(len(msgs)) == args.Count && !late):
			continue // more to read before judging
		case left <= 0:
			return nil, &stepError{step: n.ID, code: fault.StepFailed, err: fmt.Errorf("no %s event of %s arrived within %s", n.Event, n.Connection, n.Timeout)}
		}
		return nil, errParked
	}
}

// event reports whether m is the event the wait waits for, and returns it
// redacted.
func (r *run) event(f *frame, n *document.Node, m redis.XMessage) (any, bool, error) {
	var ev map[string]any
	raw, _ := m.Values["event"].(string)
	if json.Unmarshal([]byte(raw), &ev) != nil || ev["type"] != n.Event {
		return nil, false, nil
	}
	ok, err := r.matches(f, n, ev)
	if err != nil {
		return nil, false, &stepError{step: n.ID, code: fault.StepFailed, err: err}
	}
	if !ok {
		return nil, false, nil
	}
	return r.e.redact(ev), true, nil
}

// after reports whether the event log received the entry id after t.
func after(id string, t time.Time) bool {
	ms, _, _ := strings.Cut(id, "-")
	v, err := strconv.ParseInt(ms, 10, 64)
	return err == nil && v > t.UnixMilli()
}

func (r *run) matches(f *frame, n *document.Node, ev map[string]any) (bool, error) {
	if n.Filter == nil {
		return true, nil
	}
	r.mu.Lock()
	sc := r.scope(f)
	r.mu.Unlock()
	sc.Event = ev
	out, err := n.Filter.Eval(sc)
	if err != nil {
		return false, err
	}
	ok, _ := out.(bool)
	return ok, nil
}
