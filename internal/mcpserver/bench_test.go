package mcpserver_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// The benchmarks of the MCP face. They need a real server behind /mcp:
// cmd/demo-mcp over stdio as the connection "demo", registered through
// internal/mcp's provider, an allowlist granting its echo, a harness with
// its workers on Redis (the real one when PATCHBAY_TEST_REDIS_URL is set,
// else miniredis) and the api server in front. Every tools/call through
// /mcp is then what it is in production: an execution recorded in Redis,
// claimed by a worker, passed through the gates, sent, its result saved,
// while the client waits on it.
//
//	PATCHBAY_TEST_REDIS_URL=redis://127.0.0.1:6379/0 go test ./internal/mcpserver \
//	  -run '^$' -bench 'ToolCall|IdleSession' -benchtime=2s -count=1

// benchEcho is the arguments of every benchmarked call.
var benchEcho = map[string]any{"text": "hello"}

// BenchmarkToolCall: the same Go SDK client calls the same tool (the demo
// server's echo, over stdio) directly and through /mcp, in one run, so the
// difference is what patchbay adds per call. p50-ms and p99-ms are the
// latency per call; via-mcp also reports added-p50-ms and added-p99-ms,
// its difference from direct in the same run (when direct ran first).
func BenchmarkToolCall(b *testing.B) {
	demo := buildDemoMCP(b)
	var direct struct{ p50, p99 float64 }
	b.Run("direct", func(b *testing.B) {
		cs := benchConnect(b, &sdk.CommandTransport{Command: exec.Command(demo)}, "")
		direct.p50, direct.p99 = benchCalls(b, cs, "echo")
	})
	b.Run("via-mcp", func(b *testing.B) {
		f := startBenchFace(b, demo, mcpserver.Options{}, 1, false)
		cs := benchConnect(b, f.transport(0), "")
		p50, p99 := benchCalls(b, cs, "demo_echo")
		if direct.p50 > 0 {
			b.ReportMetric(p50-direct.p50, "added-p50-ms")
			b.ReportMetric(p99-direct.p99, "added-p99-ms")
		}
	})
}

// benchCalls calls tool on cs for the benchmark's iterations and reports
// the latency per call at p50 and p99, in ms, which it returns.
func benchCalls(b *testing.B, cs *sdk.ClientSession, tool string) (p50, p99 float64) {
	b.Helper()
	params := &sdk.CallToolParams{Name: tool, Arguments: benchEcho}
	call := func() {
		res, err := cs.CallTool(context.Background(), params)
		if err != nil {
			b.Fatalf("%s: %v", tool, err)
		}
		if res.IsError {
			b.Fatalf("%s: tool error: %s", tool, text(res))
		}
	}
	// Warm up: the first calls register the tool, fill pools and caches.
	for range 20 {
		call()
	}
	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		call()
		took = append(took, time.Since(start))
	}
	return reportLatency(b, took)
}

// BenchmarkToolCallSessions64: 64 client sessions, each its own caller
// (API key) as 64 agents would be, keep one tools/call each in flight
// through /mcp, each an execution on Redis. calls/s is the throughput;
// p50-ms and p99-ms the latency per call under that load.
func BenchmarkToolCallSessions64(b *testing.B) {
	const clients = 64
	demo := buildDemoMCP(b)
	f := startBenchFace(b, demo, mcpserver.Options{}, clients, false)
	sessions := make([]*sdk.ClientSession, clients)
	for i := range sessions {
		sessions[i] = benchConnect(b, f.transport(i), "")
	}
	params := &sdk.CallToolParams{Name: "demo_echo", Arguments: benchEcho}
	var (
		mu   sync.Mutex
		took = make([]time.Duration, 0, 1<<16)
		fail error
	)
	work := make(chan struct{})
	var wg sync.WaitGroup
	for _, cs := range sessions {
		// Warm up: each caller's first call.
		if _, err := cs.CallTool(context.Background(), params); err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for range work {
				start := time.Now()
				res, err := cs.CallTool(context.Background(), params)
				d := time.Since(start)
				mu.Lock()
				took = append(took, d)
				if err == nil && res.IsError {
					err = fmt.Errorf("tool error: %s", text(res))
				}
				if err != nil && fail == nil {
					fail = err
				}
				mu.Unlock()
			}
		})
	}
	// Each iteration hands one call to a free session; the hand-off
	// blocks while all 64 are calling, so 64 stay in flight.
	start := time.Now()
	for b.Loop() {
		work <- struct{}{}
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	if fail != nil {
		b.Fatal(fail)
	}
	reportLatency(b, took)
	b.ReportMetric(float64(len(took))/elapsed.Seconds(), "calls/s")
}

// idleSessions is how many idle sessions BenchmarkIdleSession opens.
const idleSessions = 200

// envIdleServe, set to the demo server's path, makes BenchmarkIdleSession
// the serving side of the measurement (in a child process).
const envIdleServe = "PATCHBAY_BENCH_IDLE_SERVE"

