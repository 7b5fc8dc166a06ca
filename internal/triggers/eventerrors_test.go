package triggers_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// refusingConn answers every events/poll with the error err, as the mcp
// provider does when the server answers with a JSON-RPC error.
type refusingConn struct {
	eventConn
	err error
}

func (c *refusingConn) PollEvents(_ context.Context, req connect.EventPoll) (*connect.EventBatch, error) {
	c.srv.mu.Lock()
	defer c.srv.mu.Unlock()
	c.srv.polls = append(c.srv.polls, req.Cursor)
	return nil, c.err
}

// TestServerErrorCodesBecomeSubscriptionErrors: each error code of the
// Events extension is the subscription's last error in status, saying
// what it means for the subscription with the server's data; refusals that
// polling soon will not cure are not polled again at the poll floor.
func TestServerErrorCodesBecomeSubscriptionErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		code    int
		data    map[string]any
		want    []string
		backoff bool
	}{
		{"invalid params", -32602, map[string]any{"reason": "cursor from another server"}, []string{"InvalidParams (-32602)", "arguments or cursor", "reason cursor from another server"}, false},
		{"not found", -32011, map[string]any{"kind": "event"}, []string{"NotFound (-32011)", "no longer offers this event type", "kind event"}, false},
		{"forbidden", -32012, map[string]any{"reason": "Access revoked"}, []string{"Forbidden (-32012)", "principal", "reason Access revoked", "retried every 30s"}, true},
		{"resource exhausted", -32013, map[string]any{"limit": "subscriptions", "max": 10}, []string{"ResourceExhausted (-32013)", "limit subscriptions, max 10"}, true},
		{"unsupported", -32014, map[string]any{"feature": "deliveryMode", "value": "poll"}, []string{"Unsupported (-32014)", "feature deliveryMode, value poll"}, true},
		{"schema changed", -32014, map[string]any{"feature": "inputSchema", "reason": "schema_changed"}, []string{"Unsupported (-32014)", "changed incompatibly", "feature inputSchema"}, true},
		{"callback endpoint", -32015, map[string]any{"reason": "tls_error"}, []string{"CallbackEndpointError (-32015)", "webhook endpoint", "reason tls_error"}, true},
		{"other", -32603, nil, []string{"error -32603", "UpstreamError"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := &eventServer{batch: 1, delivery: []string{"poll"}}
			refusal := &pbmcp.EventError{Method: "events/poll", Code: tt.code, Message: "UpstreamError", Data: tt.data}
			provider := connect.ProviderFunc(func(context.Context) (connect.Conn, error) {
				return &refusingConn{eventConn: eventConn{srv: srv}, err: refusal}, nil
			})
			b := setupWith(t, nil, serverFile(nil), nil, map[string]connect.Provider{"srv": provider})
			if err := b.svc.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the subscription's error", func() bool { return subscription(t, b).LastError != "" })
			sub := subscription(t, b)
			for _, w := range tt.want {
				if !strings.Contains(sub.LastError, w) {
					t.Errorf("lastError = %q, want it to say %q", sub.LastError, w)
				}
			}
			if sub.LastErrorAt == nil {
				t.Error("no lastErrorAt")
			}
			time.Sleep(1500 * time.Millisecond) // the ordinary retry is 1s
			if polls := srv.pollCount(); tt.backoff && polls != 1 || !tt.backoff && polls < 2 {
				t.Errorf("%d polls in 1.5s (backoff %v)", polls, tt.backoff)
			}
		})
	}
}

