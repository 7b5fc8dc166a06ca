package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// The demo offers event types of the MCP Events extension
// (experimental-ext-triggers-events, design sketch at commit 6104601d for
// poll and webhook, 082166f0 for push): ticket.created, delivered by poll,
// and by push when Events.Push is set (see push.go), and, when Events.Hooks
// is set, ticket.escalated by webhook (see webhooks.go). events/list,
// events/poll, events/stream and events/subscribe are answered by
// Events.Handler in front of mcp-go's Streamable HTTP handler (mcp-go
// serves none of them), so over stdio the demo lists no events. The
// open_ticket tool raises them. Cursors are the sequence number of the last
// event looked at; the last Retain events are kept, and a cursor older
// than that is answered from the oldest kept with truncated: true.
const (
	EventTicketCreated = "ticket.created"
	defaultNextPoll    = time.Second
	defaultRetain      = 1000
	defaultMaxBatch    = 10
)

// EventsCapability declares the events extension in the server's
// capabilities (extensions["io.modelcontextprotocol/events"]); a client
// lists events only from a server that declares them. Only a server served
// behind Events.Handler should declare it.
func EventsCapability() server.ServerOption {
	return server.WithExtensions(map[string]any{"io.modelcontextprotocol/events": map[string]any{"listChanged": false}})
}

// Extension error codes the demo answers with.
const (
	codeNotFound      = -32011
	codeUnsupported   = -32014
	codeCallbackError = -32015
)

var ticketEventType = map[string]any{
	"name":        EventTicketCreated,
	"description": "A ticket was opened (open_ticket). Subscribe with priority to get only tickets of that priority.",
	"delivery":    []string{"poll"},
	"inputSchema": map[string]any{
		"type":                 "object",
		"properties":           map[string]any{"priority": map[string]any{"type": "string", "enum": []string{"low", "high"}}},
		"additionalProperties": false,
	},
	"payloadSchema": map[string]any{
		"type": "object",
		"properties": map[string]any{
			"ticket": map[string]any{"type": "string"}, "title": map[string]any{"type": "string"},
			"priority": map[string]any{"type": "string"},
		},
	},
}

var openTicketTool = mcp.NewTool("open_ticket",
	mcp.WithDescription("Opens a ticket, which raises a ticket.created event."),
	mcp.WithString("title", mcp.Required(), mcp.Description("The ticket's title.")),
	mcp.WithString("priority", mcp.Enum("low", "high"), mcp.Description(`low (default) or high.`)),
	hints("Open ticket", false, false, false),
)

// Events is the event log of one demo server.
type Events struct {
	// NextPoll is the nextPollMs suggested to clients; zero means 1 s.
	NextPoll time.Duration
	// Retain is how many events are kept for replay; zero means 1000.
	Retain int
	// MaxBatch caps one poll's events when the client sets no maxEvents;
	// zero means 10.
	MaxBatch int
	// PageSize splits events/list into pages of this many event types;
	// zero means one page.
	PageSize int
	// Notify sends a notification to the server's clients (an mcp-go
	// server's SendNotificationToAllClients); AddType and RemoveType say
	// through it that the list changed. Nil: they say nothing.
	Notify func(method string, params map[string]any)
	// Push offers ticket.created by push (events/stream) besides poll;
	// without it the server offers only poll.
	Push bool
	// Heartbeat is how often a quiet push stream sends a heartbeat; zero
	// means 10 s.
	Heartbeat time.Duration
	// Hooks, when set, also offers ticket.escalated by webhook
	// (webhooks.go).
	Hooks *Hooks

	mu    sync.Mutex
	seq   int64
	log   []ticket
	polls int
	more  moreTypes     // event types added and removed at run time (eventtypes.go)
	wake  chan struct{} // closed when an event is raised, for held polls
	push  pushState
}

type ticket struct {
	seq      int64
	at       time.Time
	title    string
	priority string
}

// NewEvents returns an empty event log.
func NewEvents() *Events { return &Events{} }

// Open raises ticket.created and returns the event's id.
func (e *Events) Open(title, priority string) string {
	if priority == "" {
		priority = "low"
	}
	e.mu.Lock()
	e.seq++
	t := ticket{seq: e.seq, at: time.Now().UTC(), title: title, priority: priority}
	e.log = append(e.log, t)
	e.raised()
	if keep := e.retain(); len(e.log) > keep {
		e.log = append([]ticket(nil), e.log[len(e.log)-keep:]...)
	}
	e.wakeStreams()
	e.mu.Unlock()
	if e.Hooks != nil && priority == "high" {
		e.Hooks.raise(t)
	}
	return eventID(t.seq)
}

// Polls is how many events/poll requests the server answered.
func (e *Events) Polls() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.polls
}

func (e *Events) retain() int {
	if e.Retain > 0 {
		return e.Retain
	}
	return defaultRetain
}

func eventID(seq int64) string { return "tkt-" + strconv.FormatInt(seq, 10) }

// occurrence is t as an EventOccurrence.
func (t ticket) occurrence() map[string]any {
	return map[string]any{
		"eventId": eventID(t.seq), "name": EventTicketCreated, "timestamp": t.at.Format(time.RFC3339Nano),
		"data": map[string]any{"ticket": eventID(t.seq), "title": t.title, "priority": t.priority},
	}
}

