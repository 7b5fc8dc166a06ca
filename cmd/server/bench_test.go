package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// BenchmarkExecutions measures executions per second of a three-call
// workflow through the HTTP API (POST with wait), with one and with two
// server processes on one real Redis and 8, 32 and 64 clients spread over
// them, and the POST latency of submissions (no wait) offered at a fixed
// 200/s. The MCP server is in this process, over Streamable HTTP, and
// answers at once: what is measured is the engine's own cost.
//
// Besides exec/s it reports the p50 and p99 of a POST, and per execution
// the Redis commands the servers sent and the Redis connections they
// opened (from the Redis server's INFO totals before and after, commands
// run inside scripts included), the server processes' CPU (from
// /proc/<pid>/stat), Redis's CPU (INFO cpu) and this process's (the
// clients and the MCP server: what the machine spends besides). Those Redis totals are
// the server's: on a Redis that others use at the same time they include
// their commands too, so measure on a quiet one.
//
// Knobs (environment, all optional):
//
//	PATCHBAY_BENCH_PROCESSES  comma-separated process counts (default 1,2)
//	PATCHBAY_BENCH_CLIENTS    comma-separated client counts (default 8,32,64)
//	PATCHBAY_BENCH_RATE       offered POSTs/s of the latency run (default 200; 0: none)
//	PATCHBAY_BENCH_WORKERS    PATCHBAY_WORKERS of each process (default: the server's)
//	PATCHBAY_BENCH_SERVER     another server binary to measure (a baseline build)
//	PATCHBAY_BENCH_PROFILE    a directory: each run's CPU profile (the first
//	                          process, PATCHBAY_BENCH_PROFILE_SECONDS long,
//	                          default 5) and its allocations are written there
//	PATCHBAY_BENCH_COMMANDS   set: watch the processes' commands (Redis MONITOR, which
//	                          slows Redis: figures of such a run are not for exec/s),
//	                          report those the servers sent (a script counts once:
//	                          client-cmds/exec) and print all by name
func BenchmarkExecutions(b *testing.B) {
	url := storetest.URL(b)
	if url == "" {
		b.Skip("needs a real Redis (" + storetest.EnvURL + ")")
	}
	_, mcpSrv := newCounterDelay(0)
	b.Cleanup(mcpSrv.Close)
	cfg := writeConfig(b, fmt.Sprintf(`
connections:
  counter: { mcp: { type: http, url: %q } }
allowlists:
  default: { connections: { counter: { ops: ["*"] } } }
`, mcpSrv.URL+"/mcp"))
	bin := serverBin
	if v := os.Getenv("PATCHBAY_BENCH_SERVER"); v != "" {
		bin = v
	}
	profDir := os.Getenv("PATCHBAY_BENCH_PROFILE")
	for _, procs := range benchInts(b, "PATCHBAY_BENCH_PROCESSES", "1,2") {
		b.Run(fmt.Sprintf("processes=%d", procs), func(b *testing.B) {
			f := startFleet(b, bin, url, cfg, procs, profDir != "")
			for _, clients := range benchInts(b, "PATCHBAY_BENCH_CLIENTS", "8,32,64") {
				b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
					f.measure(b, profDir, func() []time.Duration { return f.closedLoop(b, clients) })
				})
			}
			if rate := benchInts(b, "PATCHBAY_BENCH_RATE", "200"); len(rate) == 1 && rate[0] > 0 {
				b.Run(fmt.Sprintf("rate=%d", rate[0]), func(b *testing.B) {
					f.measure(b, profDir, func() []time.Duration { return f.openLoop(b, rate[0]) })
				})
			}
		})
	}
}

// benchWorkflow is the three-call workflow of every run.
const benchWorkflow = `{"version":1,"connections":{"counter":{}},"root":{"kind":"sequence","id":"m","steps":[
	{"effect":{"step":"one"}},{"effect":{"step":"two"}},{"effect":{"step":"three"}}]}}`

// fleet is the server processes of one setting and what measures them.
type fleet struct {
	rdb      *redis.Client
	prefix   string
	replicas []*replica
	addrs    []string
	pprof    []string
	client   *http.Client
	next     atomic.Int64
}

