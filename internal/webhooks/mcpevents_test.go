package webhooks_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
	"github.com/patchbay-dev/patchbay/internal/seal"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/webhooks"
)

const echoWorkflow = `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"say","connection":"mem","op":"echo","args":{"text":{"$expr":"$input.text"},"event":{"$expr":"$input.connection_event.id"}}}}`

// hookEnv is the demo MCP server offering ticket.escalated by webhook,
// patchbay's connection to it, and /hooks served by the receiver of
// whichever Service runs now.
type hookEnv struct {
	st     *store.Store
	reg    *registry.Registry
	execs  *harness.Executions
	events *demo.Events
	box    *seal.Box
	file   *config.File
	hooks  *httptest.Server
	recv   atomic.Pointer[webhooks.Receiver]

	mu   sync.Mutex
	last *http.Request // the last event delivery accepted, to replay
	body []byte
}

func newHookEnv(t *testing.T, ttl time.Duration) *hookEnv {
	t.Helper()
	e := &hookEnv{st: storetest.New(t), events: demo.NewEvents()}
	e.events.Hooks = &demo.Hooks{MaxTTL: ttl, RetryBase: 20 * time.Millisecond}
	s := demo.NewServer(demo.EventsCapability())
	s.AddTools(e.events.Tool())
	srv := httptest.NewServer(e.events.Handler(server.NewStreamableHTTPServer(s)))
	t.Cleanup(srv.Close)
	e.hooks = httptest.NewServer(http.HandlerFunc(e.serveHook))
	t.Cleanup(e.hooks.Close)

	e.reg = registry.NewRegistry(nil)
	if err := e.reg.Add("mem", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})); err != nil {
		t.Fatal(err)
	}
	if err := e.reg.Add("srv", pbmcp.New("srv", config.MCP{URL: srv.URL + "/mcp"}, nil)); err != nil {
		t.Fatal(err)
	}
	if err := e.reg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.reg.Close() })
	e.execs = harness.NewExecutions(e.st, e.reg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.execs.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	var err error
	if e.box, err = seal.New([]byte(rand.Text() + rand.Text())[:32], "", "test hooks", "test\x00"); err != nil {
		t.Fatal(err)
	}
	e.file = &config.File{
		Connections: map[string]config.Connection{"srv": {MCP: &config.MCP{URL: srv.URL + "/mcp"}}},
		Triggers: []config.Trigger{{
			ID: "escalations", Connection: "srv", Event: demo.EventTicketEscalated,
			Input:    map[string]any{"text": map[string]any{"$expr": "event.payload.title"}},
			Document: json.RawMessage(echoWorkflow),
		}},
		Inbox: &config.Inbox{ReclaimAfter: time.Second, PollFloor: 10 * time.Millisecond, PollLease: time.Second},
	}
	return e
}

// start runs a Service (a replica, or the same one after a restart) and
// makes its receiver serve /hooks.
func (e *hookEnv) start(t *testing.T, ttl time.Duration) *triggers.Service {
	t.Helper()
	svc, err := triggers.New(triggers.Options{Store: e.st, Executions: e.execs, Registry: e.reg, File: e.file, PublicURL: e.hooks.URL, Seal: e.box, WebhookTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	recv, err := webhooks.New(e.file.Connections, svc, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.recv.Store(recv)
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc
}

// serveHook is /hooks/{connection} as the API serves it.
func (e *hookEnv) serveHook(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/hooks/")
	body, _ := io.ReadAll(r.Body)
	o := e.recv.Load().Receive(r.Context(), name, r.Header, body)
	if o.Status == http.StatusNoContent && o.Event != nil {
		e.mu.Lock()
		e.last, e.body = r.Clone(context.Background()), body
		e.mu.Unlock()
	}
	if o.Challenge != "" {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"challenge": o.Challenge})
		return
	}
	w.WriteHeader(o.Status)
}

// post sends body with header to /hooks/srv and returns the status.
func (e *hookEnv) post(t *testing.T, header http.Header, body []byte) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.hooks.URL+"/hooks/srv", bytes.NewReader(body))
	req.Header = header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (e *hookEnv) subscription(t *testing.T, svc *triggers.Service) triggers.SubscriptionStatus {
	t.Helper()
	subs, err := svc.Subscriptions(context.Background(), "srv")
	if err != nil || len(subs) != 1 {
		t.Fatalf("subscriptions = %+v, %v; want one", subs, err)
	}
	return subs[0]
}

