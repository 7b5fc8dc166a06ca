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
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

// threadTurn waits for the next message on its own thread, then works a
// little (so messages also arrive while the turn runs on past its wait): a
// turn sees the message that started it and, when the wait takes one, a
// second.
const threadTurn = `{"version":1,"connections":{"chat":{"events":["chat.message.created"]},"slow":{}},
	"root":{"kind":"sequence","id":"turn","steps":[
		{"kind":"wait","id":"next","connection":"chat","event":"chat.message.created",
			"filter":"$event.payload.thread == $input.connection_event.thread","timeoutMs":%d},
		{"kind":"call","id":"work","connection":"slow","op":"pause","args":{}}]}}`

// replicaOn is one replica of a deployment over st: its own registry
// (the chat server, and "slow" whose pause takes 100 ms), executions with workers workers, and trigger service.
func replicaOn(t *testing.T, st *store.Store, f *config.File, workers int) *bundle {
	t.Helper()
	reg := registry.NewRegistry(nil)
	server := chatServer{connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "chat.post"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "chat.reply"}},
	)}
	if err := reg.Add("chat", server); err != nil {
		t.Fatal(err)
	}
	pause := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "pause"}, Fn: func(ctx context.Context, _ map[string]any) (any, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
			return map[string]any{}, nil
		}
	}})
	if err := reg.Add("slow", pause); err != nil {
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

	// Seen: the turn's own message, and the one its wait took.
	seenBy := map[string][]triggers.EntryTurn{}
	byThread := map[string][]*harness.Execution{}
	for _, ex := range turns {
		full, err := replicas[0].execs.Get(ctx, ex.ID)
		if err != nil {
			t.Fatal(err)
		}
		seenBy[eventID(full)] = append(seenBy[eventID(full)], triggers.EntryTurn{Trigger: "turns", How: "started", Execution: full.ID})
		for _, st := range full.Steps {
			out, _ := st.Output.(map[string]any)
			if ev, ok := out["event"].(map[string]any); ok && st.Status == harness.StepDone {
				seenBy[ev["id"].(string)] = append(seenBy[ev["id"].(string)], triggers.EntryTurn{Trigger: "turns", How: "joined", Execution: full.ID})
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
	// Each entry says where its message went: the turn that saw it.
	recs, err := replicas[1].svc.Deliveries(ctx, "chat", len(sent))
	if err != nil || len(recs) != len(sent) {
		t.Fatalf("deliveries: %d, %v", len(recs), err)
	}
	joined := 0
	for _, r := range recs {
		if len(r.Turns) != 1 || len(seenBy[r.EventID]) != 1 || r.Turns[0] != seenBy[r.EventID][0] {
			t.Errorf("message %s: the inbox says %+v, seen by %+v", r.EventID, r.Turns, seenBy[r.EventID])
		}
		if len(r.Turns) == 1 && r.Turns[0].How == "joined" {
			joined++
		}
	}
	var handovers []time.Duration // a turn's end to the next one's start, for a message that joined it
	for thread, exs := range byThread {
		slices.SortFunc(exs, func(a, b *harness.Execution) int { return a.CreatedAt.Compare(b.CreatedAt) })
		for i := 1; i < len(exs); i++ {
			if exs[i-1].FinishedAt == nil || exs[i-1].FinishedAt.After(exs[i].CreatedAt) {
				t.Errorf("thread %s: turn %s (ended %v) overlaps turn %s (created %v)", thread, exs[i-1].ID, exs[i-1].FinishedAt, exs[i].ID, exs[i].CreatedAt)
				continue
			}
			ev := exs[i].Input.(map[string]any)["connection_event"].(map[string]any)
			if at, err := time.Parse(time.RFC3339Nano, ev["receivedAt"].(string)); err == nil && at.Before(*exs[i-1].FinishedAt) {
				handovers = append(handovers, exs[i].CreatedAt.Sub(*exs[i-1].FinishedAt))
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
	slices.Sort(handovers)
	var median, worst time.Duration
	if n := len(handovers); n > 0 {
		median, worst = handovers[n/2], handovers[n-1]
	}
	t.Logf("%d messages on %d threads: %d turns; %d messages taken by a running turn's wait, %d that arrived during a turn started the next (%s median, %s max after its end)",
		len(sent), threads, len(turns), joined, len(handovers), median.Round(time.Millisecond), worst.Round(time.Millisecond))
}

// TestDeadLetterShowsItsTurn: an entry on a thread that goes to the dead
// letters after it started a turn (its replica stopped; delivered more
// than MaxDeliveries times) says which turn it started. Stream idle times
// need the real server.
func TestDeadLetterShowsItsTurn(t *testing.T) {
	t.Parallel()
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + "): stream idle times")
	}
	st := storetest.New(t)
	f := threadFile("event.payload.thread", 2000)
	f.Inbox.MaxDeliveries = 1
	a := replicaOn(t, st, f, 2)
	ctx := context.Background()
	if _, err := a.svc.Emit(ctx, "chat", message("m1", "#d"), triggers.Via{Kind: "api"}); err != nil {
		t.Fatal(err)
	}
	var started string
	waitFor(t, "the entry's turn", func() bool {
		recs, err := a.svc.Deliveries(ctx, "chat", 1)
		if err != nil || len(recs) != 1 || len(recs[0].Turns) != 1 {
			return false
		}
		if et := recs[0].Turns[0]; et.Trigger == "turns" && et.How == "started" {
			started = et.Execution
		}
		return started != ""
	})
	a.svc.Close() // its entry stays pending, unrenewed
	b := replicaOn(t, st, f, 2)
	var dls []triggers.DeadLetter
	waitFor(t, "the dead letter", func() bool {
		var err error
		dls, err = b.svc.DeadLetters(ctx)
		return err == nil && len(dls) == 1
	})
	if dl := dls[0]; dl.Event.ID != "m1" || dl.Execution != started || dl.Turn != "started" {
		t.Fatalf("dead letter = %+v, want m1 having started %s", dl, started)
	}
}