// Tool is open_ticket for an mcp-go server.
func (e *Events) Tool() server.ServerTool {
	return server.ServerTool{Tool: openTicketTool, Handler: func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var args struct {
			Title    string `json:"title"`
			Priority string `json:"priority"`
		}
		if res := bind(req, &args); res != nil {
			return res, nil
		}
		if args.Title == "" {
			return missing("title"), nil
		}
		if args.Priority != "" && args.Priority != "low" && args.Priority != "high" {
			return mcp.NewToolResultError("priority must be low or high"), nil
		}
		return structured(map[string]any{"eventId": e.Open(args.Title, args.Priority)}), nil
	}}
}

// Handler answers events/list and events/poll and hands everything else
// to next. A poll held open (timeoutMs) ends when its client goes.
func (e *Events) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handle := func(method string, raw json.RawMessage) (any, *mcp.JSONRPCErrorDetails, bool) {
			return e.handle(r.Context(), method, raw)
		}
		rpcHandler(e.streamHandler(next), handle).ServeHTTP(w, r)
	})
}

func (e *Events) handle(ctx context.Context, method string, raw json.RawMessage) (any, *mcp.JSONRPCErrorDetails, bool) {
	switch method {
	case "events/list":
		r, rpcErr := e.list(raw)
		return r, rpcErr, true
	case "events/subscribe", "events/unsubscribe":
		if e.Hooks == nil {
			return nil, nil, false
		}
		r, rpcErr := e.Hooks.handle(method, raw)
		return r, rpcErr, true
	case "events/poll":
		r, rpcErr := e.poll(ctx, raw)
		return r, rpcErr, true
	}
	return nil, nil, false
}

type pollParams struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Cursor    *string         `json:"cursor"`
	MaxEvents int             `json:"maxEvents"`
	TimeoutMs int64           `json:"timeoutMs"`
	MaxAgeMs  int64           `json:"maxAgeMs"`
}

func invalidParams(format string, args ...any) *mcp.JSONRPCErrorDetails {
	return &mcp.JSONRPCErrorDetails{Code: mcp.INVALID_PARAMS, Message: fmt.Sprintf(format, args...)}
}

// subscription reads the subscription of an events/poll or events/stream:
// its params and the priority it filters on ("" for none).
func subscription(raw json.RawMessage) (pollParams, string, *mcp.JSONRPCErrorDetails) {
	var p pollParams
	if json.Unmarshal(raw, &p) != nil {
		return p, "", invalidParams("params must be an object")
	}
	if p.Name != EventTicketCreated {
		return p, "", &mcp.JSONRPCErrorDetails{Code: codeNotFound, Message: "NotFound", Data: map[string]any{"kind": "event"}}
	}
	var args map[string]any
	if len(p.Arguments) > 0 && string(p.Arguments) != "null" && json.Unmarshal(p.Arguments, &args) != nil {
		return p, "", invalidParams("arguments must be an object")
	}
	want, _ := args["priority"].(string)
	for k := range args {
		if k != "priority" || (want != "low" && want != "high") {
			return p, "", invalidParams("arguments: only priority (low or high) is accepted")
		}
	}
	return p, want, nil
}

func (e *Events) poll(ctx context.Context, raw json.RawMessage) (any, *mcp.JSONRPCErrorDetails) {
	var probe pollParams
	if json.Unmarshal(raw, &probe) == nil && e.isMore(probe.Name) {
		return e.pollMore(ctx, probe)
	}
	p, want, rpcErr := subscription(raw)
	if rpcErr == nil && e.isRemoved(p.Name) {
		rpcErr = &mcp.JSONRPCErrorDetails{Code: codeNotFound, Message: "NotFound", Data: map[string]any{"kind": "event"}}
	}
	if rpcErr != nil {
		return nil, rpcErr
	}
	return e.hold(ctx, p, func() (map[string]any, *mcp.JSONRPCErrorDetails) { return e.tickets(p, want) })
}

// tickets answers a poll of ticket.created from p's cursor; e.mu is held.
func (e *Events) tickets(p pollParams, want string) (map[string]any, *mcp.JSONRPCErrorDetails) {
	next := e.NextPoll
	if next <= 0 {
		next = defaultNextPoll
	}
	out := map[string]any{"events": []any{}, "truncated": false, "hasMore": false, "nextPollMs": next.Milliseconds(), "cursor": strconv.FormatInt(e.seq, 10)}
	if p.Cursor == nil {
		return out, nil // start from now
	}
	from, err := strconv.ParseInt(*p.Cursor, 10, 64)
	if err != nil || from < 0 {
		return nil, invalidParams("cursor %q is not one this server gave", *p.Cursor)
	}
	if from > e.seq {
		// A cursor of an earlier run of the server: its events are gone.
		out["truncated"] = true
		return out, nil
	}
	limit := p.MaxEvents
	if limit <= 0 {
		limit = e.MaxBatch
	}
	if limit <= 0 {
		limit = defaultMaxBatch
	}
	if len(e.log) > 0 && from < e.log[0].seq-1 {
		out["truncated"] = true
	}
	events := []any{}
	cursor := from
	floor := ageFloor(p)
	for _, t := range e.log {
		if t.seq <= from {
			continue
		}
		if t.at.Before(floor) {
			cursor, out["truncated"] = t.seq, true // older than maxAgeMs: skipped
			continue
		}
		if len(events) == limit {
			out["hasMore"] = true
			break
		}
		cursor = t.seq
		if want != "" && t.priority != want {
			continue
		}
		events = append(events, t.occurrence())
	}
	out["events"], out["cursor"] = events, strconv.FormatInt(cursor, 10)
	return out, nil
}
