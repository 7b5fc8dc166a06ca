package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// turnRecord is what the thread test reads of a stored turn.
type turnRecord struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Input  struct {
		Event struct {
			ID     string `json:"id"`
			Thread string `json:"thread"`
		} `json:"connection_event"`
	} `json:"input"`
	Output struct {
		Event struct {
			ID string `json:"id"`
		} `json:"event"`
	} `json:"output"`
	CreatedAt  time.Time  `json:"createdAt"`
	FinishedAt *time.Time `json:"finishedAt"`
}

// TestOneTurnPerThreadAcrossKills: two server processes on one Redis take
// messages on ten threads as signed webhooks (spread over both, the sender
// retrying like a real one), six per thread, spaced so they arrive while
// a turn waits for the next message on its thread, as it ends and after
// it, while one process is killed with SIGKILL mid-way (and restarted).
// Every message must be seen by exactly one turn (the one it started, or
// the one whose wait took it), no thread may have two turns at once, and
// there must be as many turns as thread openings, every thread closed.
func TestOneTurnPerThreadAcrossKills(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") shared by two processes")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	st := storetest.New(t)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  chat:
    source: { events: { message: { type: object, required: [thread], properties: { thread: { type: string } } } } }
    webhooks: { secrets: [%q] }
triggers:
  - id: turns
    connection: chat
    event: message
    thread: event.payload.thread
    workflow:
      version: 1
      connections: { chat: { events: [message] } }
      root: { kind: wait, id: next, connection: chat, event: message, timeoutMs: 2500,
              filter: "$event.payload.thread == $input.connection_event.thread" }
inbox: { reclaimAfter: 2s, maxDeliveries: 50 }
`, crashSecret))
	replicas := newReplicas(t, 2, serverBin, storetest.URL(t), st.Prefix, cfg, "threads-key", "PATCHBAY_WORKERS=12", "PATCHBAY_CLAIM_TIMEOUT=2s")
	startAll(t, replicas)

	wh, err := standardwebhooks.NewWebhook(crashSecret)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	send := func(id, thread string, rng *rand.Rand) {
		body := []byte(fmt.Sprintf(`{"type":"message","id":%q,"payload":{"thread":%q}}`, id, thread))
		for attempt := 0; ; attempt++ {
			now := time.Now()
			sig, _ := wh.Sign(id, now, body)
			req, _ := http.NewRequest("POST", "http://"+replicas[rng.IntN(2)].addr+"/hooks/chat", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("webhook-id", id)
			req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
			req.Header.Set("webhook-signature", sig)
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 204 || resp.StatusCode == 200 {
					return
				}
				if resp.StatusCode < 500 {
					t.Errorf("message %s: answer %d", id, resp.StatusCode)
					return
				}
			}
			time.Sleep(50 * time.Millisecond) // down (killed): try again
		}
	}

	const threads, perThread = 10, 6
	var sent []string
	var mu sync.Mutex
	var senders sync.WaitGroup
	start := time.Now()
	for th := range threads {
		thread := fmt.Sprintf("#t%d", th)
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(th)))
		senders.Go(func() {
			for i := range perThread {
				id := fmt.Sprintf("%s-%d", thread, i)
				send(id, thread, rng)
				mu.Lock()
				sent = append(sent, id)
				mu.Unlock()
				switch rng.IntN(3) {
				case 0: // as the turn that took the last one ends
					time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
				case 1: // while a turn waits
					time.Sleep(time.Duration(50+rng.IntN(500)) * time.Millisecond)
				default: // after the wait's timeout: the thread closed
					time.Sleep(time.Duration(2600+rng.IntN(400)) * time.Millisecond)
				}
			}
		})
	}
	// One process killed mid-way, while messages come and turns run.
	time.Sleep(time.Duration(1500+rand.IntN(1500)) * time.Millisecond)
	victim := replicas[rand.IntN(2)]
	victim.kill()
	killedAt := time.Since(start)
	if err := victim.start(); err != nil {
		t.Fatal(err)
	}
	senders.Wait()

	// Settled: every inbox entry done (and deleted), every turn ended.
	ctx := context.Background()
	var turns []turnRecord
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		depth, err := st.Client.XLen(ctx, st.Key("{in:chat}", "stream")).Result()
		if err != nil {
			t.Fatal(err)
		}
		turns = records(t, ctx, st.Client, st.Prefix, func(turnRecord) bool { return true })
		open := slices.IndexFunc(turns, func(r turnRecord) bool { return r.Status != "succeeded" && r.Status != "failed" })
		if depth == 0 && open < 0 {
			break
		}
		if time.Now().After(deadline) {
			logs, _ := os.ReadFile(replicas[0].logPath)
			t.Fatalf("not settled after 60 s: %d inbox entries left, turn %d of %d open; replica 0 log:\n%s", depth, open, len(turns), logs)
		}
	}

	seenBy := map[string][]string{}
	byThread := map[string][]turnRecord{}
	for _, r := range turns {
		seenBy[r.Input.Event.ID] = append(seenBy[r.Input.Event.ID], r.ID+" (started)")
		if id := r.Output.Event.ID; id != "" {
			seenBy[id] = append(seenBy[id], r.ID+" (its wait)")
		}
		byThread[r.Input.Event.Thread] = append(byThread[r.Input.Event.Thread], r)
	}
	for _, id := range sent {
		if n := len(seenBy[id]); n != 1 {
			t.Errorf("message %s seen by %d turns, want exactly one: %v", id, n, seenBy[id])
		}
	}
	for thread, rs := range byThread {
		slices.SortFunc(rs, func(a, b turnRecord) int { return a.CreatedAt.Compare(b.CreatedAt) })
		for i := 1; i < len(rs); i++ {
			if rs[i-1].FinishedAt == nil || rs[i-1].FinishedAt.After(rs[i].CreatedAt) {
				t.Errorf("thread %s: turn %s (ended %v) overlaps turn %s (created %v)", thread, rs[i-1].ID, rs[i-1].FinishedAt, rs[i].ID, rs[i].CreatedAt)
			}
		}
	}
	opened, left := threadOpenings(t, ctx, st.Client, st.Prefix)
	if opened != len(turns) || left > 0 {
		t.Errorf("%d turns for %d thread openings; %d threads left open", len(turns), opened, left)
	}
	failed := 0
	for _, r := range turns {
		if r.Status == "failed" {
			failed++
		}
	}
	t.Logf("%d messages on %d threads, one replica killed at %s: %d turns (%d ended by their wait's timeout), settled %s after the start",
		len(sent), threads, killedAt.Round(time.Millisecond), len(turns), failed, time.Since(start).Round(time.Millisecond))
}

// threadOpenings sums the turns started on every thread under prefix and
// counts the threads still open.
func threadOpenings(t *testing.T, ctx context.Context, c redis.UniversalClient, prefix string) (opened, open int) {
	t.Helper()
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, prefix+"{th:*}:state", 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			state, err := c.HGetAll(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			n, _ := strconv.Atoi(state["opened"])
			opened += n
			if state["turn"] != "" {
				open++
			}
		}
		if next == 0 {
			return opened, open
		}
		cursor = next
	}
}
