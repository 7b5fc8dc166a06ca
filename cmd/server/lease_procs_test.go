package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// leaseProcsBound is how soon after a lease ends (released, or reclaimed)
// every process of its connection must be gone: the bound docs/connections.md states (6 s
// for a stdio server's tree, plus the 1 s tick that notices a reclaim or
// a dead holder), with slack for a loaded machine.
const leaseProcsBound = 12 * time.Second

// browserRig is a server with a pool of @playwright/mcp browsers whose
// processes all carry marker in their environment, a source of "go"
// events for wait steps, and a demo server whose note_put needs approval
// (a path that calls it parks the run).
type browserRig struct {
	marker string // NAME=value in every pooled process's environment
	cfg    string
	page   *httptest.Server
	watch  *procWatch
}

// Keys of the rig's config.
const (
	rigKey      = "k1"
	rigApprover = "approver-key"
	rigPusher   = "push-key"
)

func newBrowserRig(t *testing.T) *browserRig {
	t.Helper()
	node, cli, chromium := playwrightParts(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, "<!doctype html><title>%s</title><p id=code>code-%s-7</p>", name, name)
	}))
	t.Cleanup(page.Close)
	value := rand.Text()
	rig := &browserRig{marker: "PB_LEASE_PROCS=" + value, page: page}
	rig.cfg = writeConfig(t, fmt.Sprintf(`
connections:
  browsers:
    mcp:
      command: %q
      args: [%q, --browser, chromium, --executable-path, %q, --headless, --isolated, --no-sandbox, --output-dir, %q]
      env: { PB_LEASE_PROCS: %q, HOME: %q }
      timeoutMs: 60000
      requestTimeoutMs: 60000
    pool: { max: 2, waitMs: 60000 }
  signals:
    source: { events: { go: { type: object } } }
  demo:
    mcp: { command: %q }
    policy: { approve: ["note_put"] }
allowlists:
  default:
    connections:
      browsers: { ops: ["browser_*"] }
      signals: { events: ["go"] }
      demo: { ops: ["*"] }
apiKeys:
  - { name: oncall, key: %s, allowlist: default, roles: [approve] }
  - { name: pusher, key: %s, allowlist: none, push: [signals] }
`, node, cli, chromium, t.TempDir(), value, t.TempDir(), demoBin, rigApprover, rigPusher))
	rig.watch = watchProcs(t, rig.marker)
	return rig
}

// env is the environment of an in-process server on the rig's config.
func (rig *browserRig) env(extra ...string) map[string]string {
	env := map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": rig.cfg, "PATCHBAY_API_KEYS": rigKey,
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":", "REDIS_URL": os.Getenv("PATCHBAY_TEST_REDIS_URL"),
	}
	for i := 0; i+1 < len(extra); i += 2 {
		env[extra[i]] = extra[i+1]
	}
	return env
}

// browse is a path that opens its page, waits for its "go" event, and
// reads the page: a wait between two calls on one leased browser.
func (rig *browserRig) browse(name string) []any {
	return []any{
		map[string]any{"kind": "call", "id": "open-" + name, "connection": "browser", "op": "browser_navigate", "args": map[string]any{"url": rig.page.URL + "/" + name}},
		map[string]any{"kind": "wait", "id": "go-" + name, "connection": "signals", "event": "go", "timeoutMs": 120000,
			"filter": "$event.payload.path == '" + name + "'"},
		map[string]any{"kind": "call", "id": "read-" + name, "connection": "browser", "op": "browser_snapshot"},
	}
}

// gate is a path whose call waits for a person: the run parks, and the
// other paths' waits park with it.
func gate() []any {
	return []any{map[string]any{"kind": "call", "id": "gate", "connection": "demo", "op": "note_put", "args": map[string]any{"key": "k", "value": "v"}}}
}

// browserDocument runs paths in parallel, each with a fresh browser of its own.
func browserDocument(scope string, paths ...[]any) map[string]any {
	ps := make([]any, len(paths))
	for i, p := range paths {
		ps[i] = p
	}
	return map[string]any{"workflow": map[string]any{
		"version": 1,
		"connections": map[string]any{
			"browser": map[string]any{"from": "browsers", "fresh": scope},
			"signals": map[string]any{"events": []any{"go"}}, "demo": map[string]any{},
		},
		"root": map[string]any{"kind": "parallel", "id": "suite", "paths": ps},
	}}
}

