package npmtest

import (
	"bufio"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PrismVersion pins Stoplight Prism (@stoplight/prism-cli), the mock
// server that answers from an OpenAPI document's examples and validates
// every request against it. 5.14.2 is the newest release whose engines
// allow the Node on PATH here (20); 5.15 and later require Node 24.
const PrismVersion = "5.14.2"

// prismStart bounds Prism's start: a trimmed document takes about two
// seconds on a busy 2-core machine, GitHub's whole one (13 MB) fifteen.
const prismStart = 90 * time.Second

// Prism mocks the OpenAPI document at doc with Prism on 127.0.0.1 and a
// free port, and returns its base URL once it listens. It runs with
// --errors, so a request the document does not allow is answered 4xx with
// an sl-violations header naming what is wrong. It is killed at cleanup.
func Prism(t testing.TB, doc string) string {
	t.Helper()
	dir := Require(t, "prism-cli", "@stoplight/prism-cli@"+PrismVersion)
	node := Node(t)
	cmd := exec.Command(node, "--import", LoopbackPreload(), filepath.Join(dir, "dist", "index.js"),
		"mock", doc, "--host", "127.0.0.1", "--port", "0", "--errors")
	cmd.Env = []string{"PATH=" + filepath.Dir(node), "NO_COLOR=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out logTail
	cmd.Stdout = &out
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	found := make(chan string, 1)
	go func() {
		// The loopback preload prints the address bound; the rest of
		// stderr is kept for the failure message.
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			if addr, ok := strings.CutPrefix(lines.Text(), "PATCHBAY_LISTENING "); ok {
				found <- addr
				_, _ = io.Copy(&out, stderr)
				return
			}
			out.Write([]byte(lines.Text() + "\n"))
		}
		close(found)
	}()
	select {
	case addr, ok := <-found:
		if !ok || !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Fatalf("prism did not report a loopback address (got %q):\n%s", addr, out.String())
		}
		t.Logf("prism %s on %s: listening after %s", PrismVersion, filepath.Base(doc), time.Since(started).Round(time.Millisecond))
		return "http://" + addr
	case <-time.After(prismStart):
		t.Fatalf("prism did not listen within %s:\n%s", prismStart, out.String())
	}
	return ""
}

// logTail keeps the last 8 KiB written to it.
type logTail struct {
	mu sync.Mutex
	b  []byte
}

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if over := len(l.b) - 8<<10; over > 0 {
		l.b = l.b[over:]
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}
