package triggers

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// NewProvider returns the harness Provider of a source or cron connection,
// so it is listed with the others (GET /v1/connections, status). It has no
// operations: its events come in through the inbox.
func NewProvider(name string, c config.Connection) connect.Provider {
	info := map[string]any{"transport": "events"}
	surface := "source"
	switch {
	case c.Cron != nil:
		surface = "cron"
		info["schedule"] = c.Cron.Schedule
		info["timezone"] = c.Cron.Location().String()
		info["events"] = []string{config.CronEventTick}
	case c.Source != nil:
		info["events"] = slices.Sorted(maps.Keys(c.Source.Events))
	}
	info["webhooks"] = c.Webhooks != nil
	conn := &eventConn{id: connect.Identity{Surface: surface, Instance: name, Epoch: 1}, info: info}
	return connect.ProviderFunc(func(context.Context) (connect.Conn, error) { return conn, nil })
}

type eventConn struct {
	id   connect.Identity
	info map[string]any
}

func (c *eventConn) Manifest() connect.Manifest {
	return connect.Manifest{Operations: []connect.Operation{}}
}
func (c *eventConn) Identity() connect.Identity { return c.id }
func (c *eventConn) Info() map[string]any       { return maps.Clone(c.info) }
func (c *eventConn) Close() error               { return nil }
func (c *eventConn) Call(_ context.Context, req connect.CallRequest) (any, error) {
	return nil, fmt.Errorf("%s has no operations: %q: %w", c.id.Instance, req.Op, connect.ErrUnknownOperation)
}
