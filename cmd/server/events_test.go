package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// eventsServer serves the demo with its ticket.created event (poll only,
// or push and poll), as cmd/demo-mcp -http does, and returns its event log
// and a config with a trigger on high-priority tickets: each turn echoes
// the ticket's id. The connection also subscribes to every ticket for
// wait nodes.
func eventsServer(t *testing.T, push bool) (*demo.Events, string) {
	t.Helper()
	s := demo.NewServer(demo.EventsCapability())
	ev := &demo.Events{NextPoll: 20 * time.Millisecond, MaxBatch: 3, Push: push, Heartbeat: 50 * time.Millisecond}
	s.AddTools(ev.Tool())
	ts := httptest.NewServer(ev.Handler(server.NewStreamableHTTPServer(s)))
	t.Cleanup(ts.Close)
	return ev, fmt.Sprintf(`
connections:
  demo: { mcp: { type: http, url: %q, subscribe: [{ event: ticket.created }] } }
triggers:
  - id: tickets
    connection: demo
    event: ticket.created
    arguments: { priority: high }
    input: { text: { $expr: "event.id" } }
    workflow:
      version: 1
      connections: { demo: {} }
      root: { kind: call, id: say, connection: demo, op: echo, args: { text: { $expr: "$input.text" } } }
inbox: { reclaimAfter: 2s, pollFloor: 20ms, pollLease: 1s, heartbeatTimeout: 1s }
allowlists:
  default: { connections: { demo: { ops: [echo], events: ["ticket.*"] } } }
apiKeys:
  - { name: reader, key: events-reader-key, allowlist: none, roles: [read] }
`, ts.URL+"/mcp")
}

// eventsConfig is a config with the demo at url and a trigger on its
// event with arguments: each turn echoes the event's id.
func eventsConfig(url, event, arguments string) string {
	return fmt.Sprintf(`
connections:
  demo: { mcp: { type: http, url: %q } }
triggers:
  - id: tickets
    connection: demo
    event: %s
    arguments: %s
    input: { text: { $expr: "event.id" } }
    workflow:
      version: 1
      connections: { demo: {} }
      root: { kind: call, id: say, connection: demo, op: echo, args: { text: { $expr: "$input.text" } } }
inbox: { reclaimAfter: 2s, pollFloor: 20ms, pollLease: 1s }
apiKeys:
  - { name: reader, key: events-reader-key, allowlist: none, roles: [read] }
`, url, event, arguments)
}

// onlySubscription is the one subscription GET /v1/harness/status lists
// on the replica at addr.
func onlySubscription(t *testing.T, addr string) map[string]any {
	t.Helper()
	status, body := get2(addr, "events-reader-key", "/v1/harness/status")
	subs, _ := body["subscriptions"].([]any)
	if status != 200 || len(subs) != 1 {
		t.Fatalf("status %d: subscriptions %v", status, body["subscriptions"])
	}
	return subs[0].(map[string]any)
}

// ticketTurns are the event ids of the succeeded turns the trigger started.
func ticketTurns(t *testing.T, st *store.Store) (ids []string, all int) {
	t.Helper()
	recs := records(t, context.Background(), st.Client, st.Prefix, func(r execRecord) bool { return strings.HasPrefix(r.Input.Event.ID, "tkt-") })
	for _, r := range recs {
		if r.Status == "succeeded" {
			ids = append(ids, r.Input.Event.ID)
		}
	}
	slices.Sort(ids)
	return ids, len(recs)
}

// TestServerEventsSurviveKillNine: two replicas share a subscription to
// the demo's ticket.created, offered by poll only; each is killed
// (SIGKILL) in turn while tickets keep coming, so the one polling dies
// mid-stream at least once. The other takes the subscription over from the
// persisted cursor, and each high-priority ticket starts exactly one turn.
func TestServerEventsSurviveKillNine(t *testing.T) {
	eventsSurviveKillNine(t, false)
}

// TestServerEventsPushSurviveKillNine is the same with ticket.created
// offered by push: the replica holding the stream is killed mid-stream,
// and the other reopens it from the persisted cursor. Then the server
// drops every stream, and leaves the reopened ones silent past the
// heartbeat timeout; nothing is lost or doubled. A wait node then sees a
// ticket that arrives by push.
func TestServerEventsPushSurviveKillNine(t *testing.T) {
	eventsSurviveKillNine(t, true)
}

