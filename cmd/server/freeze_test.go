package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestFrozenRedisIs503WithinTheWait: a server process whose Redis freezes
// (connections stay open, nothing is answered) answers GET
// /v1/executions/{id} — several reads, each of which go-redis would retry
// after its read timeout — and the other reading routes with 503
// STORE_UNAVAILABLE and a Retry-After within store.RequestWait (and some
// slack), not after the sum of every read's timeouts and retries.
func TestFrozenRedisIs503WithinTheWait(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	proxy := storetest.NewFreezeProxy(t, mr.Addr())
	_, mcpSrv := newCounter()
	t.Cleanup(mcpSrv.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  counter: { mcp: { type: http, url: %q } }
allowlists:
  default: { connections: { counter: { ops: ["*"] } } }
`, mcpSrv.URL+"/mcp"))
	p := startProcess(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"REDIS_URL": "redis://" + proxy.Addr + "/0", "PATCHBAY_LOG_LEVEL": "warn",
	})
	doc := map[string]any{"workflow": map[string]any{
		"version": 1, "connections": map[string]any{"counter": map[string]any{}},
		"root": map[string]any{"kind": "call", "id": "one", "connection": "counter", "op": "effect", "args": map[string]any{"step": "one"}},
	}, "wait": "10s"}
	status, ex := call(t, "POST", p.url+"/v1/executions", "k1", doc)
	if status != http.StatusOK || ex["status"] != "succeeded" {
		t.Fatalf("POST = %d %v", status, ex)
	}
	id := ex["id"].(string)

	proxy.Freeze()
	bound := store.RequestWait + 2*time.Second
	for _, path := range []string{"/v1/executions/" + id, "/v1/executions", "/v1/executions/" + id + "/events", "/readyz"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			req, _ := http.NewRequest("GET", p.url+path, nil)
			req.Header.Set("Authorization", "Bearer k1")
			start := time.Now()
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
			d := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			t.Logf("%s: %d after %s", path, resp.StatusCode, d.Round(time.Millisecond))
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
				t.Errorf("status %d, Retry-After %q; want 503 with one", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			if d > bound {
				t.Errorf("answered after %s, want within %s\n%s", d, bound, p.out)
			}
		})
	}
}
