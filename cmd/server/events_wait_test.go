package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/demo"
)

// eventPollOnly is an event type the demo offers by poll only, kept apart
// from ticket.created, whose delivery modes may grow.
const eventPollOnly = "alert.raised"

// TestWaitSeesAServerEventOverTheAPI: a document submitted through the
// API waits for an event of an MCP server that offers it by poll only; the
// server's events reach the wait through the subscription, the wait's
// filter passes over the ones it does not want, and the API shows the
// subscription and the event type.
func TestWaitSeesAServerEventOverTheAPI(t *testing.T) {
	t.Parallel()
	ev := &demo.Events{NextPoll: 20 * time.Millisecond}
	ev.AddType(eventPollOnly, "poll")
	s := demo.NewServer(demo.EventsCapability())
	s.AddTools(ev.Tool())
	ts := httptest.NewServer(ev.Handler(server.NewStreamableHTTPServer(s)))
	t.Cleanup(ts.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  demo: { mcp: { type: http, url: %q, subscribe: [{ event: %s }] } }
allowlists:
  default:
    connections:
      demo: { ops: ["*"], events: ["alert.*"] }
inbox: { pollFloor: 20ms, pollLease: 1s, pollTimeout: 2s }
`, ts.URL+"/mcp", eventPollOnly))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	})
	// The subscription's first poll starts it from now.
	waitUntil(t, "the first poll", func() bool { return ev.Polls() > 0 })

	// Alerts keep coming until the wait has taken one: it listens from
	// when it starts, which the test cannot see from outside.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			ev.Raise(eventPollOnly, map[string]any{"severity": "low", "n": i})
			ev.Raise(eventPollOnly, map[string]any{"severity": "high", "n": i})
			time.Sleep(100 * time.Millisecond)
		}
	}()
	ex := post(t, srv.url, "k1", []byte(`{"wait":"30s","workflow":{"version":1,"connections":{"demo":{"events":["alert.*"]}},
		"root":{"kind":"wait","id":"w","connection":"demo","event":"alert.raised","timeoutMs":20000,
			"filter":"$event.payload.severity == 'high'"}}}`))
	cancel()
	out, _ := ex["output"].(map[string]any)
	got, _ := out["event"].(map[string]any)
	payload, _ := got["payload"].(map[string]any)
	if ex["status"] != "succeeded" || got["type"] != eventPollOnly || payload["severity"] != "high" {
		t.Fatalf("execution = %v", ex)
	}

	type eventType struct {
		Name     string   `json:"name"`
		Delivery []string `json:"delivery"`
	}
	var conn struct {
		Events []eventType `json:"events"`
	}
	getJSONAs(t, srv.url+"/v1/connections/demo", "k1", &conn)
	i := slices.IndexFunc(conn.Events, func(e eventType) bool { return e.Name == eventPollOnly })
	if i < 0 || !slices.Equal(conn.Events[i].Delivery, []string{"poll"}) {
		t.Errorf("connection events = %+v, want %s offered by poll only", conn.Events, eventPollOnly)
	}
}