// BenchmarkIdleSession opens 200 idle 2025-era sessions against /mcp (as
// the Go SDK opens one: initialize, then a standalone GET stream held
// open; each client its own HTTP transport, as separate clients are) and
// reports what each costs the server: the issue asks for RSS per idle
// session.
//
// The server runs in a child process (this test binary, in the serving
// mode of this benchmark), so that the clients' own memory is not
// counted: in one process, the SDK clients' sessions, transports and
// connections would land in the same heap. The child measures itself
// before and after the sessions open: heap-B/session is the growth of
// runtime.MemStats.HeapInuse after a GC — the honest in-process proxy for
// RSS, exact and stable; rss-B/session is the growth of VmRSS
// (/proc/self/status, after debug.FreeOSMemory; Linux only), which also
// counts goroutine stacks (stack-B/session, one goroutine per open
// stream and connection) but is noisier (the runtime returns pages to the
// OS lazily). ns/op is the time to open the 200 sessions.
func BenchmarkIdleSession(b *testing.B) {
	if demo := os.Getenv(envIdleServe); demo != "" {
		serveIdleChild(b, demo)
		return
	}
	demo := buildDemoMCP(b)
	child := startIdleChild(b, demo)
	var heap, rss, stack, goroutines float64
	var rounds int
	for b.Loop() {
		b.StopTimer()
		before := child.mem(b)
		b.StartTimer()
		open := make([]*sdk.ClientSession, 0, idleSessions)
		conns := make([]*http.Transport, 0, idleSessions)
		for i := range idleSessions {
			conn := &http.Transport{}
			conns = append(conns, conn)
			tr := &sdk.StreamableClientTransport{Endpoint: child.url + "/mcp", MaxRetries: -1,
				HTTPClient: &http.Client{Transport: bearer{key: benchKey(0), next: conn}}}
			cs, err := sdk.NewClient(&sdk.Implementation{Name: "patchbay-bench", Version: "1"}, nil).
				Connect(context.Background(), tr, &sdk.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
			if err != nil {
				b.Fatalf("session %d: %v", i, err)
			}
			open = append(open, cs)
		}
		b.StopTimer()
		// Let the standalone GET streams, opened after the handshake in
		// the background, reach the server.
		time.Sleep(300 * time.Millisecond)
		after := child.mem(b)
		heap += float64(after.HeapInuse) - float64(before.HeapInuse)
		rss += float64(after.RSS) - float64(before.RSS)
		stack += float64(after.StackInuse) - float64(before.StackInuse)
		goroutines += float64(after.Goroutines - before.Goroutines)
		rounds++
		for i, cs := range open {
			_ = cs.Close()
			conns[i].CloseIdleConnections()
		}
		b.StartTimer()
	}
	n := float64(rounds * idleSessions)
	b.ReportMetric(heap/n, "heap-B/session")
	if rss != 0 {
		b.ReportMetric(rss/n, "rss-B/session")
	}
	b.ReportMetric(stack/n, "stack-B/session")
	b.ReportMetric(goroutines/n, "goroutines/session")
}

// idleChild is the serving side of BenchmarkIdleSession.
type idleChild struct {
	url string
}

// memReport is what the child says of its memory.
type memReport struct {
	HeapInuse  uint64 `json:"heapInuse"`
	StackInuse uint64 `json:"stackInuse"`
	RSS        uint64 `json:"rss"`
	Goroutines int    `json:"goroutines"`
}

func (c *idleChild) mem(b *testing.B) memReport {
	b.Helper()
	resp, err := http.Get(c.url + "/bench/mem")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var m memReport
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		b.Fatal(err)
	}
	return m
}

const idleListening = "idle-face listening on "

// startIdleChild runs this test binary as the serving side and returns
// once it listens; it stops when b ends (its stdin closes).
func startIdleChild(b *testing.B, demo string) *idleChild {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^BenchmarkIdleSession$", "-test.benchtime=1x")
	cmd.Env = append(os.Environ(), envIdleServe+"="+demo)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	lines := bufio.NewScanner(stdout)
	var output []string
	for lines.Scan() {
		if url, ok := strings.CutPrefix(lines.Text(), idleListening); ok {
			go func() { _, _ = io.Copy(io.Discard, stdout) }()
			return &idleChild{url: url}
		}
		output = append(output, lines.Text())
	}
	b.Fatalf("the serving process did not start: %v\n%s\n%s", lines.Err(), strings.Join(output, "\n"), stderr.String())
	return nil
}

// serveIdleChild serves /mcp (and /bench/mem) until stdin closes.
func serveIdleChild(b *testing.B, demo string) {
	f := startBenchFace(b, demo, mcpserver.Options{SessionsPerPrincipal: 2 * idleSessions}, 1, true)
	fmt.Println(idleListening + f.url)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// memHandler answers the process's memory after a full collection.
func memHandler(w http.ResponseWriter, _ *http.Request) {
	runtime.GC()
	debug.FreeOSMemory() // collects again and returns free pages, so that VmRSS is what is in use
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(memReport{HeapInuse: ms.HeapInuse, StackInuse: ms.StackInuse, RSS: vmRSS(), Goroutines: runtime.NumGoroutine()})
}

// vmRSS is the process's resident set in bytes, 0 where /proc is not.
func vmRSS() uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return 0
			}
			return kb * 1024
		}
	}
	return 0
}

