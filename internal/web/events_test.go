package web_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// ticketConn offers ticket.created by poll; every answer after the first
// says events were skipped upstream.
type ticketConn struct {
	*harness.Memory
	polls atomic.Int64
}

func (c *ticketConn) Connect(context.Context) (harness.Conn, error) { return c, nil }
func (c *ticketConn) Manifest() harness.Manifest {
	return harness.Manifest{Operations: []harness.Operation{}, Events: c.EventTypes()}
}
func (c *ticketConn) EventTypes() []harness.EventType {
	return []harness.EventType{{Name: "ticket.created", Description: "a ticket was opened", Delivery: []string{"poll"},
		InputSchema: json.RawMessage(`{"type":"object","properties":{"priority":{"type":"string"}}}`)}}
}
func (c *ticketConn) PollEvents(context.Context, harness.EventPoll) (*harness.EventBatch, error) {
	cursor := "c1"
	return &harness.EventBatch{Events: []harness.EventOccurrence{}, Cursor: &cursor, Truncated: c.polls.Add(1) > 1, NextPollMs: 10}, nil
}

// The connection page of an MCP server with events lists its event types
// and each subscription's mode, cursor age, truncations and last error.
func TestConnectionPageShowsServerEvents(t *testing.T) {
	t.Parallel()
	conn := &ticketConn{Memory: harness.NewMemory()}
	b := setupConns(t, func(o *web.Options) {
		f := &config.File{
			Connections: map[string]config.Connection{"tickets": {MCP: &config.MCP{URL: "http://unused", Subscribe: []config.EventSubscription{{Event: "ticket.created", Arguments: map[string]any{"priority": "high"}}}}}},
			Inbox:       &config.Inbox{PollFloor: 10 * time.Millisecond},
		}
		svc, err := triggers.New(triggers.Options{Store: o.Store, Executions: o.Executions, Registry: o.Registry, File: f})
		must(t, err)
		must(t, svc.Start(context.Background()))
		t.Cleanup(svc.Close)
		o.Triggers = svc
	}, func(reg *harness.Registry) { must(t, reg.Add("tickets", conn)) })
	for deadline := time.Now().Add(15 * time.Second); conn.polls.Load() < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the subscription did not poll")
		}
	}
	c := signIn(t, b)
	p := c.get("/admin/connections/tickets")
	text := func(sel string) string { return strings.Join(strings.Fields(p.doc.Find(sel).Text()), " ") }
	ev := `#server-events tr[data-event="ticket.created"]`
	if got := text(ev+" td:nth-child(1)") + " | " + text(ev+" td:nth-child(2)"); got != "ticket.created a ticket was opened | poll" {
		t.Errorf("event row %q", got)
	}
	row := `#subscriptions tr[data-event="ticket.created"]`
	if got := text(row+" td:nth-child(1)") + " | " + text(row+" td:nth-child(2)"); got != `ticket.created {"priority":"high"} | poll` {
		t.Errorf("subscription row %q", got)
	}
	if got := text(row + " .cursor-age"); !strings.HasSuffix(got, "s ago") {
		t.Errorf("cursor age %q", got)
	}
	if got := text(row + " .truncated"); !strings.HasPrefix(got, "truncated") {
		t.Errorf("truncated %q", got)
	}
	if got := text(row + " .last-error"); got != "—" {
		t.Errorf("last error %q", got)
	}
}
