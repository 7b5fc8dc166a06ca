package demo

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
)

// Push delivery of ticket.created (MCP Events design sketch at commit
// 082166f0): events/stream answers with an SSE stream that opens with
// notifications/events/active {cursor, truncated}, carries each matching
// ticket as notifications/events/event with the cursor after it, and a
// notifications/events/heartbeat {cursor} every Heartbeat when quiet. The
// stream's cursor is the same sequence number as poll's, so a client may
// resume a stream from a polled cursor and the other way round. Every
// notification carries the request's id in
// _meta["io.modelcontextprotocol/subscriptionId"]. A refused subscription
// is a JSON-RPC error and no stream.
const (
	defaultHeartbeat   = 10 * time.Second
	metaSubscriptionID = "io.modelcontextprotocol/subscriptionId"
)

// pushState is what the open streams share; guarded by Events.mu.
type pushState struct {
	opened int           // streams accepted so far
	wake   chan struct{} // closed when a ticket is raised
	drop   chan struct{} // closed by DropStreams
	stall  chan struct{} // closed by StallStreams
}

// chans returns the current channels, making the missing ones.
func (p *pushState) chans() (wake, drop, stall chan struct{}) {
	for _, ch := range []*chan struct{}{&p.wake, &p.drop, &p.stall} {
		if *ch == nil {
			*ch = make(chan struct{})
		}
	}
	return p.wake, p.drop, p.stall
}

// renew closes *ch, so its waiters see it, and puts a fresh one in place.
func renew(ch *chan struct{}) {
	if *ch != nil {
		close(*ch)
	}
	*ch = make(chan struct{})
}

// wakeStreams tells the open streams a ticket was raised; e.mu is held.
func (e *Events) wakeStreams() { renew(&e.push.wake) }

// DropStreams ends every open stream from the server's side (with the
// final result), as a server restarting or shedding load would.
func (e *Events) DropStreams() {
	e.mu.Lock()
	defer e.mu.Unlock()
	renew(&e.push.drop)
}

// StallStreams makes every open stream go silent while staying open: no
// events, no heartbeats, as a stuck server or a half-dead connection
// would. Streams opened later are not affected.
func (e *Events) StallStreams() {
	e.mu.Lock()
	defer e.mu.Unlock()
	renew(&e.push.stall)
}

// Streams is how many events/stream requests the server accepted.
func (e *Events) Streams() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.push.opened
}

// ticketType is ticket.created as events/list shows it.
func (e *Events) ticketType() map[string]any {
	t := maps.Clone(ticketEventType)
	if e.Push {
		t["delivery"] = []string{"push", "poll"}
	}
	return t
}

func (e *Events) heartbeat() time.Duration {
	if e.Heartbeat > 0 {
		return e.Heartbeat
	}
	return defaultHeartbeat
}

// streamHandler serves events/stream when push is offered and hands
// everything else to next.
func (e *Events) streamHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		msg, ok := peekRequest(r)
		if !ok || msg.Method != "events/stream" {
			next.ServeHTTP(w, r)
			return
		}
		if !e.Push {
			writeResponse(w, msg.ID, nil, &mcp.JSONRPCErrorDetails{Code: codeUnsupported, Message: "Unsupported",
				Data: map[string]any{"feature": "deliveryMode", "value": "push"}})
			return
		}
		e.stream(w, r, msg)
	})
}

// stream serves one events/stream until the client goes away or the
// stream is dropped.
func (e *Events) stream(w http.ResponseWriter, r *http.Request, msg rpcRequest) {
	p, want, rpcErr := subscription(msg.Params)
	if rpcErr != nil {
		writeResponse(w, msg.ID, nil, rpcErr)
		return
	}
	e.mu.Lock()
	from, truncated, err := e.resume(p.Cursor)
	if err != nil {
		e.mu.Unlock()
		writeResponse(w, msg.ID, nil, invalidParams("%v", err))
		return
	}
	e.push.opened++
	_, drop, stall := e.push.chans()
	e.mu.Unlock()

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := func(v map[string]any) error {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	notify := func(method string, params map[string]any) error {
		params["_meta"] = map[string]any{metaSubscriptionID: msg.ID}
		return send(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
	}
	if notify("notifications/events/active", map[string]any{"cursor": cursorOf(from), "truncated": truncated}) != nil {
		return
	}
	beat := time.NewTicker(e.heartbeat())
	defer beat.Stop()
	for {
		select {
		case <-stall: // before anything else: a stalled stream sends nothing
			<-r.Context().Done()
			return
		default:
		}
		e.mu.Lock()
		pending, head := e.after(from, want)
		wake, _, _ := e.push.chans()
		e.mu.Unlock()
		for _, t := range pending {
			occ := t.occurrence()
			occ["cursor"] = cursorOf(t.seq)
			if notify("notifications/events/event", occ) != nil {
				return
			}
		}
		from = head
		select {
		case <-r.Context().Done():
			return
		case <-stall:
			<-r.Context().Done()
			return
		case <-drop:
			_ = send(map[string]any{"jsonrpc": "2.0", "id": msg.ID, "result": map[string]any{"_meta": map[string]any{}}})
			return
		case <-wake:
		case <-beat.C:
			if notify("notifications/events/heartbeat", map[string]any{"cursor": cursorOf(from)}) != nil {
				return
			}
		}
	}
}

func cursorOf(seq int64) string { return strconv.FormatInt(seq, 10) }

// resume is where a stream given cursor starts, and whether events before
// it are gone (a cursor of an earlier run, or older than the kept ones).
// e.mu is held.
func (e *Events) resume(cursor *string) (int64, bool, error) {
	if cursor == nil {
		return e.seq, false, nil // start from now
	}
	from, err := strconv.ParseInt(*cursor, 10, 64)
	if err != nil || from < 0 {
		return 0, false, fmt.Errorf("cursor %q is not one this server gave", *cursor)
	}
	if from > e.seq {
		return e.seq, true, nil
	}
	if len(e.log) > 0 && from < e.log[0].seq-1 {
		return e.log[0].seq - 1, true, nil
	}
	return from, false, nil
}

// after returns the kept tickets after seq from that match want, and the
// sequence number looked up to. e.mu is held.
func (e *Events) after(from int64, want string) ([]ticket, int64) {
	var out []ticket
	for _, t := range e.log {
		if t.seq > from && (want == "" || t.priority == want) {
			out = append(out, t)
		}
	}
	return out, e.seq
}
