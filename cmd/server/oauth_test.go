package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/patchbay-dev/patchbay/internal/chromiumtest"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// sdkVersion is the MCP TypeScript SDK whose example server (with its demo
// authorization server) the sign-in test uses, pinned.
const sdkVersion = "@modelcontextprotocol/sdk@1.32.2"

// TestOAuthSignInInTheBrowser is the operator's path end to end against a
// server nobody here wrote: the TypeScript SDK's example server behind its
// demo authorization server. The connection starts as needs_sign_in; in
// headless chromium the operator signs in to the admin UI, clicks Connect,
// goes through the real redirects (discovery, dynamic registration, PKCE)
// and lands on the connection page signed in; the connection turns ready
// and an execution calls its greet tool with the stored token, which shows
// nowhere. Then the per-user path: alice signs in to the UI with her API
// key and connects her own account to a per-user connection; her execution
// uses it, and bob, who has not signed in, is refused.
func TestOAuthSignInInTheBrowser(t *testing.T) {
	t.Parallel()
	sdk := npmtest.Require(t, "sdk", sdkVersion)
	node := npmtest.Node(t)
	chromiumtest.Path(t)
	mcpAddr, authAddr := freeAddr(t), freeAddr(t)
	startNodeServer(t, node, filepath.Join(sdk, "dist", "esm", "examples", "server", "simpleStreamableHttp.js"),
		[]string{"--oauth"}, "MCP_PORT="+port(mcpAddr), "MCP_AUTH_PORT="+port(authAddr))

	const adminTok, apiKey = "oauth-admin-token-0123", "oauth-api-key-0123"
	const aliceKey, bobKey = "oauth-alice-key-0123", "oauth-bob-key-0123"
	addr := freeAddr(t)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  demo: { mcp: { url: "http://localhost:%[1]s/mcp", timeoutMs: 20000 }, auth: oauth }
  mine: { mcp: { url: "http://localhost:%[1]s/mcp", timeoutMs: 20000 }, auth: { oauth: {}, perUser: true } }
allowlists:
  default: { connections: { demo: { ops: ["*"] }, mine: { ops: ["*"] } } }
apiKeys:
  - { name: alice, key: %[2]s, allowlist: default }
  - { name: bob, key: %[3]s, allowlist: default }
`, port(mcpAddr), aliceKey, bobKey))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": addr, "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": apiKey, "PATCHBAY_ADMIN_TOKEN": adminTok,
	})
	if st := connState(t, srv.url, apiKey, "demo"); st != "needs_sign_in" {
		t.Fatalf("before sign-in the connection is %q, want needs_sign_in", st)
	}

	ctx := chromiumtest.Context(t)
	var signedIn, location, state string
	var shot []byte
	err := chromedp.Run(ctx,
		chromedp.Navigate(srv.url+"/admin/sign-in?next=/admin/connections/demo"),
		chromedp.SendKeys(`input[name="token"]`, adminTok, chromedp.ByQuery),
		chromedp.Submit(`input[name="token"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#connect`, chromedp.ByQuery),
		chromedp.Click(`#connect`, chromedp.ByQuery),
		chromedp.WaitVisible(`#signed-in strong`, chromedp.ByQuery),
		chromedp.Text(`#signed-in strong`, &signedIn, chromedp.ByQuery),
		chromedp.Location(&location),
		chromedp.Text(`#state`, &state, chromedp.ByQuery),
		chromedp.FullScreenshot(&shot, 100),
	)
	if err != nil {
		t.Fatalf("browser: %v\n%s", err, srv.output)
	}
	saveScreenshot(t, "oauth-connected.png", shot)
	if signedIn != "admin" || !strings.HasSuffix(location, "/admin/connections/demo?flash=signed-in") || !strings.Contains(state, "ready") {
		t.Fatalf("landed on %s signed in as %q, state %q", location, signedIn, state)
	}

	deadline := time.Now().Add(15 * time.Second)
	for connState(t, srv.url, apiKey, "demo") != "ready" {
		if time.Now().After(deadline) {
			t.Fatalf("not ready after the sign-in:\n%s", srv.output)
		}
		time.Sleep(50 * time.Millisecond)
	}
	doc := `{"version":1,"connections":{"demo":{}},"root":{"kind":"call","id":"hi","connection":"demo","op":"greet","args":{"name":"patchbay"}}}`
	code, body := postJSON(t, srv.url+"/v1/executions", apiKey, `{"workflow":`+doc+`,"wait":"20s"}`)
	if code != http.StatusOK || body["status"] != "succeeded" || !strings.Contains(fmt.Sprint(body["output"]), "Hello, patchbay!") {
		t.Fatalf("execution: %d %v\n%s", code, body, srv.output)
	}
	// A per-user connection: alice signs in to the UI with her API key and
	// connects her own account; her execution uses it, bob (not signed in)
	// is refused at gate 6 before anything is sent.
	err = chromedp.Run(ctx,
		network.ClearBrowserCookies(),
		chromedp.Navigate(srv.url+"/admin/sign-in?next=/admin/connections/mine"),
		chromedp.SendKeys(`input[name="token"]`, aliceKey, chromedp.ByQuery),
		chromedp.Submit(`input[name="token"]`, chromedp.ByQuery),
		chromedp.WaitVisible(`#connect`, chromedp.ByQuery),
		chromedp.Click(`#connect`, chromedp.ByQuery),
		chromedp.WaitVisible(`#signed-in strong`, chromedp.ByQuery),
		chromedp.Text(`#signed-in strong`, &signedIn, chromedp.ByQuery),
	)
	if err != nil || signedIn != "alice" {
		t.Fatalf("alice's sign-in: %v, signed in as %q\n%s", err, signedIn, srv.output)
	}
	doc = strings.ReplaceAll(doc, `"demo"`, `"mine"`)
	code, body = postJSON(t, srv.url+"/v1/executions", aliceKey, `{"workflow":`+doc+`,"wait":"20s"}`)
	if code != http.StatusOK || body["status"] != "succeeded" || !strings.Contains(fmt.Sprint(body["output"]), "Hello, patchbay!") {
		t.Fatalf("alice's execution: %d %v\n%s", code, body, srv.output)
	}
	code, bobs := postJSON(t, srv.url+"/v1/executions", bobKey, `{"workflow":`+doc+`,"wait":"20s"}`)
	bobErr, _ := bobs["error"].(map[string]any)
	if code != http.StatusOK || bobs["status"] != "failed" || bobErr["code"] != "steering_denied" || bobErr["gate"] != 6.0 {
		t.Fatalf("bob's execution without a sign-in: %d %v", code, bobs)
	}

	// The token is the server's (random) to know; what patchbay shows and
	// logs must not carry any bearer credential.
	for what, text := range map[string]string{"execution": fmt.Sprint(body), "log": srv.output.String()} {
		if strings.Contains(strings.ToLower(text), "bearer ") {
			t.Errorf("%s shows a bearer credential:\n%s", what, text)
		}
	}
}

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// startNodeServer runs a Node script on loopback only, in its own process
// group (killed at cleanup), and waits until every port in env
// (VAR=port entries) accepts connections.
func startNodeServer(t *testing.T, node, script string, args []string, env ...string) {
	t.Helper()
	cmd := exec.Command(node, append([]string{"--import", npmtest.LoopbackPreload(), script}, args...)...)
	cmd.Env = append([]string{"PATH=" + filepath.Dir(node)}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for _, kv := range env {
		_, p, _ := strings.Cut(kv, "=")
		for {
			c, err := net.DialTimeout("tcp", "127.0.0.1:"+p, time.Second)
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not listen on %s within 30s", filepath.Base(script), p)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// saveScreenshot leaves a picture in artifacts/screenshots (gitignored).
func saveScreenshot(t *testing.T, name string, png []byte) {
	dir := filepath.Join("..", "..", "artifacts", "screenshots")
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = os.WriteFile(filepath.Join(dir, name), png, 0o644)
	}
}

func connState(t *testing.T, base, key, name string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/connections/"+name, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		State string `json:"state"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&st)
	return st.State
}

func postJSON(t *testing.T, url, key, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}
