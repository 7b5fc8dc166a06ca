package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// counter is an MCP server whose "effect" tool acts once per idempotency
// key: a repeated key gets the original outcome back, as a server that
// honours patchbay's keys does. It counts sends and effects per key.
type counter struct {
	mu      sync.Mutex
	sends   map[string]int
	effects map[string]int
	results map[string]*mcp.CallToolResult
}

func newCounter() (*counter, *httptest.Server) { return newCounterDelay(20 * time.Millisecond) }

// newCounterDelay is newCounter whose calls take up to maxDelay (0: answer
// at once, what a benchmark of the engine's own cost wants).
func newCounterDelay(maxDelay time.Duration) (*counter, *httptest.Server) {
	c := &counter{sends: map[string]int{}, effects: map[string]int{}, results: map[string]*mcp.CallToolResult{}}
	s := server.NewMCPServer("counter", "1.0.0", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("effect", mcp.WithString("step", mcp.Required())), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		key, _ := req.Params.Meta.GetMetaField("io.patchbay/idempotency-key").(string)
		// A little latency widens the window in which a kill lands
		// between the call and its ledger entry.
		if maxDelay > 0 {
			time.Sleep(rand.N(maxDelay).Truncate(time.Millisecond))
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.sends[key]++
		if res, ok := c.results[key]; ok {
			return res, nil
		}
		c.effects[key]++
		res := mcp.NewToolResultStructured(map[string]any{"step": req.GetString("step", ""), "effect": len(c.effects)}, "done")
		c.results[key] = res
		return res, nil
	})
	return c, httptest.NewServer(server.NewStreamableHTTPServer(s))
}

