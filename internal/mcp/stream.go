package mcp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// Push delivery of the Events extension (design sketch at commit
// 082166f0): events/stream {name, arguments, cursor} is a long-lived
// request, one per subscription. The server answers a subscription it
// refuses with a JSON-RPC error at once; otherwise it sends, as
// notifications tagged with the request's id in
// _meta["io.modelcontextprotocol/subscriptionId"],
// notifications/events/active {cursor, truncated} (again mid-stream after
// a gap), notifications/events/event (an EventOccurrence with the cursor
// after it), notifications/events/heartbeat {cursor} during quiet periods,
// notifications/events/error (transient; the stream stays open) and
// notifications/events/terminated (the subscription is over). A final
// result ends the stream. Over Streamable HTTP the request is a POST
// answered with an SSE stream, cancelled by aborting it; over stdio the
// notifications share stdout and a cancel is notifications/cancelled.
//
// mcp-go hands every notification, whichever stream carried it, to the
// client's notification handlers, so routeEvents sends each to its
// stream by the subscription id. The request is sent on the transport
// directly: it has no request timeout (the heartbeat is the liveness
// signal, which the caller watches), is not re-issued when its stream
// breaks (the caller reconnects from its own cursor), and its SSE body
// is bounded per event, not in total.
const (
	methodEventsStream   = "events/stream"
	notifEventsActive    = "notifications/events/active"
	notifEventsEvent     = "notifications/events/event"
	notifEventsHeartbeat = "notifications/events/heartbeat"
	notifEventsError     = "notifications/events/error"
	notifEventsTerminate = "notifications/events/terminated"
	metaSubscriptionID   = "io.modelcontextprotocol/subscriptionId"
)

// eventStreams routes push notifications to the open streams.
type eventStreams struct {
	mu sync.Mutex
	m  map[string]*eventStream
}

// eventStream is one open events/stream as the router sees it.
type eventStream struct {
	notes chan streamNote
	done  <-chan struct{} // the stream's context
}

// streamNote is one decoded notification: a message, or why the stream
// must end (terminated, malformed).
type streamNote struct {
	msg connect.StreamMessage
	end error
}

func (s *eventStreams) open(id string, done <-chan struct{}) *eventStream {
	es := &eventStream{notes: make(chan streamNote, 16), done: done}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]*eventStream{}
	}
	s.m[id] = es
	return es
}

