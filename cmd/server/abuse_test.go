package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"
)

// fromAddr is an HTTP client whose connections come from local, an
// address of the loopback network: the server sees a different client.
func fromAddr(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return &http.Client{
		Timeout:       10 * time.Second,
		Transport:     &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func send(t *testing.T, c *http.Client, method, url, key string, body io.Reader) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestSlowClientsAreCutOff runs the server with short timeouts and holds
// connections open the ways a slow or hostile client would: each is closed
// by the server. Upper bounds are generous (see cutOffWithin).
func TestSlowClientsAreCutOff(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  deploys:
    source: { events: { deploy.failed: { type: object } } }
    webhooks: { secrets: [%q] }
`, crashSecret))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"PATCHBAY_READ_HEADER_TIMEOUT": "300ms", "PATCHBAY_READ_TIMEOUT": "500ms",
		"PATCHBAY_WRITE_TIMEOUT": "500ms", "PATCHBAY_IDLE_TIMEOUT": "500ms",
	})
	addr := strings.TrimPrefix(srv.url, "http://")
	dial := func(t *testing.T) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("slow headers", func(t *testing.T) {
		t.Parallel()
		c := dial(t)
		go trickle(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ", 50*time.Millisecond)
		closedWithin(t, c, cutOffWithin)
	})
	t.Run("slow webhook body", func(t *testing.T) {
		t.Parallel()
		c := dial(t)
		head := "POST /hooks/deploys HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"webhook-id: msg_1\r\nwebhook-timestamp: " + fmt.Sprint(time.Now().Unix()) + "\r\nwebhook-signature: v1,xx\r\n" +
			"Content-Length: 100000\r\n\r\n{"
		// 100000 bytes at one per 50ms would take over an hour.
		go trickle(c, head, 50*time.Millisecond)
		closedWithin(t, c, cutOffWithin)
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		t.Parallel()
		c := dial(t)
		fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		closedWithin(t, c, cutOffWithin)
	})
}

// TestEventStreamOutlivesTheWriteTimeout: an execution waits for an
// approval for several write (and read) timeouts while its event stream
// is open; the stream stays up and delivers the events that follow.
func TestEventStreamOutlivesTheWriteTimeout(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  demo:
    mcp: { command: %q }
    policy: { approve: ["note_put"] }
allowlists:
  default:
    connections:
      demo: { ops: ["*"] }
apiKeys:
  - { name: oncall, key: approver-key, allowlist: default, roles: [approve] }
`, demoBin))
	const timeout = 300 * time.Millisecond
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1", "PATCHBAY_ADMIN_TOKEN": "the-admin-token",
		"PATCHBAY_READ_HEADER_TIMEOUT": "300ms", "PATCHBAY_READ_TIMEOUT": "300ms", "PATCHBAY_WRITE_TIMEOUT": "300ms",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The admin UI's live approvals list is a stream too: it says
	// "changed" when the pending set changes, the last time after the
	// approval, several timeouts after it opened.
	admin := streamLines(t, ctx, adminSession(t, srv.url, "the-admin-token"), srv.url+"/admin/approvals/stream?v=0", "")
	doc := helloFor(t, "demo")
	var m map[string]any
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "wait")
	body, _ := json.Marshal(m)
	status, ex := postJSON(t, srv.url+"/v1/executions", "k1", string(body))
	if status != 202 {
		t.Fatalf("POST = %d %v", status, ex)
	}
	id := ex["id"].(string)

	lines := streamLines(t, ctx, http.DefaultClient, srv.url+"/v1/executions/"+id+"/events", "k1")
	opened := time.Now()

	// Keep the stream open, waiting for the approval, for several
	// timeouts before deciding it.
	var approval string
	for approval == "" || time.Since(opened) < 5*timeout {
		select {
		case _, ok := <-lines:
			if !ok {
				t.Fatalf("the stream ended %s after it opened, while the execution waited", time.Since(opened))
			}
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no approval appeared")
		}
		if approval == "" {
			approval = pendingApproval(t, srv.url, id)
		}
	}
	if status, ap := postJSON(t, srv.url+"/v1/approvals/"+approval+"/approve", "approver-key", `{}`); status != 200 {
		t.Fatalf("approve = %d %v", status, ap)
	}
	finished := false
	for line := range lines {
		if line == "event: execution.finished" {
			finished = true
			break
		}
	}
	if !finished {
		t.Fatalf("the stream ended without execution.finished, %s after it opened", time.Since(opened))
	}
	// The admin stream saw one pending approval, then none.
	var seen []string
	for line := range admin {
		if strings.HasPrefix(line, "data: ") {
			seen = append(seen, line)
			if line == "data: 0" && len(seen) > 1 {
				return
			}
		}
	}
	t.Fatalf("the admin approvals stream ended after %v, %s after it opened", seen, time.Since(opened))
}