func startFleet(b *testing.B, bin, url, cfg string, procs int, profile bool) *fleet {
	prefix := storetest.Prefix()
	f := &fleet{rdb: benchClient(b, url), prefix: prefix, addrs: make([]string, procs), pprof: make([]string, procs),
		// Keep-alive connections for every client: the default transport
		// keeps two per host, and the rest would reconnect every request.
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	b.Cleanup(func() { cleanPrefix(f.rdb, prefix) })
	dir := b.TempDir()
	for i := range procs {
		f.addrs[i] = freeAddr(b)
		env := []string{
			"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
			"REDIS_URL=" + url, "PATCHBAY_REDIS_PREFIX=" + prefix, "PATCHBAY_CONFIG=" + cfg,
			"PATCHBAY_ADDR=" + f.addrs[i], "PATCHBAY_API_KEYS=bench-key", "PATCHBAY_LOG_LEVEL=warn",
		}
		if w := os.Getenv("PATCHBAY_BENCH_WORKERS"); w != "" {
			env = append(env, "PATCHBAY_WORKERS="+w)
		}
		if profile {
			f.pprof[i] = freeAddr(b)
			env = append(env, "PATCHBAY_PPROF_ADDR="+f.pprof[i])
		}
		r := &replica{bin: bin, addr: f.addrs[i], logPath: filepath.Join(dir, fmt.Sprintf("r%d.log", i)), env: env}
		if err := r.start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(r.kill)
		f.replicas = append(f.replicas, r)
	}
	// Warm up: connections to Redis, to the MCP server and from the
	// clients are opened before anything is counted.
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			if _, err := f.post(true); err != nil {
				log, _ := os.ReadFile(filepath.Join(dir, "r0.log"))
				b.Errorf("%v\n%s", err, log)
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	return f
}

// post submits the workflow to the next process, waiting for its result
// or not, and returns how long the POST took.
func (f *fleet) post(wait bool) (time.Duration, error) {
	body := `{"workflow":` + benchWorkflow + `}`
	want := http.StatusAccepted
	if wait {
		body, want = `{"wait":"30s","workflow":`+benchWorkflow+`}`, http.StatusOK
	}
	req, _ := http.NewRequest("POST", "http://"+f.addrs[int(f.next.Add(1))%len(f.addrs)]+"/v1/executions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer bench-key")
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var ex map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&ex)
	if resp.StatusCode != want || (wait && ex["status"] != "succeeded") {
		return 0, fmt.Errorf("status %d: %v", resp.StatusCode, ex)
	}
	return time.Since(start), nil
}

// closedLoop runs b.N executions by clients that each submit the next as
// soon as their last finished.
func (f *fleet) closedLoop(b *testing.B, clients int) []time.Duration {
	var left atomic.Int64
	left.Store(int64(b.N))
	lat := make([][]time.Duration, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				d, err := f.post(true)
				if err != nil {
					b.Error(err)
					return
				}
				lat[c] = append(lat[c], d)
			}
		})
	}
	wg.Wait()
	return slices.Concat(lat...)
}

// openLoop submits b.N executions at rate per second whatever the answers
// take, then waits until every execution has finished, so the run's CPU
// and commands are those of whole executions.
func (f *fleet) openLoop(b *testing.B, rate int) []time.Duration {
	lat := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range b.N {
		<-tick.C
		wg.Go(func() {
			d, err := f.post(false)
			if err != nil {
				b.Error(err)
			}
			lat[i] = d
		})
	}
	wg.Wait()
	f.drain(b)
	return lat
}

// drain waits until the work stream has no item left, new or pending.
func (f *fleet) drain(b *testing.B) {
	ctx := context.Background()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		n, err := f.rdb.XLen(ctx, f.prefix+"work").Result()
		if err == nil && n == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Error("executions still queued a minute after the last submission")
}

// measure runs load with the figures around it and reports them.
func (f *fleet) measure(b *testing.B, profDir string, load func() []time.Duration) {
	cpuDone := f.startProfile(b, profDir)
	var mon *monitor
	if os.Getenv("PATCHBAY_BENCH_COMMANDS") != "" && b.N > 1 {
		mon = f.monitor(b)
	}
	before := f.totals(b)
	b.ResetTimer()
	lat := load()
	b.StopTimer()
	after := f.totals(b)
	cpuDone()
	if profDir != "" && b.N > 1 {
		f.fetch(b, "/debug/pprof/allocs", filepath.Join(profDir, benchFile(b)+".allocs.pprof"))
	}
	n := float64(b.N)
	b.ReportMetric(n/b.Elapsed().Seconds(), "exec/s")
	// INFO itself is one command (twice), and the counting client's own
	// connection was opened before.
	b.ReportMetric(float64(after.commands-before.commands-2)/n, "cmds/exec")
	b.ReportMetric(float64(after.connections-before.connections)/n, "conns/exec")
	b.ReportMetric(float64(after.serverCPU-before.serverCPU)/n/float64(time.Millisecond), "server-cpu-ms/exec")
	b.ReportMetric(float64(after.redisCPU-before.redisCPU)/n/float64(time.Millisecond), "redis-cpu-ms/exec")
	b.ReportMetric(float64(after.benchCPU-before.benchCPU)/n/float64(time.Millisecond), "bench-cpu-ms/exec")
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
	if mon != nil {
		client, script := mon.stop()
		sum := 0.0
		for _, v := range client {
			sum += float64(v)
		}
		b.ReportMetric(sum/n, "client-cmds/exec")
		b.Logf("Redis commands per execution sent by the servers: %s", perExec(nil, client, n))
		b.Logf("and run inside their scripts: %s", perExec(nil, script, n))
	}
}

