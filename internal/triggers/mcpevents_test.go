package triggers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/seal"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

// eventServer stands in for an MCP server offering ticket.created by poll:
// its cursor is the index of the next event, it filters by the priority
// argument, and it answers at most batch events per poll.
type eventServer struct {
	batch     int
	delivery  []string
	heartbeat time.Duration // of push streams
	noStream  bool          // the transport cannot hold a stream open

	mu     sync.Mutex
	events []connect.EventOccurrence
	polls  []*string // the cursor of each poll
	push   pushState
}

var ticketSchema = json.RawMessage(`{"type":"object","properties":{"priority":{"enum":["low","high"]}},"additionalProperties":false}`)

func (s *eventServer) emit(id, priority string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, connect.EventOccurrence{EventID: id, Name: "ticket.created", Timestamp: time.Now().Format(time.RFC3339), Data: map[string]any{"title": "t " + id, "priority": priority}})
	renew(&s.push.wake)
}

func (s *eventServer) pollCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.polls)
}

func (s *eventServer) poll(req connect.EventPoll) (*connect.EventBatch, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.polls = append(s.polls, req.Cursor)
	head := strconv.Itoa(len(s.events))
	if req.Cursor == nil {
		return &connect.EventBatch{Events: []connect.EventOccurrence{}, Cursor: &head, NextPollMs: 1}, nil
	}
	from, err := strconv.Atoi(*req.Cursor)
	if err != nil {
		return nil, fmt.Errorf("bad cursor %q", *req.Cursor)
	}
	out := []connect.EventOccurrence{}
	i := from
	for ; i < len(s.events) && len(out) < s.batch; i++ {
		if p, _ := req.Arguments["priority"].(string); p == "" || s.events[i].Data["priority"] == p {
			out = append(out, s.events[i])
		}
	}
	next := strconv.Itoa(i)
	return &connect.EventBatch{Events: out, Cursor: &next, HasMore: i < len(s.events), NextPollMs: 1}, nil
}

// provider is one replica's connection to the server; cut makes every
// later poll fail, as a dead replica's would.
func (s *eventServer) provider() connect.Provider {
	return connect.ProviderFunc(func(context.Context) (connect.Conn, error) { return &eventConn{srv: s}, nil })
}

type eventConn struct{ srv *eventServer }

func (c *eventConn) Manifest() connect.Manifest {
	return connect.Manifest{Operations: []connect.Operation{}, Events: c.EventTypes()}
}
func (c *eventConn) EventTypes() []connect.EventType {
	return []connect.EventType{{Name: "ticket.created", Delivery: c.srv.delivery, InputSchema: ticketSchema}}
}
func (c *eventConn) Identity() connect.Identity {
	return connect.Identity{Surface: "mcp", Instance: "fake", Epoch: 1}
}
func (c *eventConn) Info() map[string]any { return map[string]any{} }
func (c *eventConn) Close() error         { return nil }
func (c *eventConn) Call(context.Context, connect.CallRequest) (any, error) {
	return nil, connect.ErrUnknownOperation
}
func (c *eventConn) PollEvents(_ context.Context, req connect.EventPoll) (*connect.EventBatch, error) {
	return c.srv.poll(req)
}

func serverFile(args map[string]any) *config.File {
	return &config.File{
		Connections: map[string]config.Connection{"srv": {MCP: &config.MCP{Command: "unused"}}},
		Triggers: []config.Trigger{{
			ID: "tickets", Connection: "srv", Event: "ticket.created", Arguments: args,
			Input:    map[string]any{"text": map[string]any{"$expr": "event.payload.title"}},
			Document: json.RawMessage(echoWorkflow),
		}},
		Inbox: &config.Inbox{ReclaimAfter: time.Second, PollFloor: 10 * time.Millisecond, PollLease: time.Second},
	}
}

func subscription(t *testing.T, b *bundle) triggers.SubscriptionStatus {
	t.Helper()
	subs := status(t, b).Subscriptions
	if len(subs) != 1 {
		t.Fatalf("subscriptions = %+v, want one", subs)
	}
	return subs[0]
}

// succeededEvents is the event ids of the executions that succeeded.
func succeededEvents(t *testing.T, execs *harness.Executions) []string {
	var ids []string
	for _, ex := range allExecutions(t, execs) {
		if ex.Status == harness.ExecSucceeded {
			ids = append(ids, eventID(ex))
		}
	}
	slices.Sort(ids)
	return ids
}

