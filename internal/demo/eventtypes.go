package demo

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
)

// Event types besides ticket.created, added and removed at run time with
// AddType and RemoveType (each change announced by
// notifications/events/list_changed through Events.Notify) and raised with
// Raise. Tests use them to change the list a client sees and to offer a
// type with exactly the delivery modes they name. Their events have no
// filter (any arguments object is accepted) and share one log, cursor
// space and retention, apart from the tickets'.
//
// Every poll, of any type, honours the request's long-poll timeoutMs (held
// open until a matching event is raised, at most maxHold) and maxAgeMs
// (events older than now − maxAgeMs are skipped, and the answer says
// truncated).

// maxHold caps how long the demo holds a poll open, whatever timeoutMs
// asks: a server may always answer earlier.
const maxHold = time.Minute

const (
	listChangedNotification = "notifications/events/list_changed"
	unsupportedCode         = -32014
)

// moreTypes are the event types added at run time, their events, and the
// built-in types removed.
type moreTypes struct {
	types   []moreType
	removed map[string]bool
	seq     int64
	log     []occurrence
}

type moreType struct {
	name     string
	delivery []string
}

type occurrence struct {
	seq  int64
	at   time.Time
	name string
	data map[string]any
}

// AddType offers the event type name with the delivery modes given (poll
// when none), or offers a removed ticket.created again.
func (e *Events) AddType(name string, delivery ...string) {
	if len(delivery) == 0 {
		delivery = []string{"poll"}
	}
	e.mu.Lock()
	delete(e.more.removed, name)
	if name != EventTicketCreated {
		e.more.types = slices.DeleteFunc(e.more.types, func(t moreType) bool { return t.name == name })
		e.more.types = append(e.more.types, moreType{name: name, delivery: delivery})
	}
	e.mu.Unlock()
	e.listChanged()
}

// RemoveType stops offering the event type name (ticket.created too):
// it leaves events/list, and a poll of it is answered NotFound.
func (e *Events) RemoveType(name string) {
	e.mu.Lock()
	e.more.types = slices.DeleteFunc(e.more.types, func(t moreType) bool { return t.name == name })
	if name == EventTicketCreated {
		if e.more.removed == nil {
			e.more.removed = map[string]bool{}
		}
		e.more.removed[name] = true
	}
	e.mu.Unlock()
	e.listChanged()
}

// Raise records an event of a type added with AddType and returns its id.
func (e *Events) Raise(name string, data map[string]any) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.more.seq++
	e.more.log = append(e.more.log, occurrence{seq: e.more.seq, at: time.Now().UTC(), name: name, data: data})
	if keep := e.retain(); len(e.more.log) > keep {
		e.more.log = append([]occurrence(nil), e.more.log[len(e.more.log)-keep:]...)
	}
	e.raised()
	return "evt-" + strconv.FormatInt(e.more.seq, 10)
}

func (e *Events) listChanged() {
	if e.Notify != nil {
		e.Notify(listChangedNotification, nil)
	}
}

// raised wakes the polls held open; e.mu is held.
func (e *Events) raised() {
	if e.wake != nil {
		close(e.wake)
		e.wake = nil
	}
}

func (e *Events) isMore(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.ContainsFunc(e.more.types, func(t moreType) bool { return t.name == name })
}

func (e *Events) isRemoved(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.more.removed[name]
}

// list answers events/list, PageSize types a page; the cursor is the
// index of the page's first type.
func (e *Events) list(raw json.RawMessage) (any, *mcp.JSONRPCErrorDetails) {
	var p struct {
		Cursor *string `json:"cursor"`
	}
	if len(raw) > 0 && json.Unmarshal(raw, &p) != nil {
		return nil, invalidParams("params must be an object")
	}
	e.mu.Lock()
	types := []any{}
	if !e.more.removed[EventTicketCreated] {
		types = append(types, e.ticketType())
	}
	if e.Hooks != nil {
		types = append(types, escalatedEventType)
	}
	for _, t := range e.more.types {
		types = append(types, map[string]any{
			"name": t.name, "description": "A test event type (Events.AddType).", "delivery": t.delivery,
			"inputSchema": map[string]any{"type": "object"},
		})
	}
	size := e.PageSize
	e.mu.Unlock()
	from := 0
	if p.Cursor != nil {
		n, err := strconv.Atoi(*p.Cursor)
		if err != nil || n < 0 || n > len(types) {
			return nil, invalidParams("cursor %q is not one this server gave", *p.Cursor)
		}
		from = n
	}
	if size <= 0 || from+size >= len(types) {
		return map[string]any{"events": types[from:]}, nil
	}
	return map[string]any{"events": types[from : from+size], "nextCursor": strconv.Itoa(from + size)}, nil
}