// monitor counts the commands that name the fleet's keys (the prefix), by
// name, those the servers sent apart from those their scripts ran. It
// speaks MONITOR over a connection of its own (go-redis drops a MONITOR
// connection's replies).
type monitor struct {
	conn           net.Conn
	done           chan struct{}
	client, script map[string]int64
}

func (f *fleet) monitor(b *testing.B) *monitor {
	conn, err := net.Dial("tcp", f.rdb.Options().Addr)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		b.Fatal(err)
	}
	rd := bufio.NewReaderSize(conn, 1<<20)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		b.Fatalf("MONITOR: %q %v", line, err)
	}
	m := &monitor{conn: conn, done: make(chan struct{}), client: map[string]int64{}, script: map[string]int64{}}
	go func() {
		defer close(m.done)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			if !strings.Contains(line, f.prefix) {
				continue
			}
			src, rest, ok := strings.Cut(line, "] \"")
			if !ok {
				continue
			}
			name, _, _ := strings.Cut(rest, "\"")
			name = strings.ToLower(name)
			if strings.HasSuffix(src, " lua") {
				m.script[name]++
			} else {
				m.client[name]++
			}
		}
	}()
	return m
}

func (m *monitor) stop() (client, script map[string]int64) {
	time.Sleep(200 * time.Millisecond) // the last lines arrive
	m.conn.Close()
	<-m.done
	return m.client, m.script
}

// startProfile takes a CPU profile of the first process while the load
// runs; the func it returns waits for it and writes it to profDir.
func (f *fleet) startProfile(b *testing.B, profDir string) (wait func()) {
	if profDir == "" || b.N <= 1 {
		return func() {}
	}
	secs := 5
	if v, err := strconv.Atoi(os.Getenv("PATCHBAY_BENCH_PROFILE_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.fetch(b, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), filepath.Join(profDir, benchFile(b)+".cpu.pprof"))
	}()
	return func() { <-done }
}

func (f *fleet) fetch(b *testing.B, path, file string) {
	resp, err := http.Get("http://" + f.pprof[0] + path)
	if err != nil {
		b.Logf("profile %s: %v", path, err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Logf("profile %s: status %d, %v", path, resp.StatusCode, err)
		return
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		b.Logf("profile %s: %v", path, err)
	}
}

// benchFile names a run's profile after the benchmark, slashes dropped.
func benchFile(b *testing.B) string {
	return strings.NewReplacer("/", "_", "=", "").Replace(b.Name())
}

func benchInts(b *testing.B, env, def string) []int {
	v := os.Getenv(env)
	if v == "" {
		v = def
	}
	var out []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			b.Fatalf("%s: %q is not a whole number", env, s)
		}
		out = append(out, n)
	}
	return out
}

func benchClient(b *testing.B, url string) *redis.Client {
	opt, err := redis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	opt.PoolSize = 1
	rdb := redis.NewClient(opt)
	b.Cleanup(func() { rdb.Close() })
	return rdb
}

func cleanPrefix(rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}

type totals struct {
	commands, connections int64
	byName                map[string]int64
	serverCPU, redisCPU   time.Duration
	benchCPU              time.Duration // this process: the clients and the MCP server
}

// totals reads the Redis server's totals of commands processed (summed
// over INFO commandstats) and connections received and its CPU time, and
// the CPU time of the server processes.
func (f *fleet) totals(b *testing.B) totals {
	info, err := f.rdb.Info(context.Background(), "commandstats", "stats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	c := totals{byName: map[string]int64{}}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
			c.connections, _ = strconv.ParseInt(v, 10, 64)
		}
		for _, k := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, k); ok {
				s, _ := strconv.ParseFloat(v, 64)
				c.redisCPU += time.Duration(s * float64(time.Second))
			}
		}
		if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
			name, stats, _ := strings.Cut(rest, ":")
			calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
			n, _ := strconv.ParseInt(calls, 10, 64)
			c.commands += n
			c.byName[name] = n
		}
	}
	for _, r := range f.replicas {
		c.serverCPU += processCPU(r)
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.benchCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return c
}

// processCPU is the user and system time a replica's process has used,
// from /proc (Linux); 0 elsewhere.
func processCPU(r *replica) time.Duration {
	r.mu.Lock()
	pid := r.cmd.Process.Pid
	r.mu.Unlock()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces; the fields after it are fixed.
	_, rest, _ := bytes.Cut(data, []byte(") "))
	fields := strings.Fields(string(rest))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks
}

// perExec lists the commands run between two snapshots, per execution,
// most first.
func perExec(before, after map[string]int64, n float64) string {
	type row struct {
		name string
		per  float64
	}
	var rows []row
	for name, v := range after {
		if d := v - before[name]; d > 0 {
			rows = append(rows, row{name, float64(d) / n})
		}
	}
	slices.SortFunc(rows, func(a, b row) int { return int((b.per - a.per) * 1000) })
	var sb strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&sb, "%s %.2f, ", r.name, r.per)
	}
	return strings.TrimSuffix(sb.String(), ", ")
}
