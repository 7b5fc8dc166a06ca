package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// holdServer is an MCP server whose "hold" tool blocks until the test lets
// go, so an execution can hold a lease while its process is killed.
type holdServer struct {
	holds   atomic.Int32
	mu      sync.Mutex
	release chan struct{}
}

func newHoldServer(t *testing.T) (*holdServer, string) {
	h := &holdServer{release: make(chan struct{})}
	s := server.NewMCPServer("hold", "1.0.0", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("hold"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		h.holds.Add(1)
		select {
		case <-h.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return mcp.NewToolResultStructured(map[string]any{"held": true}, "held"), nil
	})
	s.AddTool(mcp.NewTool("ping"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultStructured(map[string]any{"pong": true}, "pong"), nil
	})
	srv := httptest.NewServer(server.NewStreamableHTTPServer(s))
	t.Cleanup(func() { h.letGo(); srv.Close() })
	return h, srv.URL + "/mcp"
}

func (h *holdServer) letGo() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

// leaseReplicas makes two server processes on one Redis with a pool
// "slot" of one lease over the hold server, one worker each, and starts
// the first: the test starts the second once the first holds the lease,
// so it knows which process holds it.
func leaseReplicas(t *testing.T, st *store.Store, url string, env ...string) []*replica {
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  slot: { mcp: { type: http, url: %q }, pool: { max: 1, waitMs: 30000 } }
allowlists:
  default: { connections: { slot: { ops: ["*"] } } }
`, url))
	rs := newReplicas(t, 2, serverBin, storetest.URL(t), st.Prefix, cfg, "lease-key", append([]string{"PATCHBAY_LOG_LEVEL=info", "PATCHBAY_WORKERS=1"}, env...)...)
	if err := rs[0].start(); err != nil {
		t.Fatal(err)
	}
	return rs
}

func submitOn(t *testing.T, r *replica, op string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"workflow": map[string]any{
		"version": 1, "connections": map[string]any{"slot": map[string]any{}},
		"root": map[string]any{"kind": "call", "id": op, "connection": "slot", "op": op},
	}})
	status, ex := post2(r.addr, "lease-key", body)
	if status != 202 {
		t.Fatalf("submit %s on %s: %d %v", op, r.addr, status, ex)
	}
	return ex["id"].(string)
}

func statusOn(r *replica, id string) string {
	_, ex := get2(r.addr, "lease-key", "/v1/executions/"+id)
	s, _ := ex["status"].(string)
	return s
}

// poolOn is the pool usage the connection's status shows on r.
func poolOn(r *replica) map[string]any {
	_, c := get2(r.addr, "lease-key", "/v1/connections/slot")
	p, _ := c["pool"].(map[string]any)
	return p
}

func until(t *testing.T, what string, d time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(25 * time.Millisecond)
	}
	return time.Since(start)
}

// recordedLease reads the lease id the execution record holds.
func recordedLease(t *testing.T, st *store.Store, id string) string {
	t.Helper()
	data, err := st.Client.Get(context.Background(), st.Key("{exec:"+id+"}", "record")).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Leases []struct{ ID string } `json:"leases"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Leases) != 1 {
		return ""
	}
	return rec.Leases[0].ID
}

// TestKilledHolderLeaseIsReclaimed: a process holding the only lease is
// killed with SIGKILL; the lease is reclaimed after the window (2s here)
// and the execution waiting for it in the other process is served.
func TestKilledHolderLeaseIsReclaimed(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") shared by two processes")
	}
	t.Parallel()
	st := storetest.New(t)
	hold, url := newHoldServer(t)
	rs := leaseReplicas(t, st, url, "PATCHBAY_POOL_RECLAIM_AFTER=2s", "PATCHBAY_CLAIM_TIMEOUT=60s")
	holder := submitOn(t, rs[0], "hold")
	until(t, "the holder's call", 15*time.Second, func() bool { return hold.holds.Load() == 1 })
	if err := rs[1].start(); err != nil {
		t.Fatal(err)
	}
	// rs[0]'s only worker is busy, so rs[1] runs the waiter.
	waiter := submitOn(t, rs[1], "ping")
	until(t, "the waiter to wait for the lease", 15*time.Second, func() bool { return statusOn(rs[1], waiter) == "waiting" })
	// Status shows usage as last read (at most a second old).
	until(t, "status to show the lease and the waiter", 5*time.Second, func() bool {
		p := poolOn(rs[1])
		leases, _ := p["leases"].([]any)
		return p["leased"] == 1.0 && p["queued"] == 1.0 && len(leases) == 1 && leases[0].(map[string]any)["holder"] == holder+"/slot"
	})

	rs[0].kill()
	took := until(t, "the waiter to be served", 20*time.Second, func() bool {
		s := statusOn(rs[1], waiter)
		if s == "failed" {
			_, ex := get2(rs[1].addr, "lease-key", "/v1/executions/"+waiter)
			logs, _ := os.ReadFile(rs[1].logPath)
			t.Fatalf("waiter failed: %v\n%s", ex["error"], logs)
		}
		return s == "succeeded"
	})
	if took < time.Second {
		t.Errorf("served %s after the kill: before the reclaim window could pass", took)
	}
	if s := statusOn(rs[1], holder); s != "running" {
		t.Errorf("holder status = %s (its claim has not timed out yet)", s)
	}
	t.Logf("waiter served %s after SIGKILL of the holder (window 2s)", took.Round(time.Millisecond))
}

// TestRestartWithinWindowKeepsLease: the holder's process is killed and
// restarted; the run taken over within the reclaim window (30s here)
// continues on the same lease.
func TestRestartWithinWindowKeepsLease(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") shared by two processes")
	}
	t.Parallel()
	st := storetest.New(t)
	hold, url := newHoldServer(t)
	rs := leaseReplicas(t, st, url, "PATCHBAY_POOL_RECLAIM_AFTER=30s", "PATCHBAY_CLAIM_TIMEOUT=2s")
	id := submitOn(t, rs[0], "hold")
	until(t, "the holder's call", 15*time.Second, func() bool { return hold.holds.Load() == 1 })
	lease := recordedLease(t, st, id)
	if lease == "" {
		t.Fatal("no lease in the execution record")
	}
	if err := rs[1].start(); err != nil {
		t.Fatal(err)
	}

	rs[0].kill()
	if err := rs[0].start(); err != nil {
		t.Fatal(err)
	}
	// The run is taken over once its claim times out and re-sends hold.
	until(t, "the run to be taken over", 30*time.Second, func() bool { return hold.holds.Load() >= 2 })
	if got := recordedLease(t, st, id); got != lease {
		t.Fatalf("lease after the restart = %q, want the same lease %q", got, lease)
	}
	until(t, "status to show the lease", 5*time.Second, func() bool { return poolOn(rs[1])["leased"] == 1.0 })
	hold.letGo()
	until(t, "the execution to finish", 20*time.Second, func() bool { return statusOn(rs[1], id) == "succeeded" })
	until(t, "the lease to go back", 10*time.Second, func() bool { p := poolOn(rs[1]); return p["leased"] == 0.0 })
}