// pollMore answers a poll of a type added with AddType.
func (e *Events) pollMore(ctx context.Context, p pollParams) (any, *mcp.JSONRPCErrorDetails) {
	e.mu.Lock()
	i := slices.IndexFunc(e.more.types, func(t moreType) bool { return t.name == p.Name })
	offers := i >= 0 && slices.Contains(e.more.types[i].delivery, "poll")
	e.mu.Unlock()
	if !offers {
		return nil, &mcp.JSONRPCErrorDetails{Code: unsupportedCode, Message: "Unsupported", Data: map[string]any{"feature": "deliveryMode", "value": "poll"}}
	}
	if len(p.Arguments) > 0 && string(p.Arguments) != "null" {
		var args map[string]any
		if json.Unmarshal(p.Arguments, &args) != nil {
			return nil, invalidParams("arguments must be an object")
		}
	}
	return e.hold(ctx, p, func() (map[string]any, *mcp.JSONRPCErrorDetails) { return e.moreBatch(p) })
}

// moreBatch answers a poll of an added type from p's cursor; e.mu is held.
func (e *Events) moreBatch(p pollParams) (map[string]any, *mcp.JSONRPCErrorDetails) {
	next := e.NextPoll
	if next <= 0 {
		next = defaultNextPoll
	}
	m := &e.more
	out := map[string]any{"events": []any{}, "truncated": false, "hasMore": false, "nextPollMs": next.Milliseconds(), "cursor": strconv.FormatInt(m.seq, 10)}
	if p.Cursor == nil {
		return out, nil
	}
	from, err := strconv.ParseInt(*p.Cursor, 10, 64)
	if err != nil || from < 0 {
		return nil, invalidParams("cursor %q is not one this server gave", *p.Cursor)
	}
	if from > m.seq || (len(m.log) > 0 && from < m.log[0].seq-1) {
		out["truncated"] = true
		from = min(from, m.seq)
	}
	limit := p.MaxEvents
	if limit <= 0 {
		limit = cmp.Or(e.MaxBatch, defaultMaxBatch)
	}
	events, cursor, floor := []any{}, from, ageFloor(p)
	for _, o := range m.log {
		if o.seq <= from {
			continue
		}
		if o.at.Before(floor) {
			cursor, out["truncated"] = o.seq, true // older than maxAgeMs: skipped
			continue
		}
		if len(events) == limit {
			out["hasMore"] = true
			break
		}
		cursor = o.seq
		if o.name != p.Name {
			continue
		}
		events = append(events, map[string]any{
			"eventId": "evt-" + strconv.FormatInt(o.seq, 10), "name": o.name, "timestamp": o.at.Format(time.RFC3339Nano), "data": o.data,
		})
	}
	out["events"], out["cursor"] = events, strconv.FormatInt(cursor, 10)
	return out, nil
}

// hold answers a poll with batch (called with e.mu held), holding it open
// while there is nothing to say, until an event is raised, timeoutMs (at
// most maxHold) passes or the client goes. A poll without a cursor starts
// from now and is answered at once.
func (e *Events) hold(ctx context.Context, p pollParams, batch func() (map[string]any, *mcp.JSONRPCErrorDetails)) (any, *mcp.JSONRPCErrorDetails) {
	deadline := time.Now().Add(min(time.Duration(p.TimeoutMs)*time.Millisecond, maxHold))
	e.mu.Lock()
	e.polls++
	e.mu.Unlock()
	for {
		e.mu.Lock()
		out, rpcErr := batch()
		if e.wake == nil {
			e.wake = make(chan struct{})
		}
		wake := e.wake
		e.mu.Unlock()
		left := time.Until(deadline)
		if rpcErr != nil || p.Cursor == nil || left <= 0 || news(out) {
			return out, rpcErr
		}
		t := time.NewTimer(left)
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		if ctx.Err() != nil {
			return out, nil // nobody reads it
		}
	}
}

// news reports whether an answer says something a held poll must not
// sit on: events, more to come, or skipped events.
func news(out map[string]any) bool {
	evs, _ := out["events"].([]any)
	return len(evs) > 0 || out["hasMore"] == true || out["truncated"] == true
}

// ageFloor is the oldest event time a poll accepts (maxAgeMs); zero when
// it sets none.
func ageFloor(p pollParams) time.Time {
	if p.MaxAgeMs <= 0 {
		return time.Time{}
	}
	return time.Now().Add(-time.Duration(p.MaxAgeMs) * time.Millisecond)
}