// benchFace is patchbay serving /mcp with the demo connection.
type benchFace struct {
	url string
	// client is shared by the face's callers, with room for one kept-alive
	// connection per session, as each real client would keep its own.
	client *http.Transport
}

// benchKey is the API key of the i-th caller, bench-i, whose allowlist
// grants demo's echo.
func benchKey(i int) string { return fmt.Sprintf("bench-key-%d", i) }

// startBenchFace starts patchbay with the demo server (at path demo) as
// the connection "demo", callers bench-0 … bench-(callers-1), and /mcp
// served by a face with options o; withMem adds /bench/mem (memHandler).
func startBenchFace(b *testing.B, demo string, o mcpserver.Options, callers int, withMem bool) *benchFace {
	b.Helper()
	ctx := context.Background()
	logger := slog.New(slog.DiscardHandler)
	reg := registry.NewRegistry(logger)
	if err := reg.Add("demo", pbmcp.New("demo", config.MCP{Command: demo}, &pbmcp.Options{Logger: logger})); err != nil {
		b.Fatal(err)
	}
	if err := reg.Start(ctx); err != nil {
		b.Fatal(err)
	}
	st := storetest.New(b)
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("bench", []byte(`{"connections":{"demo":{"ops":["echo"]}}}`))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := als.Put(ctx, al, "bench"); err != nil {
		b.Fatal(err)
	}
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: als, Logger: logger})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = execs.Run(runCtx, config.DefaultWorkers()); close(done) }()
	o.Engine, o.Logger = execs, logger
	face := mcpserver.New(o)
	keys := make([]api.Key, callers)
	for i := range keys {
		keys[i] = api.Key{SHA256: sha256.Sum256([]byte(benchKey(i))), Principal: authz.Principal{Name: fmt.Sprintf("bench-%d", i), Allowlist: "bench"}}
	}
	var handler http.Handler = api.New(api.Options{Executions: execs, Registry: reg, Allowlists: als, APIKeys: keys, MCP: face, Logger: logger})
	if withMem {
		mux := http.NewServeMux()
		mux.Handle("/", handler)
		mux.HandleFunc("GET /bench/mem", memHandler)
		handler = mux
	}
	srv := httptest.NewServer(handler)
	f := &benchFace{url: srv.URL, client: &http.Transport{MaxIdleConnsPerHost: 2 * callers}}
	b.Cleanup(func() {
		f.client.CloseIdleConnections()
		srv.Close()
		cancel()
		<-done
		_ = reg.Close()
	})
	return f
}

// transport is the i-th caller's client transport to /mcp.
func (f *benchFace) transport(i int) sdk.Transport {
	return &sdk.StreamableClientTransport{Endpoint: f.url + "/mcp", MaxRetries: -1,
		HTTPClient: &http.Client{Transport: bearer{key: benchKey(i), next: f.client}}}
}

// benchConnect connects an SDK client over tr (era "" is the SDK's
// latest) and closes it when b ends.
func benchConnect(b *testing.B, tr sdk.Transport, era string) *sdk.ClientSession {
	b.Helper()
	client := sdk.NewClient(&sdk.Implementation{Name: "patchbay-bench", Version: "1"}, nil)
	cs, err := client.Connect(context.Background(), tr, &sdk.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
		b.Fatalf("connect: %v", err)
	}
	b.Cleanup(func() { _ = cs.Close() })
	return cs
}

// buildDemoMCP builds cmd/demo-mcp into b's temporary directory.
func buildDemoMCP(b *testing.B) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "demo-mcp")
	if runtime.GOOS == "windows" {
		path += ".exe"
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	if out, err := exec.Command(gobin, "build", "-o", path, "github.com/patchbay-dev/patchbay/cmd/demo-mcp").CombinedOutput(); err != nil {
		b.Fatalf("build cmd/demo-mcp: %v\n%s", err, out)
	}
	return path
}

// reportLatency reports the p50 and p99 of took, in ms, and returns them.
func reportLatency(b *testing.B, took []time.Duration) (p50, p99 float64) {
	b.Helper()
	if len(took) == 0 {
		return 0, 0
	}
	slices.Sort(took)
	p50, p99 = percentileMs(took, 0.50), percentileMs(took, 0.99)
	b.ReportMetric(p50, "p50-ms")
	b.ReportMetric(p99, "p99-ms")
	return p50, p99
}

// percentileMs is the nearest-rank percentile q of sorted, in ms.
func percentileMs(sorted []time.Duration, q float64) float64 {
	i := int(float64(len(sorted))*q+0.999999) - 1
	i = max(0, min(i, len(sorted)-1))
	return float64(sorted[i]) / float64(time.Millisecond)
}