// streamLines opens an event stream and sends its lines until it ends.
func streamLines(t *testing.T, ctx context.Context, c *http.Client, url, key string) <-chan string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s = %d", url, resp.StatusCode)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	return lines
}

// adminSession signs in to the admin UI with token and returns a client
// carrying the session cookie.
func adminSession(t *testing.T, base, token string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(base + "/admin/sign-in")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var csrf string
	for _, ck := range resp.Cookies() {
		if ck.Name == "pb_admin_signin" {
			csrf = ck.Value
		}
	}
	resp, err = c.PostForm(base+"/admin/sign-in", url.Values{"_csrf": {csrf}, "token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("admin sign-in = %d", resp.StatusCode)
	}
	return c
}

func pendingApproval(t *testing.T, base, exec string) string {
	t.Helper()
	return pendingApprovalAs(t, base, "k1", exec)
}

// TestWrongCredentialsAreRateLimited: wrong API keys from one address
// block it (429 with Retry-After) while another address's right key works;
// the block lifts after its backoff; and wrong admin tokens count towards
// the same block.
func TestWrongCredentialsAreRateLimited(t *testing.T) {
	t.Parallel()
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_API_KEYS": "k1", "PATCHBAY_ADMIN_TOKEN": "the-admin-token",
		"PATCHBAY_AUTH_FAILURES": "2", "PATCHBAY_AUTH_BACKOFF": "1s", "PATCHBAY_AUTH_BACKOFF_MAX": "1s",
	})
	// Every address in 127/8 reaches the loopback listener; each is a
	// client of its own.
	attacker, other, signer := fromAddr("127.0.0.2"), fromAddr("127.0.0.3"), fromAddr("127.0.0.4")
	get := func(c *http.Client, key string) *http.Response {
		t.Helper()
		resp := send(t, c, "GET", srv.url+"/v1/connections", key, nil)
		resp.Body.Close()
		return resp
	}
	for i := range 3 {
		if r := get(attacker, "guess"); r.StatusCode != 401 {
			t.Fatalf("wrong key %d = %d, want 401", i+1, r.StatusCode)
		}
	}
	if r := get(attacker, "k1"); r.StatusCode != 429 || r.Header.Get("Retry-After") != "1" {
		t.Fatalf("right key from the blocked address = %d Retry-After %q, want 429 and 1", r.StatusCode, r.Header.Get("Retry-After"))
	}
	if r := get(other, "k1"); r.StatusCode != 200 {
		t.Fatalf("right key from another address = %d, want 200", r.StatusCode)
	}
	deadline := time.Now().Add(cutOffWithin)
	for get(attacker, "k1").StatusCode != 200 {
		if time.Now().After(deadline) {
			t.Fatal("the block did not lift")
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Wrong admin tokens block the API too: one count per address.
	signIn := func(token string) int {
		t.Helper()
		resp := send(t, signer, "GET", srv.url+"/admin/sign-in", "", nil)
		resp.Body.Close()
		var csrf string
		for _, c := range resp.Cookies() {
			if c.Name == "pb_admin_signin" {
				csrf = c.Value
			}
		}
		form := url.Values{"_csrf": {csrf}, "token": {token}}
		req, _ := http.NewRequest("POST", srv.url+"/admin/sign-in", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(&http.Cookie{Name: "pb_admin_signin", Value: csrf})
		resp, err := signer.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 3 {
		if s := signIn("wrong"); s != 401 {
			t.Fatalf("wrong admin token %d = %d, want 401", i+1, s)
		}
	}
	if s := signIn("the-admin-token"); s != 429 {
		t.Fatalf("right admin token from the blocked address = %d, want 429", s)
	}
	if r := get(signer, "k1"); r.StatusCode != 429 {
		t.Fatalf("API from an address blocked for wrong admin tokens = %d, want 429", r.StatusCode)
	}
}
