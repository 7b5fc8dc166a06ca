package npmtest

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// OAuthDemo runs the MCP TypeScript SDK's example server
// (simpleStreamableHttp.js --oauth, @modelcontextprotocol/sdk@version)
// with its demo authorization server on loopback, and returns their ports
// once both accept connections; they are killed at cleanup. The demo
// builds its URLs from fixed ports, so a port taken between choosing and
// binding means another try (three in all).
func OAuthDemo(t testing.TB, version string) (mcpPort, authPort int) {
	t.Helper()
	dir := Require(t, "sdk", "@modelcontextprotocol/sdk@"+version)
	node := Node(t)
	script := filepath.Join(dir, "dist", "esm", "examples", "server", "simpleStreamableHttp.js")
	for attempt := 1; ; attempt++ {
		mcpPort, authPort = FreePort(t), FreePort(t)
		err := startOAuthDemo(t, node, script, mcpPort, authPort)
		if err == nil {
			return mcpPort, authPort
		}
		if attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("demo server, attempt %d: %v", attempt, err)
	}
}

// FreePort is a loopback port free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startOAuthDemo starts the demo and waits until both ports accept
// connections; it is killed at once when it fails to start.
func startOAuthDemo(t testing.TB, node, script string, mcpPort, authPort int) error {
	t.Helper()
	cmd := exec.Command(node, "--import", LoopbackPreload(), script, "--oauth")
	cmd.Env = []string{fmt.Sprintf("MCP_PORT=%d", mcpPort), fmt.Sprintf("MCP_AUTH_PORT=%d", authPort), "PATH=" + filepath.Dir(node)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var logs outputBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, port := range []int{mcpPort, authPort} {
		for {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
			if err == nil {
				c.Close()
				break
			}
			select {
			case <-exited:
				return fmt.Errorf("the demo server exited: %s", logs.String())
			default:
			}
			if time.Now().After(deadline) {
				stop()
				return fmt.Errorf("the demo server did not listen on %d within 30s: %s", port, logs.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Cleanup(stop)
	return nil
}

// outputBuffer collects a child's output (its first 64 KiB) for failure
// messages.
type outputBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *outputBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() < 64<<10 {
		b.b.Write(p)
	}
	return len(p), nil
}

func (b *outputBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
