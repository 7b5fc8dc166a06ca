package mcp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// serveEvents serves the demo with its events, as cmd/demo-mcp -http does.
func serveEvents(t *testing.T, ev *demo.Events) config.MCP {
	t.Helper()
	s := demo.NewServer(demo.EventsCapability())
	s.AddTools(ev.Tool())
	ts := httptest.NewServer(ev.Handler(server.NewStreamableHTTPServer(s)))
	t.Cleanup(ts.Close)
	return config.MCP{URL: ts.URL + "/mcp"}
}

func poller(t *testing.T, conn connect.Conn) connect.EventPoller {
	t.Helper()
	p, ok := conn.(connect.EventPoller)
	if !ok {
		t.Fatalf("%T is no EventPoller", conn)
	}
	return p
}

// drain polls from cursor until the server has no more, as a subscription
// does, and returns the events and the last cursor.
func drain(t *testing.T, p connect.EventPoller, args map[string]any, cursor *string) ([]connect.EventOccurrence, *string, bool) {
	t.Helper()
	var out []connect.EventOccurrence
	truncated := false
	for range 20 {
		b, err := p.PollEvents(t.Context(), connect.EventPoll{Name: demo.EventTicketCreated, Arguments: args, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		out, cursor, truncated = append(out, b.Events...), b.Cursor, truncated || b.Truncated
		if !b.HasMore {
			return out, cursor, truncated
		}
	}
	t.Fatal("hasMore for ever")
	return nil, nil, false
}

func TestEventsListedAndPolled(t *testing.T) {
	t.Parallel()
	ev := &demo.Events{MaxBatch: 2}
	conn := openConn(t, "tickets", serveEvents(t, ev), nil)
	types := conn.Manifest().Events
	if len(types) != 1 || types[0].Name != demo.EventTicketCreated || !types[0].Offers(connect.DeliveryPoll) || len(types[0].InputSchema) == 0 {
		t.Fatalf("manifest events = %+v", types)
	}
	if info := conn.Info(); info["events"] != 1 {
		t.Errorf("info events = %v", info["events"])
	}
	p := poller(t, conn)
	ev.Open("before the subscription", "high")
	// A poll without a cursor starts from now.
	got, cursor, _ := drain(t, p, map[string]any{"priority": "high"}, nil)
	if len(got) != 0 || cursor == nil {
		t.Fatalf("first poll: %v, cursor %v", got, cursor)
	}
	for _, prio := range []string{"high", "low", "high", "high", "low"} {
		ev.Open("t", prio)
	}
	got, _, truncated := drain(t, p, map[string]any{"priority": "high"}, cursor)
	var ids []string
	for _, e := range got {
		ids = append(ids, e.EventID)
	}
	if len(ids) != 3 || ids[0] != "tkt-2" || ids[1] != "tkt-4" || ids[2] != "tkt-5" || truncated {
		t.Errorf("events %v (truncated %v), want tkt-2, tkt-4, tkt-5 (the server filters by priority, two at a time)", ids, truncated)
	}
	if got[0].Data["priority"] != "high" || got[0].Name != demo.EventTicketCreated {
		t.Errorf("event = %+v", got[0])
	}
}

func TestEventsPollErrors(t *testing.T) {
	t.Parallel()
	p := poller(t, openConn(t, "tickets", serveEvents(t, demo.NewEvents()), nil))
	tests := []struct {
		name string
		req  connect.EventPoll
		code int
	}{
		{"unknown event", connect.EventPoll{Name: "nope"}, connect.EventCodeNotFound},
		{"arguments", connect.EventPoll{Name: demo.EventTicketCreated, Arguments: map[string]any{"priority": "urgent"}}, -32602},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := p.PollEvents(t.Context(), tt.req)
			var ee *pbmcp.EventError
			if !errors.As(err, &ee) || ee.Code != tt.code {
				t.Errorf("err = %v, want code %d", err, tt.code)
			}
		})
	}
}

func TestEventsTruncatedWhenCursorTooOld(t *testing.T) {
	t.Parallel()
	ev := &demo.Events{Retain: 2}
	p := poller(t, openConn(t, "tickets", serveEvents(t, ev), nil))
	_, cursor, _ := drain(t, p, nil, nil)
	for range 4 {
		ev.Open("t", "low")
	}
	got, _, truncated := drain(t, p, nil, cursor)
	if !truncated || len(got) != 2 {
		t.Errorf("got %d events, truncated %v; want the 2 kept and truncated", len(got), truncated)
	}
}

func TestServerWithoutEventsListsNone(t *testing.T) {
	t.Parallel()
	_, spec := serveJobs(t) // mcp-go answers events/list: method not found
	conn := openConn(t, "plain", spec, nil)
	if ev := conn.Manifest().Events; len(ev) != 0 {
		t.Errorf("events = %+v", ev)
	}
}

func TestEventsSubscribeRefusals(t *testing.T) {
	t.Parallel()
	ev := demo.NewEvents()
	ev.Hooks = demo.NewHooks()
	conn := openConn(t, "tickets", serveEvents(t, ev), nil)
	sub, ok := conn.(connect.EventSubscriber)
	if !ok {
		t.Fatalf("%T is no EventSubscriber", conn)
	}
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	t.Cleanup(silent.Close)
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cases := []struct {
		name string
		req  connect.EventSubscribe
		code int
	}{
		{"unknown event", connect.EventSubscribe{Name: "nope", URL: silent.URL, Secret: secret}, connect.EventCodeNotFound},
		{"poll-only event", connect.EventSubscribe{Name: demo.EventTicketCreated, URL: silent.URL, Secret: secret}, connect.EventCodeUnsupported},
		{"weak secret", connect.EventSubscribe{Name: demo.EventTicketEscalated, URL: silent.URL, Secret: "whsec_c2hvcnQ="}, -32602},
		{"plain http elsewhere", connect.EventSubscribe{Name: demo.EventTicketEscalated, URL: "http://example.com/hooks/x", Secret: secret}, -32602},
		{"endpoint that does not echo the challenge", connect.EventSubscribe{Name: demo.EventTicketEscalated, URL: silent.URL, Secret: secret}, connect.EventCodeCallback},
	}
	for _, c := range cases {
		_, err := sub.SubscribeEvents(t.Context(), c.req)
		var ee *pbmcp.EventError
		if !errors.As(err, &ee) || ee.Code != c.code {
			t.Errorf("%s: err = %v, want code %d", c.name, err, c.code)
		}
		if err != nil && strings.Contains(err.Error(), c.req.Secret) {
			t.Errorf("%s: the error quotes the secret: %v", c.name, err)
		}
	}
	if err := sub.UnsubscribeEvents(t.Context(), demo.EventTicketEscalated, nil, silent.URL); err != nil {
		t.Errorf("unsubscribe of no subscription: %v, want nil (gone already)", err)
	}
}
