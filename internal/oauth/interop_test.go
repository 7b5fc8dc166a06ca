package oauth_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
	"github.com/patchbay-dev/patchbay/internal/oauth"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// sdkVersion is the @modelcontextprotocol/sdk whose example server and
// demo authorization server the interop test signs in to. Pinned, so a
// release cannot change a result without a commit.
const sdkVersion = "1.32.2"

// TestInteropTypeScriptSDK signs in to the MCP TypeScript SDK's example
// server (simpleStreamableHttp.js --oauth) through its demo authorization
// server, by the real redirects, then lists and calls its greet tool over
// internal/mcp with the service's Transport.
func TestInteropTypeScriptSDK(t *testing.T) {
	t.Parallel()
	dir := npmtest.Require(t, "sdk", "@modelcontextprotocol/sdk@"+sdkVersion)
	node := npmtest.Node(t)
	// The demo needs fixed ports (its URLs are built from them); a port
	// taken between choosing and binding means another try.
	var mcpPort, authPort int
	for attempt := 1; ; attempt++ {
		mcpPort, authPort = freePort(t), freePort(t)
		err := startDemo(t, node, filepath.Join(dir, "dist", "esm", "examples", "server", "simpleStreamableHttp.js"), mcpPort, authPort)
		if err == nil {
			break
		}
		if attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("demo server, attempt %d: %v", attempt, err)
	}
	resourceURL := fmt.Sprintf("http://localhost:%d/mcp", mcpPort)

	// The callback is a real loopback server that completes the sign-in.
	var svc *oauth.Service
	type result struct {
		conn, principal string
		err             error
	}
	done := make(chan result, 1)
	const sessionID = "interop-session"
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, p, err := svc.Complete(r.Context(), sessionID, r.URL.Query())
		done <- result{conn, p, err}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		_, _ = io.WriteString(w, "signed in")
	}))
	t.Cleanup(cb.Close)

	key := make([]byte, 32)
	_, _ = rand.Read(key)
	redactor := secrets.NewSecretRedactor()
	var err error
	svc, err = oauth.New(oauth.Options{Store: storetest.New(t), Key: key, PublicURL: cb.URL, Redactor: redactor, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	svc.Register(oauth.Connection{Name: "demo", ResourceURL: resourceURL})
	provider := pbmcp.New("demo", config.MCP{URL: resourceURL, TimeoutMs: 20_000}, &pbmcp.Options{
		HTTPClient: &http.Client{Transport: svc.Transport("demo", nil)},
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
	})

	// Before signing in the server refuses, and the error says a sign-in
	// is needed (through internal/mcp, so the connection's status can).
	if conn, err := provider.Connect(t.Context()); err == nil {
		conn.Close()
		t.Fatal("connected without signing in")
	} else if !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Errorf("connect before sign-in = %v, want it to wrap connect.ErrNeedsSignIn", err)
	}

	authURL, err := svc.Begin(t.Context(), "demo", "operator", sessionID)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	if !strings.HasPrefix(authURL, fmt.Sprintf("http://localhost:%d/authorize?", authPort)) {
		t.Errorf("authorization URL = %s", authURL)
	}
	// The demo authorization server approves at once and redirects to the
	// callback; a browser would do just this.
	resp, err := http.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	select {
	case r := <-done:
		if r.err != nil || r.conn != "demo" || r.principal != "operator" {
			t.Fatalf("Complete = %q %q %v (page %d: %s)", r.conn, r.principal, r.err, resp.StatusCode, body)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the callback was never reached (page %d: %s)", resp.StatusCode, body)
	}
	acct, err := svc.Account(t.Context(), "demo", "")
	if err != nil || acct.Principal != "operator" {
		t.Fatalf("Account = %+v, %v", acct, err)
	}

	conn, err := provider.Connect(t.Context())
	if err != nil {
		t.Fatalf("connect after sign-in: %v", err)
	}
	defer conn.Close()
	if _, ok := conn.Manifest().Operation("greet"); !ok {
		t.Fatalf("greet not listed: %v", conn.Manifest().Operations)
	}
	out, err := conn.Call(t.Context(), connect.CallRequest{Op: "greet", Args: map[string]any{"name": "patchbay"}})
	if err != nil {
		t.Fatalf("greet: %v", err)
	}
	if got := fmt.Sprint(out); !strings.Contains(got, "Hello, patchbay!") {
		t.Errorf("greet = %s", got)
	}
	h, ok, err := svc.Headers(t.Context(), "demo", "anyone")
	if err != nil || !ok || redactor.String(h["Authorization"]) != "Bearer "+secrets.RedactedText {
		t.Errorf("Headers = %v %v %v (token registered for redaction?)", redactor.String(fmt.Sprint(h)), ok, err)
	}
	// The demo server has no revocation endpoint: Disconnect just forgets.
	if err := svc.Disconnect(t.Context(), "demo", ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := svc.Headers(t.Context(), "demo", ""); !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Errorf("Headers after Disconnect = %v", err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startDemo runs the example server (and its authorization server) on
// loopback and waits until both ports accept connections. It is killed at
// cleanup, or at once when it fails to start.
func startDemo(t *testing.T, node, script string, mcpPort, authPort int) error {
	t.Helper()
	cmd := exec.Command(node, "--import", npmtest.LoopbackPreload(), script, "--oauth")
	cmd.Env = []string{fmt.Sprintf("MCP_PORT=%d", mcpPort), fmt.Sprintf("MCP_AUTH_PORT=%d", authPort), "PATH=" + filepath.Dir(node)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var logs syncBuffer
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

// syncBuffer collects a child's output for failure messages.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() < 64<<10 {
		b.b.Write(p)
	}
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
