package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/openapi/openapitest"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// Bounds the hostile-document tests hold the server process to.
const (
	// hostileRSSMiB bounds the peak resident memory of a server loading
	// every hostile document below (measured: about 100 MiB), which before
	// the budgets ran out of memory (3 levels of 200 needed 1.6 GiB, the
	// 1 MB description more than the machine had).
	hostileRSSMiB = 256
	// hostileDetailBytes bounds GET /v1/connections/{name} of each: 77 MB
	// before.
	hostileDetailBytes = 256 << 10
	// drainSlack is what a SIGTERM may take beyond the shutdown grace and
	// the 5 s the connections have to close, on a loaded machine.
	drainSlack = 3 * time.Second
)

// writeDocs writes each document to dir and returns its path by name.
func writeDocs(t *testing.T, docs map[string][]byte) map[string]string {
	t.Helper()
	dir := t.TempDir()
	paths := map[string]string{}
	for name, doc := range docs {
		paths[name] = filepath.Join(dir, name+".json")
		if err := os.WriteFile(paths[name], doc, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return paths
}

// okAPI answers every call {"ok": true}.
func okAPI(t *testing.T) string {
	t.Helper()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

// procStatus reads a field of /proc/<pid>/status in MiB (VmHWM: the peak
// resident set).
func procStatus(t *testing.T, pid int, field string) float64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("%s not measured: %v", field, err)
	}
	lines := bufio.NewScanner(bytes.NewReader(data))
	for lines.Scan() {
		if v, ok := strings.CutPrefix(lines.Text(), field+":"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// terminate sends SIGTERM and returns how long the process took to exit,
// failing past limit.
func (r *replica) terminate(t *testing.T, limit time.Duration) time.Duration {
	t.Helper()
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		return time.Since(start)
	case <-time.After(limit):
		out, _ := os.ReadFile(r.logPath)
		t.Fatalf("still running %s after SIGTERM:\n%s", limit, out)
		return 0
	}
}

// connectionStates is every connection's state and last error.
func connectionStates(t *testing.T, base string) map[string][2]string {
	t.Helper()
	var list struct {
		Items []struct{ Name, State, LastError string }
	}
	getJSON(t, base+"/v1/connections", &list)
	out := map[string][2]string{}
	for _, c := range list.Items {
		out[c.Name] = [2]string{c.State, c.LastError}
	}
	return out
}

// Hostile OpenAPI documents, read from files at start: $ref fan-out at
// several widths, a 1 MB description under a fan-out, nesting deeper than
// a document may, a schema too large to inline at all, and a file larger
// than maxResponseBytes. The server process starts with bounded memory,
// the documents that fit are ready and take calls, the others fail with
// errors naming their limit, each connection's detail stays small, and
// the same happens again after a SIGTERM and a restart.
func TestHostileOpenAPIDocuments(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	api := okAPI(t)
	docs := writeDocs(t, map[string][]byte{
		"fan40":  openapitest.FanOut(3, 40, 10),
		"fan200": openapitest.FanOut(3, 200, 10),
		"desc":   openapitest.FanOut(2, 40, 1<<20),
		"deep":   openapitest.Deep(4000),
		"wide":   openapitest.Flat(6000),
		"huge":   openapitest.FanOut(1, 10, 2<<20),
	})
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  fan40:  { openapi: { url: %q, baseUrl: %q } }
  fan200: { openapi: { url: %q, baseUrl: %q } }
  desc:   { openapi: { url: %q, baseUrl: %q } }
  deep:   { openapi: { url: %q } }
  wide:   { openapi: { url: %q } }
  huge:   { openapi: { url: %q, maxResponseBytes: 1048576 } }
allowlists:
  default:
    connections:
      fan40: { ops: ["*"] }
`, docs["fan40"], api, docs["fan200"], api, docs["desc"], api, docs["deep"], docs["wide"], docs["huge"]))
	srv := oneReplica(t, st, cfg, "PATCHBAY_API_KEYS=k1@run+read", "PATCHBAY_SHUTDOWN_GRACE=2s")
	base := "http://" + srv.addr

	check := func(t *testing.T) {
		states := connectionStates(t, base)
		for name, want := range map[string][2]string{
			"fan40": {"ready", ""}, "fan200": {"ready", ""}, "desc": {"ready", ""},
			"deep": {"unavailable", "document nests deeper than 64 levels"},
			"wide": {"unavailable", "operation flat: input schema with no $ref inlined, over maxSchemaNodes (10000)"},
			"huge": {"unavailable", "larger than 1048576 bytes (maxResponseBytes)"},
		} {
			if got := states[name]; got[0] != want[0] || !strings.Contains(got[1], want[1]) {
				t.Errorf("%s: %s %q, want %s %q", name, got[0], got[1], want[0], want[1])
			}
		}
		for _, name := range []string{"fan40", "fan200", "desc", "deep"} {
			body := getBody(t, base+"/v1/connections/"+name)
			if len(body) > hostileDetailBytes {
				t.Errorf("GET /v1/connections/%s: %d bytes", name, len(body))
			}
			t.Logf("GET /v1/connections/%s: %d bytes", name, len(body))
		}
		// A call through gate 2 with the arguments of the report.
		status, ex := postJSON(t, base+"/v1/executions", "k1", `{"wait":"20s","workflow":{"version":1,"connections":{"fan40":{}},
			"root":{"kind":"call","id":"c","connection":"fan40","op":"fanout","args":{"p0":{"p1":{"p2":"x"}}}}}}`)
		if status != 200 || ex["status"] != "succeeded" {
			t.Errorf("call = %d %v", status, ex)
		}
		rss := procStatus(t, srv.cmd.Process.Pid, "VmHWM")
		if rss > hostileRSSMiB {
			t.Errorf("peak RSS %.0f MiB, over %d MiB", rss, hostileRSSMiB)
		}
		t.Logf("peak RSS %.0f MiB", rss)
	}
	check(t)
	took := srv.terminate(t, 2*time.Second+closeGrace+drainSlack)
	t.Logf("SIGTERM: exited in %s", took)
	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	check(t)
}

func getBody(t *testing.T, url string) []byte {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer k1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s = %d %s", url, resp.StatusCode, body)
	}
	return body
}

// SIGTERM while gate 2 compiles a schema for minutes (the bounds raised
// so it may: 100,000 distinct properties, nothing to share) ends the
// process within the shutdown grace and the closing time, not when the
// compile ends: the call's wait is cut at the drain deadline, and the
// execution is left to resume from its ledger.
func TestSIGTERMDuringAGate2Compile(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	docs := writeDocs(t, map[string][]byte{"flat": openapitest.Flat(100_000)})
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  flat: { openapi: { url: %q, baseUrl: %q, maxSchemaNodes: 10000000, maxSchemaBytes: 104857600 } }
allowlists:
  default:
    connections:
      flat: { ops: ["*"] }
`, docs["flat"], okAPI(t)))
	const grace = 2 * time.Second
	srv := oneReplica(t, st, cfg, "PATCHBAY_SHUTDOWN_GRACE=2s", "PATCHBAY_SCHEMA_MAX_NODES=10000000",
		"PATCHBAY_SCHEMA_COMPILE_TIMEOUT=1h", "PATCHBAY_LOG_LEVEL=info")
	base := "http://" + srv.addr
	status, ex := postJSON(t, base+"/v1/executions", "k1", `{"workflow":{"version":1,"connections":{"flat":{}},
		"root":{"kind":"call","id":"c","connection":"flat","op":"flat","args":{"f1":1}}}}`)
	if status != 202 {
		t.Fatalf("submit = %d %v", status, ex)
	}
	id, _ := ex["id"].(string)
	waitUntil(t, "the execution runs", func() bool {
		var got struct{ Status string }
		getJSON(t, base+"/v1/executions/"+id, &got)
		return got.Status == "running"
	})
	// The compile is under way when the process burns CPU: a third of a
	// core over a second at least once (an idle server uses a few
	// percent; on a busy machine the compile may get little for a while).
	pid := srv.cmd.Process.Pid
	busiest := time.Duration(0)
	for deadline := time.Now().Add(30 * time.Second); busiest < 300*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatalf("at most %s of CPU in a second: no compile running", busiest)
		}
		before := cpuTime(t, pid)
		time.Sleep(time.Second)
		busiest = max(busiest, cpuTime(t, pid)-before)
	}
	took := srv.terminate(t, grace+closeGrace+drainSlack)
	t.Logf("SIGTERM during a compile: exited in %s", took)
	out, _ := os.ReadFile(srv.logPath)
	if !bytes.Contains(out, []byte("executions still running at the shutdown deadline")) {
		t.Errorf("no word of the executions left running:\n%s", out)
	}
}

// cpuTime is the user and system time a process has used.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (which may hold spaces) end with ')'.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// The watchdog ends the process once shutting down overruns its deadline,
// counted from the signal, and never once run has returned.
func TestWatchdog(t *testing.T) {
	t.Parallel()
	newDog := func() (*watchdog, chan int) {
		exits := make(chan int, 1)
		return &watchdog{after: 50 * time.Millisecond, logger: slog.New(slog.DiscardHandler), exit: func(code int) { exits <- code }}, exits
	}
	dog, exits := newDog()
	dog.arm()
	select {
	case code := <-exits:
		if code != 1 {
			t.Fatalf("exit code %d", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an overrun shutdown did not exit")
	}
	for name, steps := range map[string][]func(*watchdog){
		"returned in time":         {(*watchdog).arm, (*watchdog).disarm},
		"signalled after returned": {(*watchdog).disarm, (*watchdog).arm},
	} {
		dog, exits := newDog()
		for _, step := range steps {
			step(dog)
		}
		select {
		case <-exits:
			t.Fatalf("%s: exited", name)
		case <-time.After(300 * time.Millisecond):
		}
	}
}
