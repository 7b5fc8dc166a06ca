package mcp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// The Events extension (modelcontextprotocol/experimental-ext-triggers-events,
// docs/design-sketch-proposal.md at commit 6104601d): a server lists its
// event types with events/list and, for the poll delivery mode, answers
// events/poll {name, arguments, cursor} with {events, cursor, truncated,
// hasMore, nextPollMs}. mcp-go knows neither method, so both go to the
// transport as raw JSON-RPC requests through capture. events/list is sent
// only to a server that declares the events capability (capabilities.events,
// or the extension io.modelcontextprotocol/events under extensions or
// experimental), read to its last page. A listing that fails or is
// malformed (a page without its events array, a repeated cursor, an event
// type without a name or delivery modes, an inputSchema that does not
// compile) leaves the connection without events, with the reason in Info
// (eventsError) and the log; its tools still work. Push delivery
// (events/stream) is in stream.go.
const (
	methodEventsList        = "events/list"
	methodEventsPoll        = "events/poll"
	methodEventsSubscribe   = "events/subscribe"
	methodEventsUnsubscribe = "events/unsubscribe"
	methodEventsListChanged = "notifications/events/list_changed"
)

// EventError is a JSON-RPC error the server answered an events request
// with. Data is the error's data object (kind, limit, feature, reason…),
// nil when it had none.
type EventError struct {
	Method  string
	Code    int
	Message string
	Data    map[string]any
}

func (e *EventError) Error() string {
	return fmt.Sprintf("%s: %s (code %d)", e.Method, e.Message, e.Code)
}

// RPCCode and RPCData let a caller that imports no transport read the
// error (triggers turns them into a subscription's last error).
func (e *EventError) RPCCode() int { return e.Code }

func (e *EventError) RPCData() map[string]any { return e.Data }

// ExtEvents is the Events extension's identifier, accepted beside the
// design's own capabilities.events.
const ExtEvents = "io.modelcontextprotocol/events"

// serverEvents is a connection's current list of event types.
type serverEvents struct {
	mu    sync.RWMutex
	types []connect.EventType
	err   string // why the last listing failed
}

func (s *serverEvents) get() []connect.EventType {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.types
}

func (s *serverEvents) set(types []connect.EventType, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.types, s.err = types, ""
	if err != nil {
		s.err = err.Error()
	}
}

func (s *serverEvents) lastErr() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.err
}

// declaresEvents reports whether a server's raw initialize or
// server/discover result declares the events capability.
func declaresEvents(result json.RawMessage) bool {
	var r struct {
		Capabilities struct {
			Events       json.RawMessage            `json:"events"`
			Extensions   map[string]json.RawMessage `json:"extensions"`
			Experimental map[string]json.RawMessage `json:"experimental"`
		} `json:"capabilities"`
	}
	if json.Unmarshal(result, &r) != nil {
		return false
	}
	caps := r.Capabilities
	_, ext := caps.Extensions[ExtEvents]
	_, exp := caps.Experimental[ExtEvents]
	return (len(caps.Events) > 0 && string(caps.Events) != "null") || ext || exp
}

// loadEvents lists the server's events when it declares them; a failure
// is kept for Info and logged, and leaves no events.
func (c *conn) loadEvents(ctx context.Context) []connect.EventType {
	if !declaresEvents(c.capture.serverResult()) {
		return nil
	}
	types, err := c.listEvents(ctx)
	if err != nil {
		c.logger.Warn("mcp: events/list failed; the server's events are not used", "err", err)
		types = nil
	}
	c.events.set(types, err)
	return types
}

// rpc sends one raw request on the connection's own session. On a
// 2026-07-28 session it carries what mcp-go adds to its own requests: the
// protocol version, client capabilities and client info in _meta, and
// over HTTP the standard headers (Mcp-Method, MCP-Protocol-Version).
func (c *conn) rpc(ctx context.Context, method string, params map[string]any) (json.RawMessage, error) {
	return c.rpcWithin(ctx, c.requestTimeout, method, params)
}

