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
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// ticketConn offers ticket.created by poll; every answer after the first
// says events were skipped upstream.
type ticketConn struct {
	*connecttest.Memory
	polls atomic.Int64
}

func (c *ticketConn) Connect(context.Context) (connect.Conn, error) { return c, nil }
func (c *ticketConn) Manifest() connect.Manifest {
	return connect.Manifest{Operations: []connect.Operation{}, Events: c.EventTypes()}
}
func (c *ticketConn) EventTypes() []connect.EventType {
	return []connect.EventType{{Name: "ticket.created", Description: "a ticket was opened", Delivery: []string{"poll"},
		InputSchema: json.RawMessage(`{"type":"object","properties":{"priority":{"type":"string"}}}`)}}
}
func (c *ticketConn) PollEvents(context.Context, connect.EventPoll) (*connect.EventBatch, error) {
	cursor := "c1"
	return &connect.EventBatch{Events: []connect.EventOccurrence{}, Cursor: &cursor, Truncated: c.polls.Add(1) > 1, NextPollMs: 10}, nil
}

// The connection page of an MCP server with events lists its event types
// and each subscription's mode, cursor age, truncations and last error.
func TestConnectionPageShowsServerEvents(t *testing.T) {
	t.Parallel()
	conn := &ticketConn{Memory: connecttest.NewMemory()}
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
	}, func(reg *registry.Registry) { must(t, reg.Add("tickets", conn)) })
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

// The delivery log of a connection shows where each event went: the turn
// it started, or the running turn it joined (whose wait took it).
func TestDeliveriesShowTheirTurns(t *testing.T) {
	t.Parallel()
	var svc *triggers.Service
	doc := `{"version":1,"connections":{"chat":{"events":["message"]}},"root":{"kind":"wait","id":"next","connection":"chat","event":"message",
		"filter":"$event.payload.thread == $input.connection_event.thread","timeoutMs":10000}}`
	f := &config.File{
		Connections: map[string]config.Connection{"chat": {Source: &config.Source{Events: map[string]any{"message": map[string]any{"type": "object"}}}}},
		Triggers:    []config.Trigger{{ID: "turns", Connection: "chat", Event: "message", Thread: "event.payload.thread", Document: json.RawMessage(doc)}},
	}
	b := setupConns(t, func(o *web.Options) {
		var err error
		svc, err = triggers.New(triggers.Options{Store: o.Store, Executions: o.Executions, Registry: o.Registry, File: f})
		must(t, err)
		must(t, svc.Start(context.Background()))
		t.Cleanup(svc.Close)
		o.Triggers = svc
	}, func(reg *registry.Registry) {
		must(t, reg.Add("chat", triggers.NewProvider("chat", f.Connections["chat"])))
	})
	ctx := context.Background()
	emit := func(id string) {
		_, err := svc.Emit(ctx, "chat", triggers.Event{Type: "message", ID: id, Payload: map[string]any{"thread": "t1"}}, triggers.Via{Kind: "api"})
		must(t, err)
	}
	emit("m1")
	var turn string
	for deadline := time.Now().Add(15 * time.Second); turn == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no turn listening")
		}
		page, err := b.execs.List(ctx, harness.ListOptions{})
		must(t, err)
		for _, ex := range page.Items {
			if full, _ := b.execs.Get(ctx, ex.ID); full != nil && len(full.Steps) > 0 && full.Steps[0].Cursor != "" {
				turn = ex.ID
			}
		}
	}
	emit("m2")
	if ex, err := b.execs.Wait(ctx, turn, 10*time.Second); err != nil || ex.Status != harness.ExecSucceeded {
		t.Fatalf("turn: %+v %v", ex, err)
	}
	c := signIn(t, b)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		p := c.get("/admin/connections/chat")
		text := func(sel string) string { return strings.Join(strings.Fields(p.doc.Find(sel).Text()), " ") }
		first, second := text(`#deliveries tr[data-event="m1"] .turn`), text(`#deliveries tr[data-event="m2"] .turn`)
		short := turn[:16] + "…"
		if first == "turns: started "+short && second == "turns: joined "+short {
			if href, _ := p.doc.Find(`#deliveries tr[data-event="m2"] .turn a`).Attr("href"); href != "/admin/executions/"+turn {
				t.Fatalf("link %q", href)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("deliveries: m1 %q, m2 %q; want started and joined %s", first, second, turn)
		}
	}
}