func submit(t *testing.T, base string, doc map[string]any) string {
	t.Helper()
	status, ex := call(t, "POST", base+"/v1/executions", rigKey, doc)
	if status != 202 {
		t.Fatalf("submit = %d %v", status, ex)
	}
	return ex["id"].(string)
}

// execution reads an execution.
func execution(t *testing.T, base, id string) map[string]any {
	t.Helper()
	status, ex := call(t, "GET", base+"/v1/executions/"+id, rigKey, nil)
	if status != 200 {
		t.Fatalf("GET execution %s = %d %v", id, status, ex)
	}
	return ex
}

// awaitStatus waits up to d for the execution to reach status, and fails
// at once when it ends in another.
func awaitStatus(t *testing.T, base, id, status string, d time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ex := execution(t, base, id)
		s, _ := ex["status"].(string)
		if s == status {
			return ex
		}
		if slices.Contains([]string{"succeeded", "failed", "cancelled"}, s) || time.Now().After(deadline) {
			t.Fatalf("execution %s is %s, want %s: %v", id, s, status, ex)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// approveGate approves the pending approval of execution id.
func approveGate(t *testing.T, base, id string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, list := call(t, "GET", base+"/v1/approvals?state=pending", rigKey, nil)
		items, _ := list["items"].([]any)
		for _, it := range items {
			if ap := it.(map[string]any); ap["execution"] == id {
				if status, got := call(t, "POST", base+"/v1/approvals/"+ap["id"].(string)+"/approve", rigApprover, map[string]any{}); status != 200 {
					t.Fatalf("approve = %d %v", status, got)
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pending approval of %s", id)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pushGo pushes the "go" event of a path.
func pushGo(t *testing.T, base, name string) {
	t.Helper()
	body := map[string]any{"type": "go", "id": "go-" + name + "-" + rand.Text()[:6], "payload": map[string]any{"path": name}}
	if status, got := call(t, "POST", base+"/v1/sources/signals/events", rigPusher, body); status != 202 && status != 200 {
		t.Fatalf("push go %s = %d %v", name, status, got)
	}
}

// procWatch records the processes of a pool while a test runs: those
// whose environment holds the marker, and the process groups and sessions
// they lead or belong to, since chromium's helpers (zygotes, renderers)
// overwrite their environment with their process title and are found by
// their group. At cleanup it kills whatever is left, so a failing test
// leaves no browser behind.
type procWatch struct {
	marker string
	mu     sync.Mutex
	seen   map[int]string // pid -> command, every process seen
	groups map[int]bool   // process groups and sessions of marked processes
}

func watchProcs(t *testing.T, marker string) *procWatch {
	w := &procWatch{marker: marker, seen: map[int]string{}, groups: map[int]bool{}}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			w.look()
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
		for pid := range w.left() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return w
}

// procStat is a process's group and session (/proc/PID/stat); ok is false
// for a process gone or a zombie.
func procStat(pid int) (pgid, sid int, ok bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// The fields after the command (which may hold spaces) in parentheses:
	// state ppid pgrp session …
	i := strings.LastIndexByte(string(data), ')')
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 4 || f[0] == "Z" {
		return 0, 0, false
	}
	pgid, _ = strconv.Atoi(f[2])
	sid, _ = strconv.Atoi(f[3])
	return pgid, sid, true
}

// look records the marked processes and their groups, and every process
// of those groups.
func (w *procWatch) look() {
	marked := markedProcs(w.marker)
	pgrp, session, _ := procStat(os.Getpid())
	own := map[int]bool{pgrp: true, session: true}
	w.mu.Lock()
	defer w.mu.Unlock()
	for pid, comm := range marked {
		w.seen[pid] = comm
		if pgid, sid, ok := procStat(pid); ok {
			for _, g := range []int{pgid, sid} {
				if !own[g] && g > 1 {
					w.groups[g] = true
				}
			}
		}
	}
	for pid, comm := range w.members() {
		w.seen[pid] = comm
	}
}

// members lists the live processes of the recorded groups and sessions;
// w.mu is held.
func (w *procWatch) members() map[int]string {
	out := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pgid, sid, ok := procStat(pid); ok && (w.groups[pgid] || w.groups[sid]) {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			out[pid] = strings.TrimSpace(string(comm))
		}
	}
	return out
}

// left lists the processes of the pool still running: marked ones and
// members of the groups recorded.
func (w *procWatch) left() map[int]string {
	w.look()
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.members()
	for pid, comm := range markedProcs(w.marker) {
		out[pid] = comm
	}
	return out
}

// browsers is how many chromium processes have been seen so far.
func (w *procWatch) browsers() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, comm := range w.seen {
		if strings.Contains(comm, "chrom") {
			n++
		}
	}
	return n
}

// awaitBrowsers waits until at least n chromium processes were seen.
func (w *procWatch) awaitBrowsers(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for w.browsers() < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d chromium processes seen: %d", n, w.browsers())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// awaitNone waits up to leaseProcsBound for every process of the pool to
// be gone, and returns how long that took.
func (w *procWatch) awaitNone(t *testing.T, what string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		left := w.left()
		if len(left) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > leaseProcsBound {
			t.Fatalf("%s: %d processes of the pool still running %s later (%d chromium seen in all): %v",
				what, len(left), leaseProcsBound, w.browsers(), left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// poolLeased is the number of leases the pool's status shows.
func poolLeased(t *testing.T, base string) float64 {
	t.Helper()
	_, c := call(t, "GET", base+"/v1/connections/browsers", rigKey, nil)
	p, _ := c["pool"].(map[string]any)
	n, _ := p["leased"].(float64)
	return n
}

// TestParkedLeasesEndWithTheirProcesses: two paths, each with a browser
// of its own, open their page and wait for an event while a third path
// waits for an approval, so the run parks with both leases kept. The
// events come, the approval is given, the run resumes on the same
// browsers and succeeds; then no process of either browser is left.
func TestParkedLeasesEndWithTheirProcesses(t *testing.T) {
	t.Parallel()
	rig := newBrowserRig(t)
	srv := start(t, rig.env())
	id := submit(t, srv.url, browserDocument("path", rig.browse("alpha"), rig.browse("bravo"), gate()))
	awaitStatus(t, srv.url, id, "waiting", 120*time.Second)
	rig.watch.awaitBrowsers(t, 2)
	parked := len(rig.watch.left())
	pushGo(t, srv.url, "alpha")
	pushGo(t, srv.url, "bravo")
	approveGate(t, srv.url, id)
	ex := awaitStatus(t, srv.url, id, "succeeded", 120*time.Second)
	for _, s := range ex["steps"].([]any) {
		st := s.(map[string]any)
		out, _ := json.Marshal(st["output"])
		if name, ok := strings.CutPrefix(st["id"].(string), "read-"); ok && !strings.Contains(string(out), "code-"+name+"-7") {
			t.Errorf("%s did not read its page after the resume: %.300s", st["id"], out)
		}
	}
	took := rig.watch.awaitNone(t, "after the resumed run succeeded")
	if n := poolLeased(t, srv.url); n != 0 {
		t.Errorf("pool shows %v leased", n)
	}
	t.Logf("%d processes while parked, %d chromium seen in all; none left %s after the run", parked, rig.watch.browsers(), took.Round(time.Millisecond))
}

// TestCancelledRunLeavesNoBrowser: a run holding a browser is cancelled
// while its path waits for an event (the lease held), and another while it
// is parked (the lease kept and renewed by the process it parked in); both
// leases go back at once (not at the next renewal, 15 s) and no process of
// either browser is left.
func TestCancelledRunLeavesNoBrowser(t *testing.T) {
	t.Parallel()
	rig := newBrowserRig(t)
	srv := start(t, rig.env())
	held := submit(t, srv.url, browserDocument("path", rig.browse("alpha")))
	parked := submit(t, srv.url, browserDocument("path", rig.browse("bravo"), gate()))
	awaitStatus(t, srv.url, parked, "waiting", 120*time.Second)
	awaitStep(t, srv.url, held, "open-alpha")
	for _, id := range []string{held, parked} {
		if status, ex := call(t, "POST", srv.url+"/v1/executions/"+id+"/cancel", rigKey, nil); status != 200 {
			t.Fatalf("cancel %s = %d %v", id, status, ex)
		}
	}
	awaitStatus(t, srv.url, held, "cancelled", 30*time.Second)
	awaitStatus(t, srv.url, parked, "cancelled", 30*time.Second)
	took := rig.watch.awaitNone(t, "after both runs were cancelled")
	t.Logf("%d chromium seen; none left %s after the cancellations", rig.watch.browsers(), took.Round(time.Millisecond))
}

// awaitStep waits for step to be done in execution id.
func awaitStep(t *testing.T, base, id, step string) {
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		ex := execution(t, base, id)
		steps, _ := ex["steps"].([]any)
		for _, s := range steps {
			if st := s.(map[string]any); st["id"] == step && st["status"] == "done" {
				return
			}
		}
		if s, _ := ex["status"].(string); slices.Contains([]string{"succeeded", "failed", "cancelled"}, s) || time.Now().After(deadline) {
			t.Fatalf("step %s of %s not done: %v", step, id, ex)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFailedRunLeavesNoBrowser: a path opens a browser of its own and one
// leased for the whole execution, then fails. The path's lease goes back
// at once; the execution's is kept for a resume until the reclaim window
// (4 s here) passes, and is then reclaimed. No process of either browser
// is left.
func TestFailedRunLeavesNoBrowser(t *testing.T) {
	t.Parallel()
	rig := newBrowserRig(t)
	srv := start(t, rig.env("PATCHBAY_POOL_RECLAIM_AFTER", "4s"))
	doc := browserDocument("path", []any{
		map[string]any{"kind": "call", "id": "open", "connection": "browser", "op": "browser_navigate", "args": map[string]any{"url": rig.page.URL + "/path"}},
		map[string]any{"kind": "call", "id": "open-tab", "connection": "tab", "op": "browser_navigate", "args": map[string]any{"url": rig.page.URL + "/run"}},
		map[string]any{"kind": "call", "id": "fail", "connection": "demo", "op": "fail"},
	})
	doc["workflow"].(map[string]any)["connections"].(map[string]any)["tab"] = map[string]any{"from": "browsers", "fresh": "execution"}
	id := submit(t, srv.url, doc)
	awaitStatus(t, srv.url, id, "failed", 120*time.Second)
	rig.watch.awaitBrowsers(t, 2)
	deadline := time.Now().Add(30 * time.Second)
	for poolLeased(t, srv.url) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the execution's lease was not reclaimed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := rig.watch.awaitNone(t, "after the failed run's leases were given back and reclaimed")
	t.Logf("%d chromium seen; none left %s after the reclaim", rig.watch.browsers(), took.Round(time.Millisecond))
}

// TestKilledHolderLeavesNoBrowser: the process holding a browser's lease
// is killed with SIGKILL; its lease is reclaimed by the other process on
// the same Redis after the window (6 s here), and no process of the
// browser is left.
func TestKilledHolderLeavesNoBrowser(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") shared by two processes")
	}
	t.Parallel()
	rig := newBrowserRig(t)
	st := storetest.New(t)
	// No takeover while the test looks: only the reclaim.
	rs := newReplicas(t, 2, serverBin, storetest.URL(t), st.Prefix, rig.cfg, rigKey,
		"PATCHBAY_LOG_LEVEL=info", "PATCHBAY_WORKERS=1", "PATCHBAY_POOL_RECLAIM_AFTER=6s", "PATCHBAY_CLAIM_TIMEOUT=300s")
	if err := rs[0].start(); err != nil {
		t.Fatal(err)
	}
	base := "http://" + rs[0].addr
	id := submit(t, base, browserDocument("path", rig.browse("alpha")))
	awaitStep(t, base, id, "open-alpha")
	rig.watch.awaitBrowsers(t, 2)
	if err := rs[1].start(); err != nil {
		t.Fatal(err)
	}
	held := len(rig.watch.left())

	rs[0].kill()
	other := "http://" + rs[1].addr
	deadline := time.Now().Add(60 * time.Second)
	for poolLeased(t, other) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the killed holder's lease was not reclaimed")
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := rig.watch.awaitNone(t, "after the killed holder's lease was reclaimed")
	t.Logf("%d processes while held, %d chromium seen; none left %s after the reclaim", held, rig.watch.browsers(), took.Round(time.Millisecond))
}
