package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// playwrightMCP is the @playwright/mcp release the browser pool test runs,
// pinned so a new release cannot change a result without a commit.
const playwrightMCP = "@playwright/mcp@0.0.83"

// markedProcs lists the processes whose environment holds marker, with
// their command names ("node", "chromium", …).
func markedProcs(marker string) map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !strings.Contains(string(env), marker) {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		out[pid] = strings.TrimSpace(string(comm))
	}
	return out
}

// playwrightParts returns node, the pinned @playwright/mcp's cli.js and
// Debian's chromium, or fails (CI) or skips the test.
func playwrightParts(t *testing.T) (node, cli, chromium string) {
	t.Helper()
	chromium = "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		npmtest.Missing(t, "%s is missing: %v", chromium, err)
	}
	return npmtest.Node(t), filepath.Join(npmtest.Require(t, "playwright", playwrightMCP), "cli.js"), chromium
}

// TestBrowserPool runs an execution with two parallel paths, each with a
// fresh browser (a @playwright/mcp server driving Debian's chromium) from
// a pool; each navigates to its own page served on loopback and reads it.
// Both browsers must be gone at the end.
func TestBrowserPool(t *testing.T) {
	t.Parallel()
	node, cli, chromium := playwrightParts(t)

	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, "<!doctype html><title>%s page</title><h1>Hello from %s</h1><p id=code>code-%s-42</p>", name, name, name)
	}))
	t.Cleanup(page.Close)

	// Every process the pool starts inherits the marker, so the test can
	// find the browsers (and their children) and check they are gone.
	marker := "PB_POOL_TEST=" + rand.Text()
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  browsers:
    mcp:
      command: %q
      args: [%q, --browser, chromium, --executable-path, %q, --headless, --isolated, --no-sandbox, --output-dir, %q, "--viewport-size=${setup.viewport}"]
      env: { PB_POOL_TEST: %q, HOME: %q }
      timeoutMs: 60000
      requestTimeoutMs: 60000
    pool:
      max: 2
      waitMs: 60000
      setup:
        schema:
          type: object
          additionalProperties: false
          properties:
            viewport: { type: string, pattern: "^[0-9]{2,4}x[0-9]{2,4}$", default: "1024x768" }
allowlists:
  default:
    connections:
      browsers: { ops: ["browser_*"], setup: { viewport: ["*x*"] } }
`, node, cli, chromium, t.TempDir(), strings.TrimPrefix(marker, "PB_POOL_TEST="), t.TempDir()))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":", "REDIS_URL": os.Getenv("PATCHBAY_TEST_REDIS_URL"),
	})

	// Watch the marked processes while the execution runs.
	var mu sync.Mutex
	seen := map[int]string{}
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			for pid, comm := range markedProcs(strings.TrimPrefix(marker, "")) {
				mu.Lock()
				seen[pid] = comm
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})

	path := func(name string) []any {
		return []any{
			map[string]any{"kind": "call", "id": "open-" + name, "connection": "browser", "op": "browser_navigate", "args": map[string]any{"url": page.URL + "/" + name}},
			map[string]any{"kind": "call", "id": "read-" + name, "connection": "browser", "op": "browser_snapshot"},
		}
	}
	body, _ := json.Marshal(map[string]any{"wait": "60s", "workflow": map[string]any{
		"version":     1,
		"connections": map[string]any{"browser": map[string]any{"from": "browsers", "fresh": "path", "setup": map[string]any{"viewport": "800x600"}}},
		"root":        map[string]any{"kind": "parallel", "id": "suite", "paths": []any{path("alpha"), path("bravo")}},
	}})
	ex := post(t, srv.url, "k1", body)
	if ex["status"] != "succeeded" {
		t.Fatalf("execution: %v\nserver log:\n%s", ex, srv.output)
	}
	instances := map[string]string{}
	for _, s := range ex["steps"].([]any) {
		st := s.(map[string]any)
		id, _ := st["id"].(string)
		out, _ := json.Marshal(st["output"])
		if name, ok := strings.CutPrefix(id, "read-"); ok && !strings.Contains(string(out), "code-"+name+"-42") {
			t.Errorf("%s did not read its page: %.400s", id, out)
		}
		if name, ok := strings.CutPrefix(id, "read-"); ok {
			other := map[string]string{"alpha": "bravo", "bravo": "alpha"}[name]
			if strings.Contains(string(out), "code-"+other+"-42") {
				t.Errorf("%s read the other path's page: %.400s", id, out)
			}
		}
		ident, _ := st["identity"].(map[string]any)
		instances[id], _ = ident["instance"].(string)
	}
	if instances["read-alpha"] == "" || instances["read-alpha"] == instances["read-bravo"] || instances["open-alpha"] != instances["read-alpha"] {
		t.Errorf("identities %v: want one browser per path", instances)
	}

	// Both browsers are gone once the execution has ended.
	deadline := time.Now().Add(20 * time.Second)
	var left map[int]string
	for {
		if left = markedProcs(marker); len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	watch.Wait()
	mu.Lock()
	defer mu.Unlock()
	var browsers []int
	for pid, comm := range seen {
		if strings.Contains(comm, "chrom") {
			browsers = append(browsers, pid)
		}
	}
	slices.Sort(browsers)
	if len(browsers) == 0 {
		t.Errorf("no chromium process was seen (processes seen: %v)", seen)
	}
	if len(left) > 0 {
		t.Fatalf("processes of the pool still running after the execution: %v", left)
	}
	t.Logf("%d marked processes seen while running (%d chromium), none left", len(seen), len(browsers))
}
