package triggers_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// pushState is the fake server's push side: the cursor each stream was
// opened with, and channels to wake, drop or stall the open streams.
type pushState struct {
	opened   []*string
	truncate bool // the next stream opens with truncated: true
	wake     chan struct{}
	drop     chan struct{}
	stall    chan struct{}
}

func renew(ch *chan struct{}) {
	if *ch != nil {
		close(*ch)
	}
	*ch = make(chan struct{})
}

// chans returns the current channels; s.mu is held.
func (s *eventServer) chans() (wake, drop, stall chan struct{}) {
	p := &s.push
	for _, ch := range []*chan struct{}{&p.wake, &p.drop, &p.stall} {
		if *ch == nil {
			*ch = make(chan struct{})
		}
	}
	return p.wake, p.drop, p.stall
}

func (s *eventServer) dropStreams()  { s.mu.Lock(); renew(&s.push.drop); s.mu.Unlock() }
func (s *eventServer) stallStreams() { s.mu.Lock(); renew(&s.push.stall); s.mu.Unlock() }

// streamsOpened is the cursors the streams were opened with.
func (s *eventServer) streamsOpened() []*string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.push.opened)
}

// stream serves one events/stream as the design has it: active with the
// cursor it starts from, each matching event with the cursor after it,
// heartbeats every heartbeat when quiet.
func (s *eventServer) stream(ctx context.Context, req connect.EventStreamRequest, each func(connect.StreamMessage) error) error {
	s.mu.Lock()
	s.push.opened = append(s.push.opened, req.Cursor)
	from := len(s.events)
	if req.Cursor != nil {
		from, _ = strconv.Atoi(*req.Cursor)
	}
	_, drop, stall := s.chans()
	truncated := s.push.truncate
	s.push.truncate = false
	s.mu.Unlock()
	cur := func(i int) *string { c := strconv.Itoa(i); return &c }
	if err := each(connect.StreamMessage{Kind: connect.StreamActive, Cursor: cur(from), HasCursor: true, Truncated: truncated}); err != nil {
		return err
	}
	beat := time.NewTicker(s.heartbeat)
	defer beat.Stop()
	for {
		select {
		case <-stall: // before anything else: a stalled stream sends nothing
			<-ctx.Done()
			return context.Cause(ctx)
		default:
		}
		s.mu.Lock()
		pending, head := slices.Clone(s.events[from:]), len(s.events)
		wake, _, _ := s.chans()
		s.mu.Unlock()
		for i, ev := range pending {
			if p, _ := req.Arguments["priority"].(string); p != "" && ev.Data["priority"] != p {
				continue
			}
			if err := each(connect.StreamMessage{Kind: connect.StreamEvent, Event: &ev, Cursor: cur(from + i + 1), HasCursor: true}); err != nil {
				return err
			}
		}
		from = head
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-stall:
			<-ctx.Done()
			return context.Cause(ctx)
		case <-drop:
			return fmt.Errorf("%w: dropped", connect.ErrStreamEnded)
		case <-wake:
		case <-beat.C:
			if err := each(connect.StreamMessage{Kind: connect.StreamHeartbeat, Cursor: cur(from), HasCursor: true}); err != nil {
				return err
			}
		}
	}
}

func (c *eventConn) StreamsEvents() bool { return !c.srv.noStream }
func (c *eventConn) StreamEvents(ctx context.Context, req connect.EventStreamRequest, each func(connect.StreamMessage) error) error {
	return c.srv.stream(ctx, req, each)
}

// started is a replica on st (nil: a store of its own) serving f's
// triggers on srv, started.
func started(t *testing.T, st *store.Store, f *config.File, srv *eventServer) *bundle {
	t.Helper()
	b := setupWith(t, st, f, nil, map[string]connect.Provider{"srv": srv.provider()})
	if err := b.svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return b
}

