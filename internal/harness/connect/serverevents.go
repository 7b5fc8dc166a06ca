package connect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Delivery modes of a server's event type (the MCP Events extension).
const (
	DeliveryPoll    = "poll"
	DeliveryPush    = "push"
	DeliveryWebhook = "webhook"
)

// Error codes of the MCP Events extension (design sketch, "Error
// Codes"), as a server answers an events request.
const (
	EventCodeNotFound          = -32011
	EventCodeForbidden         = -32012
	EventCodeResourceExhausted = -32013
	EventCodeUnsupported       = -32014
	EventCodeCallback          = -32015 // the callback URL failed verification or was unreachable
)

// EventType is one event type a server offers: its subscription arguments
// (InputSchema) and the shape of its payloads.
type EventType struct {
	Name          string          `json:"name"`
	Description   string          `json:"description,omitempty"`
	Delivery      []string        `json:"delivery"`
	InputSchema   json.RawMessage `json:"inputSchema,omitempty"`
	PayloadSchema json.RawMessage `json:"payloadSchema,omitempty"`
}

// Offers reports whether the event type can be delivered in mode.
func (t EventType) Offers(mode string) bool { return slices.Contains(t.Delivery, mode) }

// EventType returns the named event type and whether the server offers it.
func (m Manifest) EventType(name string) (EventType, bool) {
	for _, t := range m.Events {
		if t.Name == name {
			return t, true
		}
	}
	return EventType{}, false
}

// EventPoll is one events/poll request: a subscription (event type and
// arguments) and the cursor to resume from (nil: start from now).
type EventPoll struct {
	Name      string
	Arguments map[string]any
	Cursor    *string
	// MaxEvents caps the batch (maxEvents); zero leaves it to the server.
	MaxEvents int
	// Timeout is how long the server may hold the poll open waiting for an
	// event (timeoutMs, a long poll); zero leaves it to the server.
	Timeout time.Duration
	// MaxAge bounds replay from Cursor (maxAgeMs): older events are
	// skipped and the answer says truncated. Zero: no bound. Not sent
	// without a cursor, which already means "from now".
	MaxAge time.Duration
}

// EventOccurrence is one event a server delivered.
type EventOccurrence struct {
	EventID   string         `json:"eventId"`
	Name      string         `json:"name"`
	Timestamp string         `json:"timestamp"`
	Data      map[string]any `json:"data"`
}

// EventBatch is an events/poll result. Cursor nil means the event type
// has no replay: the next poll sends nil again.
type EventBatch struct {
	Events     []EventOccurrence
	Cursor     *string
	Truncated  bool
	HasMore    bool
	NextPollMs int64
}

// EventPoller is a Conn whose server delivers events by poll. EventTypes
// is the current list (refreshed when the server says it changed), which
// may be newer than the manifest read at connect.
type EventPoller interface {
	EventTypes() []EventType
	PollEvents(ctx context.Context, req EventPoll) (*EventBatch, error)
}

// ErrNoEvents: the connection's server delivers no events.
var ErrNoEvents = errors.New("the connection's server delivers no events")

// EventSubscribe is one events/subscribe request: webhook delivery of an
// event type to URL, signed with Secret (a whsec_ value patchbay made).
// Cursor nil starts from now; TTL is the lifetime suggested (zero: the
// server's default).
type EventSubscribe struct {
	Name      string
	Arguments map[string]any
	URL       string
	Secret    string
	Cursor    *string
	TTL       time.Duration
}

// EventSubscription is the server's answer to events/subscribe: its id
// for the subscription (sent with every delivery as X-MCP-Subscription-Id),
// the time to refresh before (nil: no expiry), the safe-to-persist cursor
// and whether delivery starts later than the cursor asked for.
type EventSubscription struct {
	ID            string
	RefreshBefore *time.Time
	Cursor        *string
	Truncated     bool
}

// EventSubscriber is a Conn whose server delivers events by webhook
// (events/subscribe, events/unsubscribe of the MCP Events extension).
type EventSubscriber interface {
	SubscribeEvents(ctx context.Context, req EventSubscribe) (*EventSubscription, error)
	UnsubscribeEvents(ctx context.Context, name string, args map[string]any, url string) error
}

// EventRefresher is a Conn that can list its server's events again when
// told the list it holds is stale.
type EventRefresher interface {
	RefreshEvents(ctx context.Context) error
}

// EventStreamRequest opens one events/stream (push delivery): a
// subscription and the cursor to resume from (nil: start from now).
type EventStreamRequest struct {
	Name      string
	Arguments map[string]any
	Cursor    *string
}

// Kinds of StreamMessage.
const (
	// StreamActive confirms the subscription, and comes again mid-stream
	// after a gap (Truncated).
	StreamActive = "active"
	// StreamEvent carries one event.
	StreamEvent = "event"
	// StreamHeartbeat says the stream is alive and how far the server has
	// looked.
	StreamHeartbeat = "heartbeat"
	// StreamError is a transient failure the server reports; the stream
	// stays open.
	StreamError = "error"
)

// StreamMessage is one message of a push stream.
type StreamMessage struct {
	Kind  string
	Event *EventOccurrence // StreamEvent only
	// Cursor is the subscription's position after this message, when
	// HasCursor; nil then means the event type has no replay. A message
	// without a cursor leaves the position where it was.
	Cursor    *string
	HasCursor bool
	// Truncated (StreamActive): events before Cursor were skipped upstream.
	Truncated bool
	// Error (StreamError) is the server's message.
	Error string
}

// EventStreamer is a Conn whose server can deliver events by push.
// StreamEvents opens the stream and hands each message to each, in order,
// until the stream ends: it returns each's error if each stopped it,
// ctx's cause if ctx ended, and otherwise an error wrapping ErrStreamEnded
// (the server ended or broke the stream, or terminated the subscription:
// ErrStreamTerminated). A subscription the server refuses fails before any
// message. StreamsEvents reports whether the transport can hold a stream
// open (legacy HTTP+SSE bounds every request by the request timeout).
type EventStreamer interface {
	StreamsEvents() bool
	StreamEvents(ctx context.Context, req EventStreamRequest, each func(StreamMessage) error) error
}

// Errors of a push stream.
var (
	ErrStreamEnded      = errors.New("the server's event stream ended")
	ErrStreamTerminated = fmt.Errorf("%w: the server terminated the subscription", ErrStreamEnded)
)
