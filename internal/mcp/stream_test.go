package mcp_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// openStream runs one events/stream in the background: its messages
// arrive on msgs, and its end on ended.
func openStream(t *testing.T, conn connect.Conn, req connect.EventStreamRequest) (msgs chan connect.StreamMessage, ended chan error, stop func()) {
	t.Helper()
	s, ok := conn.(connect.EventStreamer)
	if !ok || !s.StreamsEvents() {
		t.Fatalf("%T does not stream events", conn)
	}
	ctx, cancel := context.WithCancel(t.Context())
	msgs, ended = make(chan connect.StreamMessage, 100), make(chan error, 1)
	go func() {
		ended <- s.StreamEvents(ctx, req, func(m connect.StreamMessage) error { msgs <- m; return nil })
	}()
	t.Cleanup(cancel)
	return msgs, ended, cancel
}

// next is the next message of kind, skipping heartbeats unless asked for.
func next(t *testing.T, msgs chan connect.StreamMessage, kind string) connect.StreamMessage {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m := <-msgs:
			if m.Kind == kind {
				return m
			}
			if m.Kind != connect.StreamHeartbeat {
				t.Fatalf("got %+v, want a %s message", m, kind)
			}
		case <-timeout:
			t.Fatalf("no %s message", kind)
		}
	}
}

func TestEventsStreamed(t *testing.T) {
	t.Parallel()
	ev := &demo.Events{Push: true, Heartbeat: 20 * time.Millisecond}
	conn := openConn(t, "tickets", serveEvents(t, ev), nil)
	if ty := conn.Manifest().Events; len(ty) != 1 || !ty[0].Offers(connect.DeliveryPush) {
		t.Fatalf("events = %+v, want ticket.created by push", ty)
	}
	ev.Open("before the stream", "high")
	args := map[string]any{"priority": "high"}
	msgs, ended, _ := openStream(t, conn, connect.EventStreamRequest{Name: demo.EventTicketCreated, Arguments: args})
	active := next(t, msgs, connect.StreamActive)
	if !active.HasCursor || active.Cursor == nil || *active.Cursor != "1" || active.Truncated {
		t.Fatalf("active = %+v, want cursor 1 (from now)", active)
	}
	for _, prio := range []string{"high", "low", "high"} {
		ev.Open("t", prio)
	}
	for _, want := range []string{"tkt-2", "tkt-4"} {
		m := next(t, msgs, connect.StreamEvent)
		if m.Event.EventID != want || m.Cursor == nil || "tkt-"+*m.Cursor != want || m.Event.Data["priority"] != "high" {
			t.Fatalf("event = %+v (cursor %v), want %s with its cursor", m.Event, m.Cursor, want)
		}
	}
	// The heartbeat carries the position looked up to: past the low ticket.
	if hb := next(t, msgs, connect.StreamHeartbeat); hb.Cursor == nil || *hb.Cursor != "4" {
		t.Errorf("heartbeat cursor = %v, want 4", hb.Cursor)
	}
	ev.DropStreams()
	select {
	case err := <-ended:
		if !errors.Is(err, connect.ErrStreamEnded) {
			t.Fatalf("end = %v, want ErrStreamEnded", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the dropped stream did not end")
	}

	// Resuming from the cursor gives what came meanwhile, once.
	ev.Open("while away", "high")
	cursor := "4"
	msgs, _, stop := openStream(t, conn, connect.EventStreamRequest{Name: demo.EventTicketCreated, Arguments: args, Cursor: &cursor})
	defer stop()
	if a := next(t, msgs, connect.StreamActive); a.Truncated || *a.Cursor != "4" {
		t.Errorf("active on resume = %+v", a)
	}
	if m := next(t, msgs, connect.StreamEvent); m.Event.EventID != "tkt-5" {
		t.Errorf("first event on resume = %s, want tkt-5", m.Event.EventID)
	}
}

func TestEventsStreamRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ev   *demo.Events
		req  connect.EventStreamRequest
		code int
	}{
		{"only poll offered", &demo.Events{}, connect.EventStreamRequest{Name: demo.EventTicketCreated}, connect.EventCodeUnsupported},
		{"unknown event", &demo.Events{Push: true}, connect.EventStreamRequest{Name: "nope"}, connect.EventCodeNotFound},
		{"arguments", &demo.Events{Push: true}, connect.EventStreamRequest{Name: demo.EventTicketCreated, Arguments: map[string]any{"priority": "urgent"}}, -32602},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn := openConn(t, "tickets", serveEvents(t, tt.ev), nil)
			_, ended, _ := openStream(t, conn, tt.req)
			var ee *pbmcp.EventError
			if err := <-ended; !errors.As(err, &ee) || ee.Code != tt.code || !errors.Is(err, connect.ErrStreamEnded) {
				t.Errorf("err = %v, want code %d", err, tt.code)
			}
		})
	}
}

// TestEventsStreamCancelled: ending the caller's context ends the stream
// with the context's cause, and the server sees the request go.
func TestEventsStreamCancelled(t *testing.T) {
	t.Parallel()
	ev := &demo.Events{Push: true, Heartbeat: time.Hour}
	conn := openConn(t, "tickets", serveEvents(t, ev), nil)
	s := conn.(connect.EventStreamer)
	ctx, cancel := context.WithCancelCause(t.Context())
	stopped := errors.New("lease lost")
	err := s.StreamEvents(ctx, connect.EventStreamRequest{Name: demo.EventTicketCreated}, func(m connect.StreamMessage) error {
		cancel(stopped)
		return nil
	})
	if !errors.Is(err, stopped) {
		t.Errorf("err = %v, want the cause", err)
	}
	// The connection still answers other requests.
	if _, err := conn.(connect.EventPoller).PollEvents(t.Context(), connect.EventPoll{Name: demo.EventTicketCreated}); err != nil {
		t.Errorf("poll after the stream: %v", err)
	}
}

// TestEventsStreamedOverStdio: over stdio the stream's notifications share
// stdout with everything else, and closing the stream sends
// notifications/cancelled with its request id.
func TestEventsStreamedOverStdio(t *testing.T) {
	t.Parallel()
	conn := openConn(t, "fake", fakeSpec("events"), nil)
	msgs, ended, stop := openStream(t, conn, connect.EventStreamRequest{Name: "tick"})
	if a := next(t, msgs, connect.StreamActive); a.Cursor == nil || *a.Cursor != "0" {
		t.Errorf("active = %+v", a)
	}
	if m := next(t, msgs, connect.StreamEvent); m.Event.EventID != "e1" || *m.Cursor != "1" {
		t.Errorf("event = %+v", m)
	}
	if hb := next(t, msgs, connect.StreamHeartbeat); *hb.Cursor != "1" {
		t.Errorf("heartbeat = %+v", hb)
	}
	stop()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("end = %v, want the cancellation", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := conn.Call(t.Context(), connect.CallRequest{Op: "cancelled", Args: map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		if text := fmt.Sprint(res); strings.Contains(text, "pb-events-") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server saw no notifications/cancelled for the stream: %v", res)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
