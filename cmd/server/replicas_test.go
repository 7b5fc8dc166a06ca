package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"
)

// proc is a server process started from the built binary.
type proc struct {
	url string
	cmd *exec.Cmd
	out *syncBuffer
}

func startProcess(t *testing.T, env map[string]string) *proc {
	t.Helper()
	cmd := exec.Command(serverBin)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	re := regexp.MustCompile(`patchbay listening on (http://\S+)`)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			if resp, err := http.Get(m[1] + "/readyz"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return &proc{url: m[1], cmd: cmd, out: out}
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("server process not ready:\n%s", out)
	return nil
}

func call(t *testing.T, method, url, key string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

// TestApprovalAcrossTwoProcesses starts an execution on one server process,
// approves its guarded call on another, and sees it finish: both on one
// real Redis. The approved run continues on whichever process reads its
// work item first, and each process has its own stdio demo server (a new
// instance), so demo is replayable: its results recorded on one process
// stand on the other.
func TestApprovalAcrossTwoProcesses(t *testing.T) {
	t.Parallel()
	redisURL := os.Getenv("PATCHBAY_TEST_REDIS_URL")
	if redisURL == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI requires PATCHBAY_TEST_REDIS_URL")
		}
		t.Skip("needs a real Redis shared by two processes: set PATCHBAY_TEST_REDIS_URL")
	}
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  demo:
    mcp: { command: %q }
    policy: { approve: ["note_put"] }
    determinism: replayable
allowlists:
  default:
    connections:
      demo: { ops: ["*"] }
apiKeys:
  - { name: oncall, key: approver-key, allowlist: default, roles: [approve] }
`, demoBin))
	env := map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"REDIS_URL": redisURL, "PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	}
	a, b := startProcess(t, env), startProcess(t, env)

	var doc map[string]any
	data, err := os.ReadFile("../../examples/hello.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	delete(doc, "wait")
	status, ex := call(t, "POST", a.url+"/v1/executions", "k1", doc)
	if status != 202 {
		t.Fatalf("POST on A = %d %v", status, ex)
	}
	id := ex["id"].(string)

	var approval string
	for deadline := time.Now().Add(15 * time.Second); approval == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_, list := call(t, "GET", b.url+"/v1/approvals?state=pending", "k1", nil)
		for _, it := range list["items"].([]any) {
			if ap := it.(map[string]any); ap["execution"] == id {
				approval = ap["id"].(string)
			}
		}
	}
	if approval == "" {
		t.Fatalf("no approval seen on B\nA:\n%s\nB:\n%s", a.out, b.out)
	}
	if _, got := call(t, "GET", a.url+"/v1/executions/"+id, "k1", nil); got["status"] != "waiting" {
		t.Fatalf("status while waiting = %v", got["status"])
	}
	if status, ap := call(t, "POST", b.url+"/v1/approvals/"+approval+"/approve", "approver-key", map[string]any{"note": "from B"}); status != 200 || ap["decidedBy"] != "oncall" {
		t.Fatalf("approve on B = %d %v", status, ap)
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_, got := call(t, "GET", a.url+"/v1/executions/"+id, "k1", nil)
		if got["status"] == "succeeded" {
			if out := got["output"].(map[string]any); out["value"] != "hello, patchbay: 5" {
				t.Fatalf("output = %v", out)
			}
			return
		}
		if got["status"] == "failed" {
			t.Fatalf("execution failed: %v", got["error"])
		}
	}
	t.Fatalf("execution did not finish\nA:\n%s\nB:\n%s", a.out, b.out)
}
