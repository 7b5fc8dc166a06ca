package oauth_test

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
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
	mcpPort, authPort := npmtest.OAuthDemo(t, sdkVersion)
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