func eventsSurviveKillNine(t *testing.T, push bool) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") shared by two processes")
	}
	st := storetest.New(t)
	ev, cfgBody := eventsServer(t, push)
	cfg := writeConfig(t, cfgBody)
	replicas := newReplicas(t, 2, serverBin, storetest.URL(t), st.Prefix, cfg, "k1", "PATCHBAY_CLAIM_TIMEOUT=2s")
	startAll(t, replicas)
	// The first poll or stream starts the subscriptions from now; tickets
	// before it are not theirs.
	waitUntil(t, "the first polls or streams", func() bool { return ev.Polls()+ev.Streams() >= 2 })

	tickets := &ticketStream{ev: ev, gap: 5 * time.Millisecond}
	tickets.killEachInTurn(t, st, replicas)
	tickets.open(6)
	if push {
		// The server drops every stream, then leaves the reopened ones
		// silent: each is reopened from its cursor (the second after
		// inbox.heartbeatTimeout), and nothing is lost or doubled.
		opened := ev.Streams()
		ev.DropStreams()
		tickets.open(6)
		waitUntil(t, "the dropped streams reopened", func() bool { return ev.Streams() >= opened+2 })
		opened = ev.Streams()
		ev.StallStreams()
		tickets.open(6)
		waitUntil(t, "the silent streams reopened", func() bool { return ev.Streams() >= opened+2 })
	}
	want := tickets.checkOneTurnEach(t, st)
	mode := "poll"
	if push {
		mode = "push"
		if n := ev.Polls(); n != 0 {
			t.Errorf("%d polls of an event offered by push", n)
		}
		// Two subscriptions, each reopened at least once by a survivor.
		if n := ev.Streams(); n < 4 {
			t.Errorf("%d streams opened, want the killed holder's reopened by the other", n)
		}
	}
	status, body := get2(replicas[0].addr, "events-reader-key", "/v1/harness/status")
	subs, _ := body["subscriptions"].([]any)
	if status != 200 || len(subs) != 2 {
		t.Fatalf("status %d: subscriptions %v", status, body["subscriptions"])
	}
	for _, s := range subs {
		sub := s.(map[string]any)
		if sub["mode"] != mode || sub["hasCursor"] != true {
			t.Errorf("subscription = %v, want mode %s with a cursor", sub, mode)
		}
		if args, _ := sub["arguments"].(map[string]any); args["priority"] == "high" && sub["events"] != float64(len(want)) {
			t.Errorf("the trigger's subscription counted %v events, want %d", sub["events"], len(want))
		}
	}
	if push {
		waitSeesTicket(t, replicas[1].addr, ev)
	}
}

// waitSeesTicket runs a wait on the demo's tickets through the API and
// opens low-priority tickets until it ends: it must see one.
func waitSeesTicket(t *testing.T, addr string, ev *demo.Events) {
	t.Helper()
	body := []byte(`{"workflow":{"version":1,"connections":{"demo":{"events":["ticket.*"]}},
	  "root":{"kind":"wait","id":"w","connection":"demo","event":"ticket.created","timeoutMs":30000,
	          "filter":"$event.payload.priority == 'low'"}},"input":{},"wait":"40s"}`)
	type answer struct {
		status int
		body   map[string]any
	}
	done := make(chan answer, 1)
	go func() { s, b := post2(addr, "k1", body); done <- answer{s, b} }()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case a := <-done:
			out, _ := json.Marshal(a.body["output"])
			if a.status != 200 || a.body["status"] != "succeeded" || !strings.Contains(string(out), `"low"`) {
				t.Fatalf("wait execution: %d %v", a.status, a.body)
			}
			return
		case <-tick.C:
			ev.Open("for the wait", "low")
		}
	}
}

// ticketStream raises tickets on the demo as a stream, every third of low
// priority, and keeps the ids of the high ones.
type ticketStream struct {
	ev   *demo.Events
	gap  time.Duration
	want []string
}

func (s *ticketStream) open(n int) {
	for i := range n {
		prio := "low"
		if i%3 != 0 {
			prio = "high"
		}
		if id := s.ev.Open("ticket", prio); prio == "high" {
			s.want = append(s.want, id)
		}
		time.Sleep(s.gap) // a stream, not a burst
	}
}

// killEachInTurn kills each replica (SIGKILL) while tickets keep coming,
// waits for the turns of the tickets so far and starts it again.
func (s *ticketStream) killEachInTurn(t *testing.T, st *store.Store, replicas []*replica) {
	t.Helper()
	for round, r := range replicas {
		s.open(15)
		r.kill()
		s.open(15)
		waitUntil(t, fmt.Sprintf("the turns of round %d", round), func() bool { got, _ := ticketTurns(t, st); return len(got) >= len(s.want) })
		if err := r.start(); err != nil {
			t.Fatal(err)
		}
	}
}

// checkOneTurnEach fails unless each high ticket started exactly one
// execution, which succeeded; it returns their ids, sorted.
func (s *ticketStream) checkOneTurnEach(t *testing.T, st *store.Store) []string {
	t.Helper()
	want := slices.Sorted(slices.Values(s.want))
	waitUntil(t, "every turn", func() bool { got, _ := ticketTurns(t, st); return len(got) >= len(want) })
	got, all := ticketTurns(t, st)
	if !slices.Equal(got, want) || all != len(want) {
		t.Fatalf("%d executions, %d succeeded for %v;\nwant one each for %v", all, len(got), got, want)
	}
	return want
}

// waitUntil polls cond for up to a minute.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
