package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// clusterWindow bounds the 503s after the promotion: the goal is 2 s,
// with slack for a loaded machine.
const clusterWindow = 3 * time.Second

// refusal is one 503 the submitter got.
type refusal struct {
	at         time.Time
	code       string
	retryAfter string
}

// TestClusterFailoverUnderLoad: two server processes on a real Redis
// Cluster (three masters with a replica each, cluster-node-timeout 2 s)
// take submissions from four clients that retry on 503 every 100 ms, under
// an Idempotency-Key, while an execution whose record is on one master is
// read every 50 ms from both; that master, which also holds the work
// stream, is killed with SIGKILL mid-load. Every accepted execution must
// succeed, each step's effect once, and be listed; the 503s after the
// replica's promotion must stop within clusterWindow, each with a
// Retry-After. The window is logged.
func TestClusterFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	cluster := storetest.StartCluster(t)
	prefix := storetest.Prefix()
	st, err := store.Open(t.Context(), cluster.URL(), prefix, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	count, mcpSrv := newCounter()
	t.Cleanup(mcpSrv.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  counter: { mcp: { type: http, url: %q } }
allowlists:
  default: { connections: { counter: { ops: ["*"] } } }
`, mcpSrv.URL+"/mcp"))
	replicas := newReplicas(t, 2, serverBin, cluster.URL(), prefix, cfg, "cluster-key", "PATCHBAY_CLAIM_TIMEOUT=2s")
	startAll(t, replicas)
	// The master of the work stream: every submission and every worker
	// needs it.
	master, promoted := cluster.MasterOf(t, prefix+"work")

	body, _ := json.Marshal(map[string]any{"workflow": map[string]any{
		"version": 1, "connections": map[string]any{"counter": map[string]any{}},
		"root": map[string]any{"kind": "sequence", "id": "m", "steps": []any{
			map[string]any{"effect": map[string]any{"step": "one"}},
			map[string]any{"effect": map[string]any{"step": "two"}},
		}},
	}})
	var (
		mu       sync.Mutex
		ids      []string
		refusals []refusal
		inFlight []time.Time // 409 IDEMPOTENCY_KEY_IN_USE answers
		promoAt  time.Time
	)
	stop := make(chan struct{})
	// Four submitters each send one execution after another, each retried
	// under its key every 100 ms until accepted; stopped, each still sees
	// its last one through (its key may be held in flight for a while
	// after a failed attempt).
	const submitters = 4
	var load sync.WaitGroup
	for w := range submitters {
		load.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("cluster-%d-%d", w, i)
				if !submitOnce(t, replicas[(w+i)%2].addr, body, key, func(status int, ex map[string]any, h http.Header) {
					mu.Lock()
					defer mu.Unlock()
					switch status {
					case http.StatusAccepted:
						ids = append(ids, ex["id"].(string))
					case http.StatusServiceUnavailable:
						code, _ := ex["code"].(string)
						refusals = append(refusals, refusal{at: time.Now(), code: code, retryAfter: h.Get("Retry-After")})
					case http.StatusConflict:
						inFlight = append(inFlight, time.Now())
					}
				}) {
					return
				}
			}
		})
	}

	accepted := func() int { mu.Lock(); defer mu.Unlock(); return len(ids) }
	waitUntil(t, "ten accepted submissions", func() bool { return accepted() >= 10 })
	// Submissions stall on their keys' in-flight locks for a while after
	// the failover (see below), so the reads of an execution whose record
	// is on the killed master probe the window too, from both processes.
	var probed string
	for i := 0; probed == ""; i++ {
		waitUntil(t, "more accepted submissions", func() bool { return accepted() > i })
		mu.Lock()
		id := ids[i]
		mu.Unlock()
		if on, _ := cluster.MasterOf(t, prefix+"{exec:"+id+"}:record"); on == master {
			probed = id
		}
	}
	for _, r := range replicas {
		load.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				req, _ := http.NewRequest("GET", "http://"+r.addr+"/v1/executions/"+probed, nil)
				req.Header.Set("Authorization", "Bearer cluster-key")
				resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
				if err != nil {
					continue
				}
				var p map[string]any
				_ = json.NewDecoder(resp.Body).Decode(&p)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
				case http.StatusServiceUnavailable:
					code, _ := p["code"].(string)
					mu.Lock()
					refusals = append(refusals, refusal{at: time.Now(), code: code, retryAfter: resp.Header.Get("Retry-After")})
					mu.Unlock()
				default:
					t.Errorf("GET %s: %d %v", probed, resp.StatusCode, p)
					return
				}
			}
		})
	}
	killedAt := time.Now()
	master.Kill()
	promoAt = storetest.WaitMaster(t, promoted, 30*time.Second)
	if promoAt.IsZero() {
		close(stop)
		t.Fatal("the replica was not promoted")
	}
	// Keep submitting past the window, then stop.
	time.Sleep(clusterWindow + 2*time.Second)
	close(stop)
	load.Wait()

	mu.Lock()
	accepted0, refused, held := len(ids), slices.Clone(refusals), slices.Clone(inFlight)
	mu.Unlock()
	slices.SortFunc(refused, func(a, b refusal) int { return a.at.Compare(b.at) })
	var last time.Time
	for _, r := range refused {
		if r.code != "STORE_UNAVAILABLE" || r.retryAfter == "" {
			t.Errorf("a 503 with code %q and Retry-After %q, want STORE_UNAVAILABLE with one", r.code, r.retryAfter)
		}
		last = r.at
	}
	window := max(last.Sub(promoAt), 0)
	t.Logf("promotion %s after the kill; %d 503s, the last %s after the kill, %s after the promotion (Retry-After %s); %d accepted",
		promoAt.Sub(killedAt).Round(time.Millisecond), len(refused), last.Sub(killedAt).Round(time.Millisecond),
		window.Round(time.Millisecond), retryAfterOf(refused), accepted0)
	if len(held) > 0 {
		// A submission whose attempt failed with the master while its
		// key's in-flight lock was on that master cannot release the
		// lock: retries are told 409 until it lapses.
		t.Logf("%d answers 409 IDEMPOTENCY_KEY_IN_USE, the last %s after the kill", len(held), held[len(held)-1].Sub(killedAt).Round(time.Millisecond))
	}
	if window > clusterWindow {
		t.Errorf("503s went on %s after the promotion, want within %s", window, clusterWindow)
	}
	if len(refused) == 0 {
		t.Error("no 503 at all: the killed master was not in the way")
	}

	// Every accepted execution finishes, once.
	pending := map[string]bool{}
	for _, id := range ids {
		pending[id] = true
	}
	for deadline := time.Now().Add(40 * time.Second); len(pending) > 0 && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		for id := range pending {
			status, ex := get2(replicas[0].addr, "cluster-key", "/v1/executions/"+id)
			if status != http.StatusOK {
				continue
			}
			switch ex["status"] {
			case "succeeded":
				delete(pending, id)
			case "failed", "cancelled":
				t.Errorf("%s ended %s: %v", id, ex["status"], ex["error"])
				delete(pending, id)
			}
		}
	}
	if len(pending) > 0 {
		logs, _ := os.ReadFile(replicas[0].logPath)
		t.Fatalf("%d of %d executions not finished; replica 0 log:\n%s", len(pending), len(ids), logs)
	}
	ctx := context.Background()
	checkListedAndQueued(t, ctx, st.Client, prefix, replicas[0].addr, "cluster-key")
	if n := len(allRecords(t, ctx, st.Client, prefix)); n != len(ids) {
		t.Errorf("%d executions stored for %d accepted submissions", n, len(ids))
	}
	count.mu.Lock()
	defer count.mu.Unlock()
	for _, id := range ids {
		for _, step := range []string{"@/root/steps/0", "@/root/steps/1"} {
			if n := count.effects[id+":"+step]; n != 1 {
				t.Errorf("effect of %s:%s happened %d times, want once", id, step, n)
			}
		}
	}
}

// submitOnce posts body under key until it is accepted, retrying every
// 100 ms on a 503, a 409 (the key in flight) or no answer, for up to 30 s;
// seen gets every answer. It reports whether the submission was accepted.
func submitOnce(t *testing.T, addr string, body []byte, key string, seen func(int, map[string]any, http.Header)) bool {
	for giveUp := time.Now().Add(30 * time.Second); time.Now().Before(giveUp); time.Sleep(100 * time.Millisecond) {
		status, ex, h := postCluster(addr, body, key)
		seen(status, ex, h)
		switch status {
		case http.StatusAccepted:
			return true
		case http.StatusServiceUnavailable, http.StatusConflict, 0:
		default:
			t.Errorf("submission %s: %d %v", key, status, ex)
			return false
		}
	}
	t.Errorf("submission %s not accepted in 30 s", key)
	return false
}

// postCluster submits body under an Idempotency-Key and returns the
// status (0 when no answer came), the JSON answer and its headers.
func postCluster(addr string, body []byte, key string) (int, map[string]any, http.Header) {
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/executions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer cluster-key")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, nil
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m, resp.Header
}

// retryAfterOf lists the distinct Retry-After values of rs.
func retryAfterOf(rs []refusal) []string {
	var out []string
	for _, r := range rs {
		if !slices.Contains(out, r.retryAfter) {
			out = append(out, r.retryAfter)
		}
	}
	return out
}
