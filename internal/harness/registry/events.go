package registry

import (
	"context"
	"fmt"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// EventTypes is the live connection's current list of event types, else
// the manifest's.
func (c *Connection) EventTypes() []connect.EventType {
	c.mu.RLock()
	conn, m := c.conn, c.manifest
	c.mu.RUnlock()
	if p, ok := conn.(connect.EventPoller); ok {
		return p.EventTypes()
	}
	return m.Events
}

// PollEvents sends one events/poll on the live connection.
func (c *Connection) PollEvents(ctx context.Context, req connect.EventPoll) (*connect.EventBatch, error) {
	p, err := liveAs[connect.EventPoller](c)
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
	if state != connect.StateReady || conn == nil {
		return zero, fmt.Errorf("connection %s is %s: %w", c.name, state, connect.ErrUnavailable)
	}
	t, ok := conn.(T)
	if !ok {
		return zero, fmt.Errorf("connection %s: %w", c.name, connect.ErrNoEvents)
	}
	return t, nil
}

// SubscribeEvents sends one events/subscribe on the live connection.
func (c *Connection) SubscribeEvents(ctx context.Context, req connect.EventSubscribe) (*connect.EventSubscription, error) {
	s, err := liveAs[connect.EventSubscriber](c)
	if err != nil {
		return nil, err
	}
	return s.SubscribeEvents(ctx, req)
}

// UnsubscribeEvents sends one events/unsubscribe on the live connection.
func (c *Connection) UnsubscribeEvents(ctx context.Context, name string, args map[string]any, url string) error {
	s, err := liveAs[connect.EventSubscriber](c)
	if err != nil {
		return err
	}
	return s.UnsubscribeEvents(ctx, name, args, url)
}

// RefreshEvents lists the live connection's events again, when its Conn
// can; otherwise it does nothing.
func (c *Connection) RefreshEvents(ctx context.Context) error {
	c.mu.RLock()
	conn := c.conn
	c.mu.RUnlock()
	if r, ok := conn.(connect.EventRefresher); ok {
		return r.RefreshEvents(ctx)
	}
	return nil
}

// StreamsEvents reports whether the live connection can deliver events by
// push.
func (c *Connection) StreamsEvents() bool {
	c.mu.RLock()
	conn := c.conn
	c.mu.RUnlock()
	s, ok := conn.(connect.EventStreamer)
	return ok && s.StreamsEvents()
}

// StreamEvents opens one events/stream on the live connection (see
// EventStreamer).
func (c *Connection) StreamEvents(ctx context.Context, req connect.EventStreamRequest, each func(connect.StreamMessage) error) error {
	c.mu.RLock()
	conn, state := c.conn, c.state
	c.mu.RUnlock()
	if state != connect.StateReady || conn == nil {
		return fmt.Errorf("connection %s is %s: %w", c.name, state, connect.ErrUnavailable)
	}
	s, ok := conn.(connect.EventStreamer)
	if !ok || !s.StreamsEvents() {
		return fmt.Errorf("connection %s: %w", c.name, connect.ErrNoEvents)
	}
	return s.StreamEvents(ctx, req, each)
}
