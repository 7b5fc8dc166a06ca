package triggers_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

// chatServer is a Memory server declaring chat@1.
type chatServer struct{ *harness.Memory }

func (c chatServer) Connect(context.Context) (harness.Conn, error) { return c, nil }

func (c chatServer) Manifest() harness.Manifest {
	m := c.Memory.Manifest()
	m.Profiles = map[string]string{"chat": "1.0.0"}
	return m
}

func message(id, thread string) triggers.Event {
	return triggers.Event{Type: "chat.message.created", ID: id, Payload: map[string]any{"message": id, "thread": thread, "text": "hi"}}
}

// TestProfileEventsCarryTheirThread: a trigger that names no thread puts
// the turn of a chat.message.created event on the event's natural thread
// (chat@1: payload.thread), so a second message on that thread joins the
// running turn and a message on another thread starts its own. A payload
// the profile refuses is refused at the door.
func TestProfileEventsCarryTheirThread(t *testing.T) {
	t.Parallel()
	// A turn waits for the next message on its thread: one that joins it.
	doc := `{"version":1,"connections":{"chat":{"events":["chat.message.created"]}},
		"root":{"kind":"wait","id":"w","connection":"chat","event":"chat.message.created",
			"filter":"$event.payload.thread == $input.connection_event.thread && $event.id != $input.connection_event.id","timeoutMs":10000}}`
	f := &config.File{
		Connections: map[string]config.Connection{"chat": {Webhooks: &config.Webhooks{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}}},
		Triggers:    []config.Trigger{{ID: "mentions", Connection: "chat", Event: "chat.message.created", Document: json.RawMessage(doc)}},
	}
	server := chatServer{harness.NewMemory(
		harness.MemoryOp{Operation: harness.Operation{Name: "chat.post"}},
		harness.MemoryOp{Operation: harness.Operation{Name: "chat.reply"}},
	)}
	b := setupWith(t, nil, f, nil, map[string]harness.Provider{"chat": server})
	ctx := context.Background()
	if err := b.svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := b.svc.Emit(ctx, "chat", triggers.Event{Type: "chat.message.created", ID: "bad", Payload: map[string]any{"message": "bad", "text": "no thread"}}, triggers.Via{Kind: "api"})
	var ee *triggers.EventError
	if !errors.As(err, &ee) || ee.Problems[0].Path != "/payload" {
		t.Fatalf("a payload chat@1 refuses: %v", err)
	}
	// Each thread's second message comes once the first one's turn
	// listens (a wait hears events after it starts).
	for i, pair := range [][2]triggers.Event{{message("m1", "#a/m1"), message("m2", "#a/m1")}, {message("m9", "#b/m9"), message("m10", "#b/m9")}} {
		emit(t, b, pair[0])
		waitFor(t, "the turn of "+pair[0].ID+" to listen", func() bool { return listening(t, b) == i+1 })
		emit(t, b, pair[1])
	}
	waitFor(t, "every message done", func() bool { return trigger(status(t, b), "mentions").Counts.Succeeded == 4 })
	threads := map[string]string{}
	for _, ex := range allExecutions(t, b.execs) {
		if ex.Status != harness.ExecSucceeded {
			t.Errorf("%s: %s %+v", eventID(ex), ex.Status, ex.Error)
		}
		threads[eventID(ex)] = ex.Input.(map[string]any)["connection_event"].(map[string]any)["thread"].(string)
	}
	if len(threads) != 2 || threads["m1"] != "#a/m1" || threads["m9"] != "#b/m9" {
		t.Fatalf("turns by event and thread = %v, want m1 on #a/m1 and m9 on #b/m9 (m2 and m10 joined them)", threads)
	}
}

func emit(t *testing.T, b *bundle, ev triggers.Event) {
	t.Helper()
	if _, err := b.svc.Emit(context.Background(), "chat", ev, triggers.Via{Kind: "api"}); err != nil {
		t.Fatal(err)
	}
}

// listening counts the executions whose wait has started.
func listening(t *testing.T, b *bundle) int {
	n := 0
	for _, ex := range allExecutions(t, b.execs) {
		full, err := b.execs.Get(context.Background(), ex.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range full.Steps {
			if st.Cursor != "" {
				n++
			}
		}
	}
	return n
}
