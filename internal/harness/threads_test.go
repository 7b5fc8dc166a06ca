package harness_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// threadDoc waits for a deploy.done event that passes filter.
func threadDoc(filter string, timeoutMs int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"version":1,"connections":{"app":{"events":["deploy.done"]}},
		"root":{"kind":"wait","id":"w","connection":"app","event":"deploy.done","filter":%q,"timeoutMs":%d}}`, filter, timeoutMs))
}

// onThread is the inbox entry of trigger "t" for event id on thread.
func onThread(thread, id string, doc json.RawMessage) harness.ThreadEvent {
	return harness.ThreadEvent{
		Thread: "app:" + thread, Trigger: "t", Workflow: doc,
		Event: harness.ConnEvent{Connection: "app", Type: "deploy.done", ID: id, ReceivedAt: time.Now().UTC()},
	}
}

// submitOnThread starts or joins the turn of ev's thread.
func submitOnThread(t *testing.T, execs *harness.Executions, ev harness.ThreadEvent) harness.Turn {
	t.Helper()
	turn, err := execs.SubmitOnThread(context.Background(), ev)
	must(t, err)
	return turn
}

func finished(t *testing.T, execs *harness.Executions, id string) *harness.Execution {
	t.Helper()
	ex, err := execs.Wait(context.Background(), id, 10*time.Second)
	must(t, err)
	if !ex.Status.Terminal() {
		t.Fatalf("%s still %s", id, ex.Status)
	}
	return ex
}

func took(ex *harness.Execution) string {
	out, _ := ex.Output.(map[string]any)
	ev, _ := out["event"].(map[string]any)
	id, _ := ev["id"].(string)
	return id
}

func threadState(t *testing.T, execs *harness.Executions, thread string) harness.ThreadState {
	t.Helper()
	ts, err := execs.Thread(context.Background(), "app:"+thread)
	must(t, err)
	return ts
}

// TestOneTurnPerThreadAtATime: an event on a thread starts a turn when
// none is open and joins the open one otherwise, decided once; a wait of
// the turn takes the events that joined it (even before it listened) and
// those of the log not decided for another turn (which then join it, so
// their entries start nothing); an event that joined and that no wait
// took starts the next turn when the turn ends, the later ones joining
// that one.
func TestOneTurnPerThreadAtATime(t *testing.T) {
	t.Parallel()
	execs := setupWait(t)
	ctx := context.Background()
	tests := []struct {
		name string
		run  func(t *testing.T, thread string)
	}{
		{"an event that joined before the wait listened is taken from the thread", func(t *testing.T, thread string) {
			doc := threadDoc("$event.id == 'b'", 5000)
			first := submitOnThread(t, execs, onThread(thread, "a", doc))
			if !first.Started || !first.Created {
				t.Fatalf("first event: %+v, want started and created", first)
			}
			// Never in the log: only the thread has it.
			second := submitOnThread(t, execs, onThread(thread, "b", doc))
			if second.Started || second.ID != first.ID {
				t.Fatalf("second event: %+v, want joined to %s", second, first.ID)
			}
			if ex := finished(t, execs, first.ID); ex.Status != harness.ExecSucceeded || took(ex) != "b" {
				t.Fatalf("turn: %s %+v, took %q; want the joined event", ex.Status, ex.Error, took(ex))
			}
			if again := submitOnThread(t, execs, onThread(thread, "b", doc)); again != (harness.Turn{ID: first.ID}) {
				t.Fatalf("the joined event again: %+v", again)
			}
			if ts := threadState(t, execs, thread); ts != (harness.ThreadState{Opened: 1}) {
				t.Fatalf("thread = %+v, want closed after one turn", ts)
			}
		}},
		{"an event the wait took from the log before its entry joins that turn", func(t *testing.T, thread string) {
			doc := threadDoc("$event.id == '"+thread+"-b'", 5000)
			first := submitOnThread(t, execs, onThread(thread, thread+"-a", doc))
			waitListening(t, execs, first.ID)
			must(t, execs.AppendEvent(ctx, onThread(thread, thread+"-b", doc).Event))
			if ex := finished(t, execs, first.ID); ex.Status != harness.ExecSucceeded || took(ex) != thread+"-b" {
				t.Fatalf("turn: %s %+v, took %q", ex.Status, ex.Error, took(ex))
			}
			if late := submitOnThread(t, execs, onThread(thread, thread+"-b", doc)); late != (harness.Turn{ID: first.ID}) {
				t.Fatalf("the taken event's entry: %+v, want joined to the turn that took it", late)
			}
			if ts := threadState(t, execs, thread); ts != (harness.ThreadState{Opened: 1}) {
				t.Fatalf("thread = %+v, want closed after one turn", ts)
			}
		}},
		{"events that joined and were not taken start the next turn", func(t *testing.T, thread string) {
			doc := threadDoc("$event.id == '"+thread+"-go'", 600)
			first := submitOnThread(t, execs, onThread(thread, "a", doc))
			for _, id := range []string{"b", "c"} {
				if j := submitOnThread(t, execs, onThread(thread, id, doc)); j.Started || j.ID != first.ID {
					t.Fatalf("%s: %+v, want joined", id, j)
				}
			}
			waitListening(t, execs, first.ID)
			must(t, execs.AppendEvent(ctx, onThread(thread, thread+"-go", doc).Event))
			if ex := finished(t, execs, first.ID); ex.Status != harness.ExecSucceeded {
				t.Fatalf("turn: %s %+v", ex.Status, ex.Error)
			}
			ts := threadState(t, execs, thread)
			if ts.Turn == "" || ts.Turn == first.ID || ts.Opened != 2 || ts.Pending != 1 {
				t.Fatalf("thread = %+v, want handed to a second turn with one event pending", ts)
			}
			b, err := execs.FollowThread(ctx, onThread(thread, "b", doc))
			must(t, err)
			if !b.Started || !b.Created || b.ID != ts.Turn {
				t.Fatalf("b after the turn: %+v, want to start %s", b, ts.Turn)
			}
			c, err := execs.FollowThread(ctx, onThread(thread, "c", doc))
			must(t, err)
			if c != (harness.Turn{ID: b.ID}) {
				t.Fatalf("c after the turn: %+v, want joined to %s", c, b.ID)
			}
			// b's turn waits for a go event that does not come (c, pending,
			// does not match) and times out; c, never taken, starts a third.
			if ex := finished(t, execs, b.ID); ex.Status != harness.ExecFailed {
				t.Fatalf("b's turn: %s, took %q", ex.Status, took(ex))
			}
			c, err = execs.FollowThread(ctx, onThread(thread, "c", doc))
			must(t, err)
			if !c.Started || !c.Created {
				t.Fatalf("c after b's turn: %+v", c)
			}
			finished(t, execs, c.ID)
			if ts := threadState(t, execs, thread); ts != (harness.ThreadState{Opened: 3}) {
				t.Fatalf("thread = %+v, want closed after three turns", ts)
			}
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, fmt.Sprintf("chat-%d", i))
		})
	}
}

// TestEndTurnOnItsOwn: the close the inbox runs (and Redis Cluster runs
// after a turn's final save) hands the thread on like the final save, runs
// any number of times, and AbandonTurn lets go of a turn whose record its
// starting entry never wrote.
func TestEndTurnOnItsOwn(t *testing.T) {
	t.Parallel()
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("app", connecttest.NewMemory()))
	must(t, reg.Start(context.Background()))
	execs := harness.NewExecutions(storetest.New(t), reg, nil) // no workers: turns stay queued
	ctx := context.Background()
	doc := threadDoc("true", 1000)
	const thread = "chat-1"

	first := submitOnThread(t, execs, onThread(thread, "a", doc))
	for _, id := range []string{"b", "c"} {
		submitOnThread(t, execs, onThread(thread, id, doc))
	}
	must(t, execs.EndTurn(ctx, "app:"+thread, first.ID))
	second := threadState(t, execs, thread)
	if second.Turn == "" || second.Turn == first.ID || second.Opened != 2 || second.Pending != 1 {
		t.Fatalf("after EndTurn: %+v", second)
	}
	must(t, execs.EndTurn(ctx, "app:"+thread, first.ID))
	if again := threadState(t, execs, thread); again != second {
		t.Fatalf("EndTurn again changed the thread: %+v, was %+v", again, second)
	}
	// b, which starts the second turn, is dead-lettered before writing it.
	must(t, execs.AbandonTurn(ctx, "app:"+thread, "c", "t")) // c only joined: nothing to do
	if ts := threadState(t, execs, thread); ts != second {
		t.Fatalf("abandoning a joined event changed the thread: %+v", ts)
	}
	must(t, execs.AbandonTurn(ctx, "app:"+thread, "b", "t"))
	third := threadState(t, execs, thread)
	if third.Turn == "" || third.Turn == second.Turn || third.Opened != 3 || third.Pending != 0 {
		t.Fatalf("after abandoning b: %+v", third)
	}
	c, err := execs.FollowThread(ctx, onThread(thread, "c", doc))
	must(t, err)
	if !c.Started || !c.Created || c.ID != third.Turn {
		t.Fatalf("c: %+v, want to start %s", c, third.Turn)
	}
	// A written turn is not abandoned: its run ends it.
	must(t, execs.AbandonTurn(ctx, "app:"+thread, "c", "t"))
	if ts := threadState(t, execs, thread); ts != third {
		t.Fatalf("abandoning a written turn changed the thread: %+v", ts)
	}
}

// waitListening waits until the execution's wait has its cursor.
func waitListening(t *testing.T, execs *harness.Executions, id string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ex, _ := execs.Get(context.Background(), id); ex != nil && len(ex.Steps) > 0 && ex.Steps[0].Cursor != "" {
			return
		}
	}
	t.Fatalf("%s never listened", id)
}
