package triggers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

// threadTurn waits for the next message on its own thread: a turn sees
// the message that started it and, when the wait takes one, a second.
const threadTurn = `{"version":1,"connections":{"chat":{"events":["chat.message.created"]}},
	"root":{"kind":"wait","id":"next","connection":"chat","event":"chat.message.created",
		"filter":"$event.payload.thread == $input.connection_event.thread","timeoutMs":%d}}`

// replicaOn is one replica of a deployment over st: its own registry
// (the chat server), executions with workers workers, and trigger service.
func replicaOn(t *testing.T, st *store.Store, f *config.File, workers int) *bundle {
	t.Helper()
	reg := harness.NewRegistry(nil)
	server := chatServer{harness.NewMemory(
		harness.MemoryOp{Operation: harness.Operation{Name: "chat.post"}},
		harness.MemoryOp{Operation: harness.Operation{Name: "chat.reply"}},
	)}
	if err := reg.Add("chat", server); err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	execs := harness.NewExecutions(st, reg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, workers); close(done) }()
	svc, err := triggers.New(triggers.Options{Store: st, Executions: execs, Registry: reg, File: f})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close(); cancel(); <-done })
	if err := svc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &bundle{st: st, reg: reg, execs: execs, svc: svc}
}

// threadFile is the deployment of the thread tests: chat messages start
// or join turns that wait for the next message on their thread, by the
// trigger's thread expression or by chat@1's natural thread.
func threadFile(expression string, waitMs int) *config.File {
	return &config.File{
		Connections: map[string]config.Connection{"chat": {Webhooks: &config.Webhooks{Secrets: []string{"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}}},
		Triggers: []config.Trigger{{ID: "turns", Connection: "chat", Event: "chat.message.created", Thread: expression,
			Document: json.RawMessage(fmt.Sprintf(threadTurn, waitMs))}},
		Inbox: &config.Inbox{ReclaimAfter: time.Second},
	}
}

// TestOneTurnPerThread: two replicas over one store take messages on
// many threads, several per thread, sent while a turn waits, as it ends
// (in bursts: the wait takes one, the next lands as the turn finishes)
// and after it (past the wait's timeout). Every message must be seen by
// exactly one turn (the one it started, or the one whose wait took it),
// no thread may have two turns at once, and there must be as many turns
// as thread openings. Both with a trigger's thread expression and with a
// profile's natural thread.
func TestOneTurnPerThread(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, expression string }{
		{"thread expression", "event.payload.thread"},
		{"natural thread", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				t.Parallel()
				checkOneTurnPerThread(t, st, threadFile(tc.expression, 800))
			})
		})
	}
}

func checkOneTurnPerThread(t *testing.T, st *store.Store, f *config.File) {
	const threads, perThread = 12, 6
	replicas := []*bundle{replicaOn(t, st, f, 8), replicaOn(t, st, f, 8)}
	ctx := context.Background()

	// Each thread's messages: gaps of a burst (the next lands as the turn
	// that took the previous one ends), of a turn still waiting, or past
	// the wait's timeout (a closed thread).
	var wg sync.WaitGroup
	var sent []string
	var mu sync.Mutex
	for th := range threads {
		thread := fmt.Sprintf("#t%d", th)
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(th)))
		wg.Go(func() {
			for i := range perThread {
				ev := message(fmt.Sprintf("%s-%d", thread, i), thread)
				if _, err := replicas[rng.IntN(2)].svc.Emit(ctx, "chat", ev, triggers.Via{Kind: "api"}); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				sent = append(sent, ev.ID)
				mu.Unlock()
				switch rng.IntN(3) {
				case 0:
					time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
				case 1:
					time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond)
				default:
					time.Sleep(time.Duration(900+rng.IntN(300)) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()

	// Settled: every inbox entry done and every turn ended.
	var turns []*harness.Execution
	waitFor(t, "every message's turn to end", func() bool {
		s := status(t, replicas[0])
		if s.Inboxes[0].Depth != 0 {
			return false
		}
		turns = allExecutions(t, replicas[0].execs)
		for _, ex := range turns {
			if !ex.Status.Terminal() {
				return false
			}
		}
		return true
	})

	seenBy := map[string][]string{}
	byThread := map[string][]*harness.Execution{}
	for _, ex := range turns {
		full, err := replicas[0].execs.Get(ctx, ex.ID)
		if err != nil {
			t.Fatal(err)
		}
		seenBy[eventID(full)] = append(seenBy[eventID(full)], full.ID+" (started)")
		if out, ok := full.Output.(map[string]any); ok {
			if ev, ok := out["event"].(map[string]any); ok {
				seenBy[ev["id"].(string)] = append(seenBy[ev["id"].(string)], full.ID+" (its wait)")
			}
		}
		thread := full.Input.(map[string]any)["connection_event"].(map[string]any)["thread"].(string)
		byThread[thread] = append(byThread[thread], full)
	}
	for _, id := range sent {
		if n := len(seenBy[id]); n != 1 {
			t.Errorf("message %s seen by %d turns, want exactly one: %v", id, n, seenBy[id])
		}
	}
	for thread, exs := range byThread {
		slices.SortFunc(exs, func(a, b *harness.Execution) int { return a.CreatedAt.Compare(b.CreatedAt) })
		for i := 1; i < len(exs); i++ {
			if exs[i-1].FinishedAt == nil || exs[i-1].FinishedAt.After(exs[i].CreatedAt) {
				t.Errorf("thread %s: turn %s (ended %v) overlaps turn %s (created %v)", thread, exs[i-1].ID, exs[i-1].FinishedAt, exs[i].ID, exs[i].CreatedAt)
			}
		}
	}
	// As many turns as thread openings, and every thread closed.
	var opened int64
	for th := range threads {
		ts, err := replicas[0].execs.Thread(ctx, fmt.Sprintf("chat:#t%d", th))
		if err != nil {
			t.Fatal(err)
		}
		if ts.Turn != "" || ts.Pending != 0 {
			t.Errorf("thread #t%d left open: %+v", th, ts)
		}
		opened += ts.Opened
	}
	if opened != int64(len(turns)) {
		t.Errorf("%d turns for %d thread openings", len(turns), opened)
	}
	t.Logf("%d messages on %d threads: %d turns", len(sent), threads, len(turns))
}