// rpcWithin is rpc with its own timeout (a long poll may be held open
// longer than an ordinary request).
func (c *conn) rpcWithin(ctx context.Context, timeout time.Duration, method string, params map[string]any) (json.RawMessage, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req := c.rawRequest("pb-"+rand.Text(), method, params)
	resp, err := c.capture.SendRequest(rctx, req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	if resp.Error != nil {
		data, _ := resp.Error.Data.(map[string]any)
		return nil, &EventError{Method: method, Code: resp.Error.Code, Message: resp.Error.Message, Data: data}
	}
	return resp.Result, nil
}

// rawRequest is one raw request with id, carrying what rpc describes.
func (c *conn) rawRequest(id, method string, params map[string]any) transport.JSONRPCRequest {
	req := transport.JSONRPCRequest{JSONRPC: mcp.JSONRPC_VERSION, ID: mcp.NewRequestId(id), Method: method, Params: params}
	if c.era == EraModern {
		version := c.client.ProtocolVersion()
		params["_meta"] = map[string]any{
			mcp.MetaKeyProtocolVersion:    version,
			mcp.MetaKeyClientCapabilities: c.client.GetClientCapabilities(),
			mcp.MetaKeyClientInfo:         mcp.Implementation{Name: "patchbay", Version: buildVersion()},
		}
		if c.wire != nil {
			encoded, _ := json.Marshal(params)
			req.Header = http.Header{}
			for k, v := range mcp.StandardHeaders(version, mcp.MCPMethod(method), encoded) {
				req.Header.Set(k, v)
			}
		}
	}
	return req
}

// listEvents reads events/list to its last page. A server without the
// method lists none.
func (c *conn) listEvents(ctx context.Context) ([]connect.EventType, error) {
	items, err := listPages(ctx, "events", func(ctx context.Context) error {
		pg, _ := ctx.Value(pageKey{}).(*page)
		params := map[string]any{}
		if pg.cursor != nil {
			params["cursor"] = *pg.cursor
		}
		raw, err := c.rpc(ctx, methodEventsList, params)
		pg.raw = raw
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make([]connect.EventType, 0, len(items))
	seen := map[string]bool{}
	for i, raw := range items {
		var t connect.EventType
		if err := json.Unmarshal(raw, &t); err != nil || t.Name == "" || len(t.Delivery) == 0 {
			return nil, fmt.Errorf("%w: events/list item %d is no event type with a name and delivery modes", ErrListing, i)
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("%w: events/list names %q twice", ErrListing, t.Name)
		}
		seen[t.Name] = true
		if len(t.InputSchema) > 0 {
			if err := checkSchema(t.InputSchema); err != nil {
				return nil, fmt.Errorf("event %s: %w", t.Name, err)
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// refreshEvents lists the events again after the server said they
// changed.
func (c *conn) refreshEvents(n mcp.JSONRPCNotification) {
	if n.Method != methodEventsListChanged || c.closed.Load() {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.connectTimeout)
		defer cancel()
		if err := c.RefreshEvents(ctx); err != nil {
			c.logger.Warn("mcp: events/list after list_changed failed; keeping the previous list", "err", err)
		}
	}()
}

// RefreshEvents lists the server's events again, to the last page; a
// failure keeps the previous list. Besides list_changed, a caller told
// that an event type is gone uses it: a stateless session gets no
// notifications.
func (c *conn) RefreshEvents(ctx context.Context) error {
	types, err := c.listEvents(ctx)
	if err != nil {
		return err
	}
	c.events.set(types, nil)
	return nil
}

// EventTypes is the server's current list of event types.
func (c *conn) EventTypes() []connect.EventType { return c.events.get() }

// pollResult is an events/poll result as the wire carries it.
type pollResult struct {
	Events     []connect.EventOccurrence `json:"events"`
	Cursor     *string                   `json:"cursor"`
	Truncated  bool                      `json:"truncated"`
	HasMore    bool                      `json:"hasMore"`
	NextPollMs int64                     `json:"nextPollMs"`
}

// PollEvents sends one events/poll.
func (c *conn) PollEvents(ctx context.Context, req connect.EventPoll) (*connect.EventBatch, error) {
	params := map[string]any{"name": req.Name, "arguments": req.Arguments, "cursor": req.Cursor}
	if req.Arguments == nil {
		params["arguments"] = map[string]any{}
	}
	if req.MaxEvents > 0 {
		params["maxEvents"] = req.MaxEvents
	}
	if req.Timeout > 0 {
		params["timeoutMs"] = req.Timeout.Milliseconds()
	}
	if req.MaxAge > 0 && req.Cursor != nil {
		params["maxAgeMs"] = req.MaxAge.Milliseconds()
	}
	// The server may hold a long poll for timeoutMs before it answers.
	raw, err := c.rpcWithin(ctx, c.requestTimeout+req.Timeout, methodEventsPoll, params)
	if err != nil {
		return nil, fmt.Errorf("mcp %s: %w", c.name, err)
	}
	var r pollResult
	if err := json.Unmarshal(raw, &r); err != nil || r.Events == nil {
		return nil, fmt.Errorf("mcp %s: events/poll: the result has no events array", c.name)
	}
	for i, ev := range r.Events {
		if ev.EventID == "" || ev.Name == "" {
			return nil, fmt.Errorf("mcp %s: events/poll: event %d has no eventId or name", c.name, i)
		}
	}
	return &connect.EventBatch{Events: r.Events, Cursor: r.Cursor, Truncated: r.Truncated, HasMore: r.HasMore, NextPollMs: r.NextPollMs}, nil
}
