package triggers_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

// chatServer is a Memory server declaring chat@1.
type chatServer struct{ *connecttest.Memory }

func (c chatServer) Connect(context.Context) (connect.Conn, error) { return c, nil }

func (c chatServer) Manifest() connect.Manifest {
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
	// A turn takes the next message on its thread, then waits for "bye"
	// there; "bye" starts no turn, so the other message on the thread
	// joins the running turn, whose first wait takes it.
	doc := `{"version":1,"connections":{"chat":{"events":["chat.message.created"]}},
		"root":{"kind":"sequence","id":"turn","steps":[
			{"kind":"wait","id":"next","connection":"chat","event":"chat.message.created",
				"filter":"$event.payload.thread == $input.connection_event.thread && $event.payload.text != 'bye'","timeoutMs":30000},
			{"kind":"wait","id":"w","connection":"chat","event":"chat.message.created",
				"filter":"$event.payload.thread == $input.connection_event.thread && $event.payload.text == 'bye'","timeoutMs":30000}]}}`
	f := &config.File{
		Connections: map[string]config.Connection{"chat": {Webhooks: &config.Webhooks{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}}},
		Triggers: []config.Trigger{{ID: "mentions", Connection: "chat", Event: "chat.message.created",
			Filter: `event.payload.text != "bye"`, Document: json.RawMessage(doc)}},
	}
	server := chatServer{connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "chat.post"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "chat.reply"}},
	)}
	b := setupWith(t, nil, f, nil, map[string]connect.Provider{"chat": server})
	ctx := context.Background()
	if err := b.svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := b.svc.Emit(ctx, "chat", triggers.Event{Type: "chat.message.created", ID: "bad", Payload: map[string]any{"message": "bad", "text": "no thread"}}, triggers.Via{Kind: "api"})
	var ee *triggers.EventError
	if !errors.As(err, &ee) || ee.Problems[0].Path != "/payload" {
		t.Fatalf("a payload chat@1 refuses: %v", err)
	}
	// Per thread: a first message starts a turn; a second one, sent once
	// the turn listens, joins it (counted in the inbox's state); "bye"
	// ends the turn.
	for i, thread := range []string{"#a/m1", "#b/m9"} {
		first, second := message(thread+"-1", thread), message(thread+"-2", thread)
		emit(t, b, first)
		waitFor(t, "the turn of "+first.ID+" to listen", func() bool { return listening(t, b, first.ID, "next") })
		emit(t, b, second)
		waitFor(t, second.ID+" to join the turn", func() bool {
			n, _ := b.st.Client.HGet(ctx, b.st.Key("{in:chat}", "state"), "t:mentions:joined").Int()
			return n == i+1
		})
		// "bye" joins no turn (the trigger's filter leaves it out), so
		// the turn sees it only once its second wait listens.
		waitFor(t, "the turn of "+first.ID+" to listen for bye", func() bool { return listening(t, b, first.ID, "w") })
		bye := message(thread+"-bye", thread)
		bye.Payload.(map[string]any)["text"] = "bye"
		emit(t, b, bye)
		waitFor(t, "the turn on "+thread+" to end", func() bool {
			c := trigger(status(t, b), "mentions").Counts
			if c.Failed > 0 {
				for _, ex := range allExecutions(t, b.execs) {
					full, _ := b.execs.Get(context.Background(), ex.ID)
					t.Logf("%s %s %+v steps %+v", eventID(ex), full.Status, full.Error, full.Steps)
				}
				t.Fatalf("a turn failed: %+v", c)
			}
			return c.Succeeded == int64(2*(i+1))
		})
	}
	threads := map[string]string{}
	for _, ex := range allExecutions(t, b.execs) {
		if ex.Status != harness.ExecSucceeded {
			t.Errorf("%s: %s %+v", eventID(ex), ex.Status, ex.Error)
		}
		threads[eventID(ex)] = ex.Input.(map[string]any)["connection_event"].(map[string]any)["thread"].(string)
	}
	if len(threads) != 2 || threads["#a/m1-1"] != "#a/m1" || threads["#b/m9-1"] != "#b/m9" {
		t.Fatalf("turns by event and thread = %v, want one per thread, started by its first message (the second joined it)", threads)
	}
}

func emit(t *testing.T, b *bundle, ev triggers.Event) {
	t.Helper()
	if _, err := b.svc.Emit(context.Background(), "chat", ev, triggers.Via{Kind: "api"}); err != nil {
		t.Fatal(err)
	}
}

// listening reports whether the turn of event id has started its wait
// step (any wait when step is empty).
func listening(t *testing.T, b *bundle, id, step string) bool {
	for _, ex := range allExecutions(t, b.execs) {
		if eventID(ex) != id {
			continue
		}
		full, err := b.execs.Get(context.Background(), ex.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range full.Steps {
			if st.Cursor != "" && (step == "" || st.ID == step) {
				return true
			}
		}
	}
	return false
}