func (s *eventStreams) close(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

func (s *eventStreams) get(id string) *eventStream {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[id]
}

// routeEvents hands a push notification to its stream. It blocks while the
// stream's reader is behind, which over HTTP holds back only that stream's
// SSE body (TCP backpressure, as the design intends).
func (c *conn) routeEvents(n mcp.JSONRPCNotification) {
	if !strings.HasPrefix(n.Method, "notifications/events/") || n.Method == methodEventsListChanged {
		return
	}
	id := fmt.Sprint(n.Params.Meta[metaSubscriptionID])
	es := c.streams.get(id)
	if es == nil {
		return // a stream already closed, or none of ours
	}
	note := decodeNote(n)
	select {
	case es.notes <- note:
	case <-es.done:
	}
}

// streamParams are the params of any notifications/events/* message.
type streamParams struct {
	EventID   string          `json:"eventId"`
	Name      string          `json:"name"`
	Timestamp string          `json:"timestamp"`
	Data      map[string]any  `json:"data"`
	Cursor    json.RawMessage `json:"cursor"`
	Truncated bool            `json:"truncated"`
	Error     *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// decodeNote turns a notification into a stream message.
func decodeNote(n mcp.JSONRPCNotification) streamNote {
	raw, err := json.Marshal(n.Params)
	var p streamParams
	if err == nil {
		err = json.Unmarshal(raw, &p)
	}
	if err != nil {
		return streamNote{end: fmt.Errorf("%w: %s is not an object of the expected shape", connect.ErrStreamEnded, n.Method)}
	}
	msg := connect.StreamMessage{Truncated: p.Truncated}
	if len(p.Cursor) > 0 {
		msg.HasCursor = true
		if json.Unmarshal(p.Cursor, &msg.Cursor) != nil {
			return streamNote{end: fmt.Errorf("%w: %s carries a cursor that is neither a string nor null", connect.ErrStreamEnded, n.Method)}
		}
	}
	errText := func() string {
		if p.Error == nil {
			return "no error given"
		}
		return fmt.Sprintf("%s (code %d)", p.Error.Message, p.Error.Code)
	}
	switch n.Method {
	case notifEventsActive:
		msg.Kind = connect.StreamActive
	case notifEventsHeartbeat:
		msg.Kind = connect.StreamHeartbeat
	case notifEventsError:
		msg.Kind, msg.Error = connect.StreamError, errText()
	case notifEventsTerminate:
		return streamNote{end: fmt.Errorf("%w: %s", connect.ErrStreamTerminated, errText())}
	case notifEventsEvent:
		if p.EventID == "" || p.Name == "" {
			return streamNote{end: fmt.Errorf("%w: an event without eventId or name", connect.ErrStreamEnded)}
		}
		msg.Kind = connect.StreamEvent
		msg.Event = &connect.EventOccurrence{EventID: p.EventID, Name: p.Name, Timestamp: p.Timestamp, Data: p.Data}
	default:
		return streamNote{} // a kind this client does not know: skipped
	}
	return streamNote{msg: msg}
}

// StreamsEvents: a stream needs a request that may stay open, which legacy
// HTTP+SSE bounds by its response timeout.
func (c *conn) StreamsEvents() bool { return c.kind != "sse" }

// StreamEvents opens one events/stream and hands its messages to each
// (see connect.EventStreamer).
func (c *conn) StreamEvents(ctx context.Context, req connect.EventStreamRequest, each func(connect.StreamMessage) error) error {
	id := "pb-events-" + rand.Text()
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	es := c.streams.open(id, sctx.Done())
	defer c.streams.close(id)
	ended := make(chan error, 1)
	go func() { ended <- c.openStream(sctx, id, req) }()
	take := func(n streamNote) error {
		if n.end != nil {
			return fmt.Errorf("mcp %s: events/stream: %w", c.name, n.end)
		}
		if n.msg.Kind == "" {
			return nil
		}
		return each(n.msg)
	}
	for {
		select {
		case n := <-es.notes:
			if err := take(n); err != nil {
				cancel(err)
				<-ended
				return err
			}
		case err := <-ended:
			// Whatever came before the end is handed over first.
			for {
				select {
				case n := <-es.notes:
					if terr := take(n); terr != nil {
						return terr
					}
					continue
				default:
				}
				return err
			}
		}
	}
}

// openStream sends the events/stream request and waits for its end.
func (c *conn) openStream(ctx context.Context, id string, req connect.EventStreamRequest) error {
	params := map[string]any{"name": req.Name, "arguments": req.Arguments, "cursor": req.Cursor}
	if req.Arguments == nil {
		params["arguments"] = map[string]any{}
	}
	resp, err := c.capture.Interface.SendRequest(withLongStream(ctx), c.rawRequest(id, methodEventsStream, params))
	if ctx.Err() != nil {
		c.cancelStream(id)
		return context.Cause(ctx)
	}
	if err != nil {
		return fmt.Errorf("mcp %s: events/stream: %w: %w", c.name, connect.ErrStreamEnded, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("mcp %s: %w: %w", c.name, connect.ErrStreamEnded,
			&EventError{Method: methodEventsStream, Code: resp.Error.Code, Message: resp.Error.Message})
	}
	return fmt.Errorf("mcp %s: events/stream: %w: the server closed it", c.name, connect.ErrStreamEnded)
}

// cancelStream tells a stdio server the stream is over; over HTTP the
// aborted request already said so.
func (c *conn) cancelStream(id string) {
	if c.kind != "stdio" || c.closed.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	n := mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION, Notification: mcp.Notification{
		Method: string(mcp.MethodNotificationCancelled),
		Params: mcp.NotificationParams{AdditionalFields: map[string]any{"requestId": id, "reason": "subscription closed"}},
	}}
	if err := c.capture.SendNotification(ctx, n); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		c.logger.Debug("mcp: notifications/cancelled for an event stream failed", "err", err)
	}
}

// longStreamKey marks a request whose SSE response lives as long as a
// subscription: the wire bounds each of its events, not its whole body.
type longStreamKey struct{}

func withLongStream(ctx context.Context) context.Context {
	return context.WithValue(ctx, longStreamKey{}, true)
}

func isLongStream(ctx context.Context) bool {
	v, _ := ctx.Value(longStreamKey{}).(bool)
	return v
}
