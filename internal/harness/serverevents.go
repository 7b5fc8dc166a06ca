package harness

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
	MaxEvents int
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

// EventTypes is the live connection's current list of event types, else
// the manifest's.
func (c *Connection) EventTypes() []EventType {
	c.mu.RLock()
	conn, m := c.conn, c.manifest
	c.mu.RUnlock()
	if p, ok := conn.(EventPoller); ok {
		return p.EventTypes()
	}
	return m.Events
}

// PollEvents sends one events/poll on the live connection.
func (c *Connection) PollEvents(ctx context.Context, req EventPoll) (*EventBatch, error) {
	p, err := liveAs[EventPoller](c)
	if err != nil {
		return nil, err
	}
	return p.PollEvents(ctx, req)
}

// liveAs returns the ready connection's Conn as a T (an events
// interface): ErrUnavailable when it is not ready, ErrNoEvents when its
// server delivers no events that way.
func liveAs[T any](c *Connection) (T, error) {
	var zero T
	c.mu.RLock()
	conn, state := c.conn, c.state
	c.mu.RUnlock()
	if state != StateReady || conn == nil {
		return zero, fmt.Errorf("connection %s is %s: %w", c.name, state, ErrUnavailable)
	}
	t, ok := conn.(T)
	if !ok {
		return zero, fmt.Errorf("connection %s: %w", c.name, ErrNoEvents)
	}
	return t, nil
}

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

// SubscribeEvents sends one events/subscribe on the live connection.
func (c *Connection) SubscribeEvents(ctx context.Context, req EventSubscribe) (*EventSubscription, error) {
	s, err := liveAs[EventSubscriber](c)
	if err != nil {
		return nil, err
	}
	return s.SubscribeEvents(ctx, req)
}

// UnsubscribeEvents sends one events/unsubscribe on the live connection.
func (c *Connection) UnsubscribeEvents(ctx context.Context, name string, args map[string]any, url string) error {
	s, err := liveAs[EventSubscriber](c)
	if err != nil {
		return err
	}
	return s.UnsubscribeEvents(ctx, name, args, url)
}
