package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// eventsServer serves the demo with its ticket.created event (poll only),
// as cmd/demo-mcp -http does, and returns its event log and a config with
// a trigger on high-priority tickets: each turn echoes the ticket's id.
func eventsServer(t *testing.T) (*demo.Events, string) {
	t.Helper()
	s := demo.NewServer(demo.EventsCapability())
	ev := &demo.Events{NextPoll: 20 * time.Millisecond, MaxBatch: 3}
	s.AddTools(ev.Tool())
	ts := httptest.NewServer(ev.Handler(server.NewStreamableHTTPServer(s)))
	t.Cleanup(ts.Close)
	return ev, eventsConfig(ts.URL+"/mcp", "ticket.created", "{ priority: high }")
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
// the demo's ticket.created; each is killed (SIGKILL) in turn while
// tickets keep coming, so the one polling dies mid-stream at least once.
// The other takes the subscription over from the persisted cursor, and
// each high-priority ticket starts exactly one turn.
func TestServerEventsSurviveKillNine(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") shared by two processes")
	}
	st := storetest.New(t)
	ev, cfgBody := eventsServer(t)
	cfg := writeConfig(t, cfgBody)
	dir := t.TempDir()
	replicas := make([]*replica, 2)
	for i := range replicas {
		addr := freeAddr(t)
		replicas[i] = &replica{bin: serverBin, addr: addr, logPath: filepath.Join(dir, fmt.Sprintf("replica-%d.log", i)), env: []string{
			"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
			"REDIS_URL=" + storetest.URL(t), "PATCHBAY_REDIS_PREFIX=" + st.Prefix, "PATCHBAY_CONFIG=" + cfg,
			"PATCHBAY_ADDR=" + addr, "PATCHBAY_API_KEYS=k1", "PATCHBAY_LOG_LEVEL=warn", "PATCHBAY_CLAIM_TIMEOUT=2s",
		}}
		if err := replicas[i].start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, r := range replicas {
			r.kill()
		}
	})
	// The first poll starts the subscription from now; tickets before it
	// are not the subscription's.
	waitUntil(t, "the first poll", func() bool { return ev.Polls() > 0 })

	tickets := &ticketStream{ev: ev, gap: 5 * time.Millisecond}
	tickets.killEachInTurn(t, st, replicas)
	tickets.open(6)
	want := tickets.checkOneTurnEach(t, st)
	if sub := onlySubscription(t, replicas[0].addr); sub["mode"] != "poll" || sub["hasCursor"] != true || sub["events"] != float64(len(want)) {
		t.Errorf("subscription = %v", sub)
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