// TestKillNineExactlyOnceEffects runs 100 three-step executions on two
// server processes sharing one Redis while one or the other is killed
// with SIGKILL (and restarted) every few hundred milliseconds, up to 15
// times. Every execution must finish with the right output, and every
// step's effect must have happened exactly once, however often a call was
// re-sent. Submissions are retried under an Idempotency-Key, so each
// starts exactly one execution however its answers are lost to the kills.
// Every execution must be listed, none left queued without a work item,
// and the time a killed runner's executions stalled before another
// replica took them over (at the default claim timeout) is reported.
func TestKillNineExactlyOnceEffects(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") shared by two processes")
	}
	st := storetest.New(t)
	count, mcpSrv := newCounter()
	t.Cleanup(mcpSrv.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  counter: { mcp: { type: http, url: %q } }
allowlists:
  default: { connections: { counter: { ops: ["*"] } } }
`, mcpSrv.URL+"/mcp"))
	// The default claim timeout: its takeover latency is what is reported.
	replicas := newReplicas(t, 2, serverBin, storetest.URL(t), st.Prefix, cfg, "kill-key", "PATCHBAY_WORKERS=4")
	startAll(t, replicas)

	const executions = 100
	doc := map[string]any{"workflow": map[string]any{
		"version": 1, "connections": map[string]any{"counter": map[string]any{}},
		"root": map[string]any{"kind": "sequence", "id": "m", "steps": []any{
			map[string]any{"effect": map[string]any{"step": "one"}},
			map[string]any{"effect": map[string]any{"step": "two"}},
			map[string]any{"kind": "call", "id": "three", "connection": "counter", "op": "effect", "args": map[string]any{"step": map[string]any{"$expr": "$steps['@/root/steps/1'].step + '-three'"}}},
		}},
	}}
	body, _ := json.Marshal(doc)

	// The killer: SIGKILL one replica, restart it, repeat, up to maxKills
	// times. The bound on a takeover below is one claim timeout per kill:
	// a second kill landing on the replica about to take an execution over
	// stalls it a second timeout, and the more kills, the likelier that is
	// (a run of 30 kills once saw a 20 s takeover).
	const maxKills = 15
	stop := make(chan struct{})
	var kills atomic.Int32
	var killer sync.WaitGroup
	killer.Go(func() {
		for kills.Load() < maxKills {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(150+rand.IntN(250)) * time.Millisecond):
			}
			r := replicas[rand.IntN(len(replicas))]
			r.kill()
			kills.Add(1)
			if err := r.start(); err != nil {
				t.Error(err)
				return
			}
		}
	})

	// Each submission is retried, under its Idempotency-Key, until it is
	// answered: a replica killed after it accepted one but before it
	// answered must not start a second execution.
	ids := make([]string, 0, executions)
	for len(ids) < executions {
		r := replicas[rand.IntN(len(replicas))]
		status, ex := post2(r.addr, "kill-key", body, "Idempotency-Key", fmt.Sprintf("kill-%d", len(ids)))
		if status != http.StatusAccepted {
			time.Sleep(20 * time.Millisecond) // down, or the key still in flight (409); try again
			continue
		}
		ids = append(ids, ex["id"].(string))
	}
	// Keep killing while the work drains, then let it finish.
	time.Sleep(3 * time.Second)
	close(stop)
	killer.Wait()

	start := time.Now()
	pending := map[string]bool{}
	for _, id := range ids {
		pending[id] = true
	}
	for len(pending) > 0 && time.Since(start) < 90*time.Second {
		for id := range pending {
			status, ex := get2(replicas[0].addr, "kill-key", "/v1/executions/"+id)
			if status != 200 {
				continue
			}
			switch ex["status"] {
			case "succeeded":
				out, _ := ex["output"].(map[string]any)
				if out["step"] != "two-three" {
					t.Errorf("%s output = %v", id, ex["output"])
				}
				delete(pending, id)
			case "failed", "cancelled":
				t.Errorf("%s ended %s: %v", id, ex["status"], ex["error"])
				delete(pending, id)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(pending) > 0 {
		for id := range pending {
			_, ex := get2(replicas[0].addr, "kill-key", "/v1/executions/"+id)
			t.Logf("unfinished %s: status %v, steps %v", id, ex["status"], ex["steps"])
		}
		logs, _ := os.ReadFile(replicas[0].logPath)
		t.Fatalf("%d executions not finished after 90s; replica 0 log:\n%s", len(pending), logs)
	}

	ctx := context.Background()
	unlisted, orphaned := checkListedAndQueued(t, ctx, st.Client, st.Prefix, replicas[0].addr, "kill-key")
	lat := takeoverLatencies(t, ctx, st.Client, st.Prefix, ids)
	med, worst := medianMax(lat)
	t.Logf("takeover latency at the default claim timeout (%s): median %s, max %s over %d takeovers; %d unlisted, %d queued without a work item",
		config.DefaultClaimTimeout, med, worst, len(lat), unlisted, orphaned)
	// A takeover waits for the dead runner's claim to lapse (at most one
	// timeout) and for a worker to look (a second), plus a step's latency.
	if limit := config.DefaultClaimTimeout + 3*time.Second; worst > limit {
		t.Errorf("a takeover took %s, want within %s", worst, limit)
	}

	count.mu.Lock()
	defer count.mu.Unlock()
	if n := len(allRecords(t, ctx, st.Client, st.Prefix)); n != executions {
		t.Errorf("%d executions stored for %d submissions, want one each", n, executions)
	}
	resent := 0
	for _, id := range ids {
		for _, key := range []string{id + ":@/root/steps/0", id + ":@/root/steps/1", id + ":three"} {
			if n := count.effects[key]; n != 1 {
				t.Errorf("effect of %s happened %d times, want exactly once", key, n)
			}
			if count.sends[key] > 1 {
				resent++
			}
		}
	}
	t.Logf("%d executions, %d kills, %d effects, %d calls re-sent after a kill (the server answered them from its idempotency record), %s to drain",
		len(ids), kills.Load(), len(count.effects), resent, time.Since(start).Round(time.Millisecond))
}

// post2 submits body with API key key; headers are name, value pairs.
func post2(addr, key string, body []byte, headers ...string) (int, map[string]any) {
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/executions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return do2(req)
}

func get2(addr, key, path string) (int, map[string]any) {
	req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	return do2(req)
}

func do2(req *http.Request) (int, map[string]any) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}
