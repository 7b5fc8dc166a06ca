package mcp_test

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// everythingVersion is the @modelcontextprotocol/server-everything the
// interop tests run. It is pinned so a new release cannot change a test
// result without a commit.
const everythingVersion = "2026.8.31"

// everything returns the entry script of server-everything, installed into
// .cache/npm on first use.
func everything(t *testing.T) (node, script string) {
	t.Helper()
	dir := npmtest.Require(t, "everything", "@modelcontextprotocol/server-everything@"+everythingVersion)
	node, err := exec.LookPath("node")
	if err != nil {
		if npmtest.CI() {
			t.Fatalf("CI=true and node is not on PATH: %v", err)
		}
		t.Skipf("node is not on PATH: %v", err)
	}
	return node, filepath.Join(dir, "dist", "index.js")
}

// startNodeHTTP runs an npm server on 127.0.0.1 and a free port (see
// npmtest.LoopbackPreload) and returns its base URL. It is killed at cleanup.
func startNodeHTTP(t *testing.T, node string, args ...string) string {
	t.Helper()
	cmd := exec.Command(node, append([]string{"--import", npmtest.LoopbackPreload()}, args...)...)
	cmd.Env = []string{"PORT=0", "PATH=" + filepath.Dir(node)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	found := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stderr)
		sent := false
		for lines.Scan() {
			if addr, ok := strings.CutPrefix(lines.Text(), "PATCHBAY_LISTENING "); ok && !sent {
				found <- addr
				sent = true
			}
		}
		if !sent {
			close(found)
		}
	}()
	select {
	case addr, ok := <-found:
		if !ok || !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Fatalf("server did not report a loopback address (got %q)", addr)
		}
		return "http://" + addr
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start listening within 30s")
	}
	return ""
}

func TestInteropServerEverything(t *testing.T) {
	t.Parallel()
	node, script := everything(t)
	tests := []struct {
		name    string
		spec    func(t *testing.T) config.MCP
		kind    string
		wantEra string
	}{
		{"stdio", func(*testing.T) config.MCP {
			return config.MCP{Command: node, Args: []string{script, "stdio"}}
		}, "stdio", ""},
		{"streamableHttp", func(t *testing.T) config.MCP {
			return config.MCP{URL: startNodeHTTP(t, node, script, "streamableHttp") + "/mcp"}
		}, "http", ""},
		{"sse fallback", func(t *testing.T) config.MCP {
			return config.MCP{URL: startNodeHTTP(t, node, script, "sse") + "/sse"}
		}, "sse", pbmcp.EraSSE},
		{"sse explicit", func(t *testing.T) config.MCP {
			return config.MCP{Type: "sse", URL: startNodeHTTP(t, node, script, "sse") + "/sse"}
		}, "sse", pbmcp.EraSSE},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			spec := tt.spec(t)
			spec.TimeoutMs = 60_000
			conn := openConn(t, "everything", spec, nil)
			info := conn.Info()
			if info["transport"] != tt.kind {
				t.Errorf("transport = %v, want %s (info %v)", info["transport"], tt.kind, info)
			}
			if tt.wantEra != "" && info["era"] != tt.wantEra {
				t.Errorf("era = %v, want %s", info["era"], tt.wantEra)
			}
			t.Logf("info: %v", info)
			m := conn.Manifest()
			for _, name := range []string{"echo", "get-sum", "get-structured-content", "get-tiny-image", "trigger-long-running-operation"} {
				if _, ok := m.Operation(name); !ok {
					t.Errorf("tool %s not listed", name)
				}
			}
			if len(m.Operations) < 10 {
				t.Errorf("only %d tools listed", len(m.Operations))
			}
			if op, _ := m.Operation("get-sum"); op.Annotations.ReadOnlyHint == nil || !*op.Annotations.ReadOnlyHint || op.Annotations.Title == "" {
				t.Errorf("get-sum annotations = %+v", op.Annotations)
			}

			calls := []struct {
				op   string
				args map[string]any
				want any
			}{
				{"echo", map[string]any{"message": "hello é"}, "Echo: hello é"},
				{"get-sum", map[string]any{"a": 2, "b": 40}, "The sum of 2 and 40 is 42."},
				{"get-structured-content", map[string]any{"location": "New York"},
					map[string]any{"temperature": 33.0, "conditions": "Cloudy", "humidity": 82.0}},
			}
			for _, c := range calls {
				got, err := conn.Call(t.Context(), connect.CallRequest{Op: c.op, Args: c.args, IdempotencyKey: "k-" + c.op})
				if err != nil {
					t.Errorf("%s: %v", c.op, err)
					continue
				}
				if !reflect.DeepEqual(got, c.want) {
					t.Errorf("%s = %#v, want %#v", c.op, got, c.want)
				}
			}
			// A server request patchbay never answers with content: the
			// sampling tool must fail cleanly, not hang.
			if _, ok := m.Operation("trigger-sampling-request"); ok {
				_, err := conn.Call(t.Context(), connect.CallRequest{Op: "trigger-sampling-request", Args: map[string]any{"prompt": "hi"}})
				if err == nil {
					t.Errorf("trigger-sampling-request succeeded without a sampling capability")
				}
			}
		})
	}
}