// TestSubscriptionsFollowTheServersListChanges: the demo's list_changed
// makes the connection list its events again, and the subscription judges
// itself by the new list: an event type that appears starts delivering,
// one that disappears is the subscription's last error until it is back.
func TestSubscriptionsFollowTheServersListChanges(t *testing.T) {
	t.Parallel()
	ev := &demo.Events{NextPoll: 10 * time.Millisecond}
	s := demo.NewServer(server.WithExtensions(map[string]any{pbmcp.ExtEvents: map[string]any{"listChanged": true}}))
	s.AddTools(ev.Tool())
	ev.Notify = s.SendNotificationToAllClients
	ts := httptest.NewServer(ev.Handler(server.NewStreamableHTTPServer(s)))
	t.Cleanup(ts.Close)
	spec := config.MCP{URL: ts.URL + "/mcp", Subscribe: []config.EventSubscription{{Event: "build.finished"}}}
	f := &config.File{
		Connections: map[string]config.Connection{"demo": {MCP: &spec}},
		Inbox:       &config.Inbox{PollFloor: 10 * time.Millisecond, PollLease: time.Second, PollTimeout: 200 * time.Millisecond},
	}
	// A 2025-11-25 session: its GET stream carries list_changed.
	provider := pbmcp.New("demo", spec, &pbmcp.Options{ProtocolVersion: "2025-11-25"})
	b := setupWith(t, nil, f, nil, map[string]connect.Provider{"demo": provider})
	t.Cleanup(func() { _ = b.reg.Close() }) // ends the GET stream before the server closes
	if err := b.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unlisted event's error", func() bool {
		return strings.Contains(subscription(t, b).LastError, `offers no event "build.finished"`)
	})

	ev.AddType("build.finished")
	waitFor(t, "the first poll", func() bool { return subscription(t, b).LastPollAt != nil })
	ev.Raise("build.finished", map[string]any{"build": 1})
	waitFor(t, "the event delivered", func() bool { return subscription(t, b).Events == 1 })
	if sub := subscription(t, b); sub.LastError != "" {
		t.Errorf("lastError = %q once the event is listed", sub.LastError)
	}

	ev.RemoveType("build.finished")
	waitFor(t, "the removed event's error", func() bool {
		return strings.Contains(subscription(t, b).LastError, `offers no event "build.finished"`)
	})
	ev.AddType("build.finished")
	waitFor(t, "the error cleared", func() bool { return subscription(t, b).LastError == "" })
	ev.Raise("build.finished", map[string]any{"build": 2})
	waitFor(t, "the second event delivered", func() bool { return subscription(t, b).Events == 2 })
}

// TestStatelessSessionListsAgainOnNotFound: a 2026-07-28 session hears no
// list_changed; when the server drops the event type, its poll answers
// NotFound, the connection lists its events again, and the subscription
// judges itself by the new list.
func TestStatelessSessionListsAgainOnNotFound(t *testing.T) {
	t.Parallel()
	ev := &demo.Events{NextPoll: 10 * time.Millisecond}
	ev.AddType("build.finished")
	s := demo.NewServer(demo.EventsCapability())
	s.AddTools(ev.Tool())
	ts := httptest.NewServer(ev.Handler(server.NewStreamableHTTPServer(s)))
	t.Cleanup(ts.Close)
	spec := config.MCP{URL: ts.URL + "/mcp", Subscribe: []config.EventSubscription{{Event: "build.finished"}}}
	f := &config.File{
		Connections: map[string]config.Connection{"demo": {MCP: &spec}},
		Inbox:       &config.Inbox{PollFloor: 10 * time.Millisecond, PollLease: time.Second, PollTimeout: 200 * time.Millisecond},
	}
	b := setupWith(t, nil, f, nil, map[string]connect.Provider{"demo": pbmcp.New("demo", spec, nil)})
	t.Cleanup(func() { _ = b.reg.Close() })
	if err := b.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first poll", func() bool { return subscription(t, b).LastPollAt != nil })
	ev.Raise("build.finished", map[string]any{"build": 1})
	waitFor(t, "the event delivered", func() bool { return subscription(t, b).Events == 1 })

	ev.RemoveType("build.finished") // nothing tells the client
	waitFor(t, "the list read again", func() bool {
		return strings.Contains(subscription(t, b).LastError, `offers no event "build.finished"`)
	})
	c, err := b.reg.Get("demo")
	if err != nil {
		t.Fatal(err)
	}
	if types := c.EventTypes(); len(types) != 1 || types[0].Name != demo.EventTicketCreated {
		t.Errorf("event types = %+v, want ticket.created alone", types)
	}
}
