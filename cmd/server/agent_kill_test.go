package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/modeltest"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestAgentNodeResumesAfterKill kills the server (SIGKILL) while the real
// Codex agent of an acp-agent node waits on its model, after its first
// tool call went through the bridge. The restarted server ends what is
// left of the old agent, starts it again and sends the prompt again; the
// tool call the agent makes again is answered from the ledger, not sent
// again, and no agent process outlives the run.
func TestAgentNodeResumesAfterKill(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") that outlives the process")
	}
	bin := npmtest.CodexACP(t)
	st := storetest.New(t)
	count, mcpSrv := newCounter()
	t.Cleanup(mcpSrv.Close)

	held := make(chan struct{}, 1)
	hold := make(chan struct{})
	var requests atomic.Int32
	var cut atomic.Bool
	model := modeltest.NewResponses(t, func(req modeltest.ResponsesRequest) modeltest.Reply {
		requests.Add(1)
		if len(req.ToolOutputs()) == 0 {
			_, ns, _ := req.Tool("counter_effect")
			return modeltest.Reply{ToolCalls: []modeltest.FunctionCall{{Name: "counter_effect", Namespace: ns, Arguments: `{"step":"one"}`}}}
		}
		if cut.CompareAndSwap(false, true) { // the first answer after the call: the kill lands here
			held <- struct{}{}
			return modeltest.Reply{Hold: hold, Text: "cut short"}
		}
		return modeltest.Text("The effect ran.")
	})

	home := t.TempDir()
	env := map[string]string{}
	for _, kv := range npmtest.CodexEnv(home) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	cfg, _ := json.Marshal(map[string]any{
		"connections": map[string]any{"counter": map[string]any{"mcp": map[string]any{"type": "http", "url": mcpSrv.URL + "/mcp"}}},
		"agents": map[string]any{"codex": map[string]any{
			"command": bin, "args": npmtest.CodexArgs(model.URL), "env": env, "determinism": "replayable", "timeoutMs": 120000,
		}},
		"allowlists": map[string]any{"default": map[string]any{
			"connections": map[string]any{"counter": map[string]any{"ops": []string{"*"}}}, "agents": []string{"codex"},
		}},
	})
	srv := oneReplica(t, st, writeConfig(t, string(cfg)))
	doc := `{"workflow":{"version":1,"connections":{"counter":{}},"root":{"kind":"acp-agent","id":"coder","agent":"codex","prompt":"run the effect"}}}`
	status, ex := post2(srv.addr, "k1", []byte(doc))
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ex)
	}
	id := ex["id"].(string)
	select {
	case <-held:
	case <-time.After(60 * time.Second):
		out, _ := os.ReadFile(srv.logPath)
		t.Fatalf("the model never saw the tool's output; log:\n%s", out)
	}
	agents := processesWithEnv(t, "CODEX_HOME="+home)
	if len(agents) == 0 {
		t.Fatal("no agent process found while the node runs")
	}
	srv.kill()
	close(hold)
	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	ex = waitDone(t, "http://"+srv.addr, id)
	if ex["status"] != "succeeded" || ex["output"] != "The effect ran." {
		out, _ := os.ReadFile(srv.logPath)
		t.Fatalf("execution = %v; log:\n%s", ex, out)
	}
	count.mu.Lock()
	sends := map[string]int{}
	for k, n := range count.sends {
		sends[k] = n
	}
	count.mu.Unlock()
	if len(sends) != 1 {
		t.Fatalf("calls reached the server under %d keys, want 1: %v", len(sends), sends)
	}
	for key, n := range sends {
		if !strings.HasPrefix(key, id+":tool:coder.") || n != 1 {
			t.Errorf("the bridged call under %s was sent %d times, want once", key, n)
		}
	}
	if n := requests.Load(); n < 3 {
		t.Errorf("the model was asked %d times; the resumed run did not run the agent again", n)
	}
	for _, pid := range agents {
		waitExited(t, pid)
	}
	if left := processesWithEnv(t, "CODEX_HOME="+home); len(left) > 0 {
		t.Errorf("agent processes left after the run: %v", left)
	}
}

// processesWithEnv lists the live processes whose environment holds kv.
func processesWithEnv(t *testing.T, kv string) []string {
	t.Helper()
	var pids []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		env, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, env...), []byte("\x00"+kv+"\x00")) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join(d, "stat")); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
				continue // a zombie holds nothing
			}
		}
		pids = append(pids, filepath.Base(d))
	}
	return pids
}

func waitExited(t *testing.T, pid string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat("/proc/" + pid); err != nil {
			return
		}
		if stat, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("agent process %s outlived the server that started it", pid)
}
