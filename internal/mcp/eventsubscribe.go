package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// Webhook delivery of the Events extension (design sketch at commit
// 6104601d): events/subscribe {name, arguments, delivery: {mode, url,
// secret}, cursor, ttlMs} answered with {id, refreshBefore, cursor,
// truncated}, and events/unsubscribe {name, arguments, delivery: {url}}.
// The secret goes to the server in the request and nowhere else: errors
// name the method and the server's message, never the params.

// subscribeResult is an events/subscribe result as the wire carries it.
type subscribeResult struct {
	ID            string     `json:"id"`
	RefreshBefore *time.Time `json:"refreshBefore"`
	Cursor        *string    `json:"cursor"`
	Truncated     bool       `json:"truncated"`
}

// SubscribeEvents sends one events/subscribe.
func (c *conn) SubscribeEvents(ctx context.Context, req connect.EventSubscribe) (*connect.EventSubscription, error) {
	params := map[string]any{
		"name": req.Name, "arguments": argsOrEmpty(req.Arguments), "cursor": req.Cursor,
		"delivery": map[string]any{"mode": connect.DeliveryWebhook, "url": req.URL, "secret": req.Secret},
	}
	if req.TTL > 0 {
		params["ttlMs"] = req.TTL.Milliseconds()
	}
	raw, err := c.rpc(ctx, methodEventsSubscribe, params)
	if err != nil {
		return nil, fmt.Errorf("mcp %s: %w", c.name, err)
	}
	var r subscribeResult
	if err := json.Unmarshal(raw, &r); err != nil || r.ID == "" {
		return nil, fmt.Errorf("mcp %s: events/subscribe: the result has no subscription id", c.name)
	}
	return &connect.EventSubscription{ID: r.ID, RefreshBefore: r.RefreshBefore, Cursor: r.Cursor, Truncated: r.Truncated}, nil
}

// UnsubscribeEvents sends one events/unsubscribe. A subscription the
// server no longer knows (NotFound) is gone already, which is what was
// asked.
func (c *conn) UnsubscribeEvents(ctx context.Context, name string, args map[string]any, url string) error {
	params := map[string]any{"name": name, "arguments": argsOrEmpty(args), "delivery": map[string]any{"url": url}}
	_, err := c.rpc(ctx, methodEventsUnsubscribe, params)
	if ee := (*EventError)(nil); errors.As(err, &ee) && ee.Code == connect.EventCodeNotFound {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mcp %s: %w", c.name, err)
	}
	return nil
}

func argsOrEmpty(args map[string]any) map[string]any {
	if args == nil {
		return map[string]any{}
	}
	return args
}