func TestServerEventStartsOneTurnEach(t *testing.T) {
	t.Parallel()
	srv := &eventServer{batch: 2, delivery: []string{"poll"}}
	b := setupWith(t, nil, serverFile(map[string]any{"priority": "high"}), nil, map[string]connect.Provider{"srv": srv.provider()})
	if err := b.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The first poll (no cursor) starts the subscription from now.
	waitFor(t, "the first poll", func() bool { return srv.pollCount() > 0 })
	for i := range 7 {
		srv.emit(fmt.Sprintf("e%d", i), map[bool]string{true: "high", false: "low"}[i%2 == 0])
	}
	want := []string{"e0", "e2", "e4", "e6"}
	waitFor(t, "a turn per high event", func() bool { return len(succeededEvents(t, b.execs)) >= len(want) })
	sub := subscription(t, b)
	if got := succeededEvents(t, b.execs); !slices.Equal(got, want) {
		t.Errorf("turns for %v, want %v", got, want)
	}
	if sub.Mode != "poll" || !sub.HasCursor || sub.CursorAt == nil || sub.Events != 4 || sub.LastError != "" || sub.Arguments["priority"] != "high" {
		t.Errorf("subscription = %+v", sub)
	}
	if len(b.mem.Calls()) != len(want) {
		t.Errorf("%d echo calls, want %d", len(b.mem.Calls()), len(want))
	}
}

func TestServerEventArgumentsCheckedAgainstInputSchema(t *testing.T) {
	t.Parallel()
	srv := &eventServer{batch: 2, delivery: []string{"poll"}}
	b := setupWith(t, nil, serverFile(map[string]any{"priority": "urgent"}), nil, map[string]connect.Provider{"srv": srv.provider()})
	if err := b.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription's error", func() bool { return subscription(t, b).LastError != "" })
	if sub := subscription(t, b); !strings.Contains(sub.LastError, "arguments/priority") {
		t.Errorf("lastError = %q, want it to name arguments/priority", sub.LastError)
	}
	if srv.pollCount() != 0 {
		t.Errorf("%d polls with arguments the schema refuses", srv.pollCount())
	}
}

func TestServerEventWithoutPollIsReported(t *testing.T) {
	t.Parallel()
	srv := &eventServer{batch: 2, delivery: []string{"webhook"}}
	b := setupWith(t, nil, serverFile(nil), nil, map[string]connect.Provider{"srv": srv.provider()})
	if err := b.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription's error", func() bool { return subscription(t, b).LastError != "" })
	if sub := subscription(t, b); !strings.Contains(sub.LastError, "only by webhook") {
		t.Errorf("lastError = %q", sub.LastError)
	}
}

func TestServerEventReachesWaitLog(t *testing.T) {
	t.Parallel()
	for _, delivery := range []string{"poll", "push"} {
		t.Run(delivery, func(t *testing.T) {
			t.Parallel()
			srv := &eventServer{batch: 10, delivery: []string{delivery}, heartbeat: 20 * time.Millisecond}
			testWaitSeesServerEvent(t, srv)
		})
	}
}

func testWaitSeesServerEvent(t *testing.T, srv *eventServer) {
	f := serverFile(nil)
	f.Triggers = nil
	f.Connections["srv"] = config.Connection{MCP: &config.MCP{Command: "unused", Subscribe: []config.EventSubscription{{Event: "ticket.created"}}}}
	b := setupWith(t, nil, f, nil, map[string]connect.Provider{"srv": srv.provider()})
	if err := b.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the first poll or stream", func() bool { return srv.pollCount() > 0 || len(srv.streamsOpened()) > 0 })
	doc := `{"version":1,"connections":{"srv":{"events":["ticket.*"]}},"root":{"kind":"wait","id":"w","connection":"srv","event":"ticket.created","timeoutMs":20000,"filter":"$event.payload.priority == 'high'"}}`
	res, _, err := b.execs.SubmitOnce(context.Background(), "wait-test", json.RawMessage(doc), map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the wait to listen", func() bool {
		ex, err := b.execs.Get(context.Background(), res.ID)
		return err == nil && len(ex.Steps) > 0 && ex.Steps[0].Cursor != ""
	})
	srv.emit("low-1", "low")
	srv.emit("high-1", "high")
	var ex *harness.Execution
	waitFor(t, "the wait to end", func() bool {
		ex, err = b.execs.Get(context.Background(), res.ID)
		return err == nil && ex.Status.Terminal()
	})
	out, _ := json.Marshal(ex.Output)
	if ex.Status != harness.ExecSucceeded || !strings.Contains(string(out), `"high-1"`) {
		t.Errorf("execution = %s %s (%v)", ex.Status, out, ex.Error)
	}
}

