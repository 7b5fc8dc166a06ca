package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// redisProc is a redis-server of the test's own, with AOF fsynced on every
// write, that can be killed and started again on the same port and files.
type redisProc struct {
	port string
	dir  string
	cmd  *exec.Cmd
}

func (r *redisProc) start(t *testing.T) {
	t.Helper()
	r.cmd = exec.Command("redis-server", "--port", r.port, "--bind", "127.0.0.1", "--dir", r.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--maxmemory-policy", "noeviction")
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", "127.0.0.1:"+r.port); err == nil {
			c.Close()
			return
		}
	}
	t.Fatal("redis-server did not start")
}

func (r *redisProc) kill() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	}
}

// TestRedisRestartLosesNoExecution kills redis-server (SIGKILL; AOF with
// appendfsync always) in the middle of a run and starts it again: every
// execution the API accepted (202) before, during or after must finish.
func TestRedisRestartLosesNoExecution(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires redis-server on PATH")
		}
		t.Skip("needs redis-server on PATH")
	}
	_, mcpSrv := newCounter()
	t.Cleanup(mcpSrv.Close)
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(freeAddr(t))
	rp := &redisProc{port: port, dir: t.TempDir()}
	rp.start(t)
	t.Cleanup(rp.kill)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  counter: { mcp: { type: http, url: %q } }
allowlists:
  default: { connections: { counter: { ops: ["*"] } } }
`, mcpSrv.URL+"/mcp"))
	srv := &replica{bin: serverBin, addr: addr, logPath: filepath.Join(t.TempDir(), "server.log"), env: []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "REDIS_URL=redis://127.0.0.1:" + port + "/0",
		"PATCHBAY_CONFIG=" + cfg, "PATCHBAY_ADDR=" + addr, "PATCHBAY_API_KEYS=k", "PATCHBAY_LOG_LEVEL=warn",
		"PATCHBAY_CLAIM_TIMEOUT=2s",
	}}
	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.kill)

	body := []byte(`{"workflow":{"version":1,"connections":{"counter":{}},"root":{"kind":"sequence","id":"m","steps":[
		{"effect":{"step":"one"}},{"effect":{"step":"two"}}]}}}`)
	var mu sync.Mutex
	var accepted []string
	refused := 0
	stop := make(chan struct{})
	var sender sync.WaitGroup
	sender.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			status, ex := post2(addr, "k", body)
			mu.Lock()
			if status == http.StatusAccepted {
				accepted = append(accepted, ex["id"].(string))
			} else {
				refused++
			}
			mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	})
	time.Sleep(time.Second)
	rp.kill()
	time.Sleep(500 * time.Millisecond)
	rp.start(t)
	time.Sleep(time.Second)
	close(stop)
	sender.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(accepted) == 0 {
		t.Fatal("nothing was accepted")
	}
	pending := map[string]bool{}
	for _, id := range accepted {
		pending[id] = true
	}
	start := time.Now()
	for len(pending) > 0 && time.Since(start) < 60*time.Second {
		for id := range pending {
			status, ex := get2(addr, "k", "/v1/executions/"+id)
			switch {
			case status == http.StatusNotFound:
				t.Fatalf("accepted execution %s is gone after the restart", id)
			case status == 200 && ex["status"] == "succeeded":
				delete(pending, id)
			case status == 200 && (ex["status"] == "failed" || ex["status"] == "cancelled"):
				t.Fatalf("%s ended %s: %v", id, ex["status"], ex["error"])
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(pending) > 0 {
		logs, _ := os.ReadFile(srv.logPath)
		t.Fatalf("%d of %d accepted executions did not finish after the restart:\n%s", len(pending), len(accepted), logs)
	}
	t.Logf("%d accepted (%d refused while Redis was down), all succeeded; drained in %s", len(accepted), refused, time.Since(start).Round(time.Millisecond))
}