// turns is the event ids of the succeeded executions, sorted.
func (e *hookEnv) turns(t *testing.T) []string {
	t.Helper()
	page, err := e.execs.List(context.Background(), harness.ListOptions{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ex := range page.Items {
		in, _ := ex.Input.(map[string]any)
		ev, _ := in["connection_event"].(map[string]any)
		if id, _ := ev["id"].(string); id != "" && ex.Status == harness.ExecSucceeded {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServerEventsByWebhook: patchbay subscribes to the demo's webhook-only
// event with a secret of its own, answers the verification request, and
// each delivery starts exactly one turn; a replayed delivery is a
// duplicate, a forged one is refused, and a wait sees the events.
func TestServerEventsByWebhook(t *testing.T) {
	t.Parallel()
	e := newHookEnv(t, time.Hour)
	svc := e.start(t, 0)
	waitUntil(t, "the webhook subscription", func() bool { return e.subscription(t, svc).SubscriptionID != "" })
	sub := e.subscription(t, svc)
	if sub.Mode != connect.DeliveryWebhook || sub.ExpiresAt == nil || sub.ExpiresAt.Before(time.Now().Add(50*time.Minute)) {
		t.Errorf("subscription = %+v, want mode webhook expiring in about an hour", sub)
	}
	want := []string{e.events.Open("one", "high"), e.events.Open("two", "high")}
	e.events.Open("quiet", "low") // ticket.created only
	want = append(want, e.events.Open("three", "high"))
	slices.Sort(want)
	waitUntil(t, "a turn per escalation", func() bool { return len(e.turns(t)) >= len(want) })

	// The same delivery again (the server retrying): accepted, no turn.
	e.mu.Lock()
	header, body := e.last.Header, e.body
	e.mu.Unlock()
	if code := e.post(t, header, body); code != http.StatusOK {
		t.Errorf("replayed delivery: %d, want 200 (duplicate)", code)
	}
	// Signed with another secret: refused.
	forged := header.Clone()
	forged.Set("webhook-signature", sign(t, otherSecret, header.Get("webhook-id"), time.Now().Unix(), string(body)))
	if code := e.post(t, forged, body); code != http.StatusUnauthorized {
		t.Errorf("forged delivery: %d, want 401", code)
	}
	time.Sleep(300 * time.Millisecond)
	if got := e.turns(t); !slices.Equal(got, want) {
		t.Errorf("turns for %v, want %v", got, want)
	}
	if n := e.subscription(t, svc).Events; n != int64(len(want)) {
		t.Errorf("events = %d, want %d", n, len(want))
	}
	// The secret is sealed at rest and never shown.
	shown, _ := json.Marshal(e.subscription(t, svc))
	keys, _ := e.st.Client.Keys(context.Background(), e.st.Prefix+"*whsec*").Result()
	if len(keys) != 1 || strings.Contains(string(shown), "whsec_") {
		t.Fatalf("secret keys %v; status %s", keys, shown)
	}
	if stored, _ := e.st.Client.HGet(context.Background(), keys[0], "cur").Result(); !strings.HasPrefix(stored, "v1:") || strings.Contains(stored, "whsec_") {
		t.Errorf("stored secret %.12s…: want it sealed", stored)
	}

	// A wait on the connection sees a delivered event.
	doc := `{"version":1,"connections":{"srv":{"events":["ticket.*"]}},"root":{"kind":"wait","id":"w","connection":"srv","event":"ticket.escalated","timeoutMs":20000}}`
	res, _, err := e.execs.SubmitOnce(context.Background(), "wait-test", json.RawMessage(doc), map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the wait to listen", func() bool {
		ex, err := e.execs.Get(context.Background(), res.ID)
		return err == nil && len(ex.Steps) > 0 && ex.Steps[0].Cursor != ""
	})
	id := e.events.Open("awaited", "high")
	var ex *harness.Execution
	waitUntil(t, "the wait to end", func() bool {
		ex, err = e.execs.Get(context.Background(), res.ID)
		return err == nil && ex.Status.Terminal()
	})
	if out, _ := json.Marshal(ex.Output); ex.Status != harness.ExecSucceeded || !strings.Contains(string(out), id) {
		t.Errorf("wait = %s %s (%v), want it to see %s", ex.Status, out, ex.Error, id)
	}
}

// TestServerEventsWebhookRefreshAndRestart: with a one-second lifetime the
// holder refreshes before expiry, so deliveries go on past it; after a
// restart (a new Service over the same Redis) the lapsed subscription is
// created anew from the persisted cursor, and an event raised meanwhile
// is replayed and starts its one turn.
func TestServerEventsWebhookRefreshAndRestart(t *testing.T) {
	t.Parallel()
	ttl := time.Second
	e := newHookEnv(t, ttl)
	svc := e.start(t, ttl)
	waitUntil(t, "the webhook subscription", func() bool { return e.subscription(t, svc).SubscriptionID != "" })
	first := *e.subscription(t, svc).ExpiresAt
	want := []string{e.events.Open("before", "high")}
	time.Sleep(3 * ttl)
	if exp := e.subscription(t, svc).ExpiresAt; exp == nil || !exp.After(first.Add(ttl)) {
		t.Fatalf("expiresAt %v, first %v: not refreshed", exp, first)
	}
	want = append(want, e.events.Open("after expiry of the first grant", "high"))
	waitUntil(t, "turns before the restart", func() bool { return len(e.turns(t)) == 2 })

	e.mu.Lock()
	oldHeader, oldBody := e.last.Header, e.body
	e.mu.Unlock()
	svc.Close()
	waitUntil(t, "the demo's subscription to lapse", func() bool { return e.events.Hooks.Subscriptions() == 0 })
	want = append(want, e.events.Open("while down", "high"))
	restarted := time.Now()
	svc = e.start(t, ttl)
	waitUntil(t, "the subscription made anew", func() bool {
		s := e.subscription(t, svc)
		return s.RefreshedAt != nil && s.RefreshedAt.After(restarted)
	})
	// The new subscription has a fresh secret; a retry signed with the
	// previous one is still taken during the overlap (a duplicate here).
	if code := e.post(t, oldHeader, oldBody); code != http.StatusOK {
		t.Errorf("delivery signed with the previous secret: %d, want 200", code)
	}
	want = append(want, e.events.Open("after the restart", "high"))
	slices.Sort(want)
	waitUntil(t, "a turn per escalation", func() bool { return len(e.turns(t)) >= len(want) })
	time.Sleep(300 * time.Millisecond)
	if got := e.turns(t); !slices.Equal(got, want) {
		t.Errorf("turns for %v, want %v", got, want)
	}
}