// TestServerEventTakeover: replica a polls until its Redis connection
// dies mid-stream; b takes the subscription over from the persisted cursor
// after the lease lapses, and every event starts exactly one turn.
func TestServerEventTakeover(t *testing.T) {
	t.Parallel()
	srv := &eventServer{batch: 3, delivery: []string{"poll"}}
	st := storetest.New(t)
	stA := secondClient(t, st)
	f := serverFile(nil)
	a := setupWith(t, stA, f, nil, map[string]connect.Provider{"srv": srv.provider()})
	if err := a.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a's first poll", func() bool { return srv.pollCount() > 0 })
	for i := range 10 {
		srv.emit(fmt.Sprintf("a%02d", i), "low")
	}
	waitFor(t, "a's turns", func() bool { return len(succeededEvents(t, a.execs)) == 10 })
	b := setupWith(t, st, f, nil, map[string]connect.Provider{"srv": srv.provider()})
	if err := b.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	holderA := subscription(t, b).Holder
	if holderA == "" {
		t.Fatal("no holder while a polls")
	}
	// a dies: its Redis connection goes; events keep coming.
	_ = stA.Client.Close()
	for i := range 20 {
		srv.emit(fmt.Sprintf("b%02d", i), "low")
	}
	if m := st.Miniredis(); m != nil {
		m.FastForward(f.Inbox.PollLease) // miniredis expires keys only when told
	}
	waitFor(t, "every turn", func() bool { return len(succeededEvents(t, b.execs)) >= 30 })
	got := succeededEvents(t, b.execs)
	var want []string
	for i := range 10 {
		want = append(want, fmt.Sprintf("a%02d", i))
	}
	for i := range 20 {
		want = append(want, fmt.Sprintf("b%02d", i))
	}
	if !slices.Equal(got, want) {
		t.Errorf("turns for %v,\nwant %v", got, want)
	}
	if sub := subscription(t, b); sub.Events != 30 || sub.Holder == holderA {
		t.Errorf("subscription counted %d events (want 30), holder %s (a was %s)", sub.Events, sub.Holder, holderA)
	}
}

// secondClient is another client on st's server and prefix: a replica of
// its own, whose connection can be cut.
func secondClient(t *testing.T, st *store.Store) *store.Store {
	t.Helper()
	opts := *st.Client.(*redis.Client).Options()
	return &store.Store{Client: redis.NewClient(&opts), Prefix: st.Prefix}
}

// hookConn is eventConn whose server also takes webhook subscriptions; it
// records the calls and delivers nothing.
type hookConn struct {
	eventConn
	mu           sync.Mutex
	subscribes   []connect.EventSubscribe
	unsubscribed []string
}

func (c *hookConn) SubscribeEvents(_ context.Context, req connect.EventSubscribe) (*connect.EventSubscription, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.subscribes = append(c.subscribes, req)
	until := time.Now().Add(time.Hour)
	return &connect.EventSubscription{ID: "sub_1", RefreshBefore: &until}, nil
}

func (c *hookConn) UnsubscribeEvents(_ context.Context, name string, _ map[string]any, url string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unsubscribed = append(c.unsubscribed, name+" "+url)
	return nil
}

func (c *hookConn) calls() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.subscribes), slices.Clone(c.unsubscribed)
}

// TestServerEventWebhookThenPoll: with a public URL an event type offering
// both is subscribed by webhook with a whsec_ secret; restarted without
// one, patchbay unsubscribes and polls.
func TestServerEventWebhookThenPoll(t *testing.T) {
	t.Parallel()
	srv := &eventServer{batch: 2, delivery: []string{"poll", "webhook"}}
	conn := &hookConn{eventConn: eventConn{srv: srv}}
	provider := connect.ProviderFunc(func(context.Context) (connect.Conn, error) { return conn, nil })
	st := storetest.New(t)
	box, err := seal.New(make([]byte, 32), "", "test", "test\x00")
	if err != nil {
		t.Fatal(err)
	}
	a := setupWith(t, st, serverFile(nil), nil, map[string]connect.Provider{"srv": provider})
	hooked, err := triggers.New(triggers.Options{Store: st, Executions: a.execs, Registry: a.reg, File: serverFile(nil), PublicURL: "https://pb.example.com/", Seal: box})
	if err != nil {
		t.Fatal(err)
	}
	if err := hooked.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the webhook subscription recorded", func() bool { return subscription(t, a).SubscriptionID != "" })
	hooked.Close()
	req := conn.subscribes[0]
	if req.URL != "https://pb.example.com/hooks/srv" || !strings.HasPrefix(req.Secret, "whsec_") || req.TTL != time.Hour || srv.pollCount() != 0 {
		t.Fatalf("subscribe %s ttl %s (secret %t), %d polls", req.URL, req.TTL, strings.HasPrefix(req.Secret, "whsec_"), srv.pollCount())
	}
	if sub := subscription(t, a); sub.Mode != connect.DeliveryWebhook || sub.SubscriptionID != "sub_1" || sub.ExpiresAt == nil {
		t.Fatalf("subscription = %+v", sub)
	}
	// Restarted without PATCHBAY_PUBLIC_URL: the subscription polls.
	if err := a.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a poll", func() bool { return srv.pollCount() > 0 })
	if _, un := conn.calls(); !slices.Equal(un, []string{"ticket.created https://pb.example.com/hooks/srv"}) {
		t.Errorf("unsubscribed %v", un)
	}
	waitFor(t, "mode poll", func() bool { return subscription(t, a).Mode == connect.DeliveryPoll })
	if sub := subscription(t, a); sub.SubscriptionID != "" || sub.ExpiresAt != nil {
		t.Errorf("subscription = %+v, want no webhook left", sub)
	}
}