func pushServer() *eventServer {
	return &eventServer{batch: 100, delivery: []string{"push", "poll"}, heartbeat: 20 * time.Millisecond}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

// TestServerEventPushReconnectsFromCursor: the server drops the stream
// again and again while events come; each reopened stream resumes from
// the persisted cursor, and every event starts exactly one turn.
func TestServerEventPushReconnectsFromCursor(t *testing.T) {
	t.Parallel()
	srv := pushServer()
	b := started(t, nil, serverFile(nil), srv)
	waitFor(t, "the first stream", func() bool { return len(srv.streamsOpened()) > 0 })
	for round := range 4 {
		for _, id := range ids(fmt.Sprintf("r%d-", round), 5) {
			srv.emit(id, "low")
		}
		srv.dropStreams()
		waitFor(t, "a reopened stream", func() bool { return len(srv.streamsOpened()) > round+1 })
	}
	var want []string
	for round := range 4 {
		want = append(want, ids(fmt.Sprintf("r%d-", round), 5)...)
	}
	waitFor(t, "every turn", func() bool { return len(succeededEvents(t, b.execs)) >= len(want) })
	if got := succeededEvents(t, b.execs); !slices.Equal(got, want) {
		t.Errorf("turns for %v,\nwant %v", got, want)
	}
	opened := srv.streamsOpened()
	if opened[0] != nil {
		t.Errorf("the first stream was opened with cursor %s, want none (from now)", *opened[0])
	}
	for i, c := range opened[1:] {
		if c == nil {
			t.Errorf("stream %d was reopened without the persisted cursor", i+1)
		}
	}
	sub := subscription(t, b)
	if sub.Mode != "push" || sub.Events != int64(len(want)) || !sub.HasCursor || srv.pollCount() != 0 {
		t.Errorf("subscription = %+v, %d polls", sub, srv.pollCount())
	}
}

// TestServerEventPushHeartbeatTimeout: a stream that stays open but
// carries nothing past inbox.heartbeatTimeout is reopened from the cursor.
func TestServerEventPushHeartbeatTimeout(t *testing.T) {
	t.Parallel()
	srv := pushServer()
	f := serverFile(nil)
	f.Inbox.HeartbeatTimeout = 500 * time.Millisecond
	b := started(t, nil, f, srv)
	waitFor(t, "the first stream", func() bool { return len(srv.streamsOpened()) > 0 })
	srv.emit("before", "low")
	waitFor(t, "the first turn", func() bool { return len(succeededEvents(t, b.execs)) == 1 })
	before := len(srv.streamsOpened()) // more than one if the machine was slow
	srv.stallStreams()
	srv.emit("during", "low") // the stalled stream does not carry it
	waitFor(t, "a reopened stream", func() bool { return len(srv.streamsOpened()) > before })
	waitFor(t, "the second turn", func() bool { return len(succeededEvents(t, b.execs)) == 2 })
	if got := succeededEvents(t, b.execs); !slices.Equal(got, []string{"before", "during"}) {
		t.Errorf("turns for %v", got)
	}
	if c := srv.streamsOpened()[before]; c == nil || *c != "1" {
		t.Errorf("reopened with cursor %s, want 1 (after the first event)", cursorText(c))
	}
}

// TestServerEventPushTakeover: replica a streams until its Redis
// connection dies; b takes the subscription over once the lease lapses,
// reopens the stream from the persisted cursor, and every event starts
// exactly one turn.
func TestServerEventPushTakeover(t *testing.T) {
	t.Parallel()
	srv := pushServer()
	st := storetest.New(t)
	stA := secondClient(t, st)
	f := serverFile(nil)
	a := started(t, stA, f, srv)
	waitFor(t, "a's stream", func() bool { return len(srv.streamsOpened()) > 0 })
	for _, id := range ids("a", 10) {
		srv.emit(id, "low")
	}
	waitFor(t, "a's turns", func() bool { return len(succeededEvents(t, a.execs)) == 10 })
	b := started(t, st, f, srv)
	holderA := subscription(t, b).Holder
	_ = stA.Client.Close()
	for _, id := range ids("b", 20) {
		srv.emit(id, "low")
	}
	if m := st.Miniredis(); m != nil {
		m.FastForward(f.Inbox.PollLease)
	}
	want := append(ids("a", 10), ids("b", 20)...)
	waitFor(t, "every turn", func() bool { return len(succeededEvents(t, b.execs)) >= len(want) })
	if got := succeededEvents(t, b.execs); !slices.Equal(got, want) {
		t.Errorf("turns for %v,\nwant %v", got, want)
	}
	if sub := subscription(t, b); sub.Events != 30 || sub.Holder == holderA || sub.Mode != "push" {
		t.Errorf("subscription = %+v (a was %s)", sub, holderA)
	}
	if srv.pollCount() != 0 {
		t.Errorf("%d polls of a subscription offered by push", srv.pollCount())
	}
}

// TestChooseDelivery: push is preferred, then poll; a server offering
// only poll is polled, and push needs a transport that can hold a stream.
func TestChooseDelivery(t *testing.T) {
	t.Parallel()
	tests := []struct {
		delivery []string
		stream   bool
		want     string
	}{
		{[]string{"poll"}, true, "poll"},
		{[]string{"poll", "push"}, true, "push"},
		{[]string{"push", "poll", "webhook"}, true, "push"},
		{[]string{"push", "poll"}, false, "poll"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.delivery, tt.stream), func(t *testing.T) {
			t.Parallel()
			srv := &eventServer{batch: 10, delivery: tt.delivery, heartbeat: time.Second, noStream: !tt.stream}
			b := setupWith(t, nil, serverFile(nil), nil, map[string]connect.Provider{"srv": srv.provider()})
			if err := b.svc.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "a poll or a stream", func() bool { return srv.pollCount() > 0 || len(srv.streamsOpened()) > 0 })
			if sub := subscription(t, b); sub.Mode != tt.want {
				t.Errorf("mode = %s, want %s", sub.Mode, tt.want)
			}
		})
	}
}

// TestServerEventPushTruncated: a stream that opens with truncated: true
// (events were skipped upstream) is counted, with its time.
func TestServerEventPushTruncated(t *testing.T) {
	t.Parallel()
	srv := pushServer()
	b := started(t, nil, serverFile(nil), srv)
	waitFor(t, "the first stream", func() bool { return len(srv.streamsOpened()) > 0 })
	srv.mu.Lock()
	srv.push.truncate = true
	srv.mu.Unlock()
	srv.dropStreams()
	waitFor(t, "the truncated count", func() bool { return subscription(t, b).Truncated == 1 })
	if sub := subscription(t, b); sub.TruncatedAt == nil || sub.Mode != "push" {
		t.Errorf("subscription = %+v", sub)
	}
}

func cursorText(c *string) string {
	if c == nil {
		return "null"
	}
	return *c
}
