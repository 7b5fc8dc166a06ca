package mcp_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// eraServer is a fake Streamable HTTP MCP server of one era: "2025" hands
// out an Mcp-Session-Id at initialize and answers 404 to unknown (or
// expired) sessions; "2026" answers server/discover and keeps no session.
// It records which Authorization rode on which session, and can expire
// sessions and break response streams on purpose. Its one tool, whoami,
// answers with the Authorization and session it was called with.
type eraServer struct {
	era string

	mu       sync.Mutex
	sessions map[string]string // live session → the Authorization that opened it
	next     int
	requests []seen
	deleted  []string
	mismatch []string // requests whose Authorization was not their session's
	// expire[auth] is how many of the next tools/call with that
	// Authorization are answered 404 (the session forgotten).
	expire map[string]int
	// breaks is how many of the next tools/call get a response stream that
	// ends before the response (-1: every one); abort breaks the connection
	// instead of ending the stream cleanly.
	breaks int
	abort  bool
	// refuse is an Authorization answered with 401.
	refuse string
}

type seen struct {
	session, auth, method, id string
}

func newEraServer(t *testing.T, era string) (*eraServer, string) {
	t.Helper()
	f := &eraServer{era: era, sessions: map[string]string{}, expire: map[string]int{}}
	ts := httptest.NewServer(f)
	t.Cleanup(ts.Close)
	return f, ts.URL + "/mcp"
}

func (f *eraServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid, auth := r.Header.Get("Mcp-Session-Id"), r.Header.Get("Authorization")
	switch r.Method {
	case http.MethodDelete:
		f.mu.Lock()
		delete(f.sessions, sid)
		f.deleted = append(f.deleted, sid)
		f.mu.Unlock()
		return
	case http.MethodPost:
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	var req struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.requests = append(f.requests, seen{session: sid, auth: auth, method: req.Method, id: string(req.ID)})
	if f.refuse != "" && auth == f.refuse {
		f.mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if f.era == "2025" && req.Method != "initialize" && req.Method != "server/discover" {
		opener, ok := f.sessions[sid]
		if ok && req.Method == "tools/call" && f.expire[auth] > 0 {
			f.expire[auth]--
			delete(f.sessions, sid)
			ok = false
		}
		if !ok {
			f.mu.Unlock()
			http.Error(w, "no such session", http.StatusNotFound)
			return
		}
		if opener != auth {
			f.mismatch = append(f.mismatch, fmt.Sprintf("%s on session %s of %q: %q", req.Method, sid, opener, auth))
		}
	}
	if f.era == "2026" && sid != "" {
		f.mismatch = append(f.mismatch, "a session id on a 2026-07-28 request")
	}
	breakStream := req.Method == "tools/call" && f.breaks != 0
	if breakStream && f.breaks > 0 {
		f.breaks--
	}
	abort := f.abort
	f.mu.Unlock()

	if req.ID == nil {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	if breakStream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n"))
		w.(http.Flusher).Flush()
		if abort {
			_, _ = w.Write([]byte("data: {\"jsonrpc\":\"2.0\",\"id\":" + string(req.ID)))
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // the connection breaks mid-event
		}
		return // the stream ends before the response
	}
	resp := map[string]any{"jsonrpc": "2.0", "id": req.ID}
	switch {
	case req.Method == "initialize" && f.era == "2025":
		f.mu.Lock()
		f.next++
		sid = fmt.Sprintf("s%d", f.next)
		f.sessions[sid] = auth
		f.mu.Unlock()
		w.Header().Set("Mcp-Session-Id", sid)
		resp["result"] = map[string]any{"protocolVersion": "2025-06-18",
			"capabilities": map[string]any{"tools": map[string]any{}}, "serverInfo": map[string]any{"name": "era", "version": "1"}}
	case req.Method == "server/discover" && f.era == "2026":
		resp["result"] = map[string]any{"supportedVersions": []string{mcp.LATEST_PROTOCOL_VERSION},
			"capabilities": map[string]any{"tools": map[string]any{}},
			"_meta":        map[string]any{mcp.MetaKeyServerInfo: map[string]any{"name": "era", "version": "1"}}}
	case req.Method == "tools/list":
		resp["result"] = map[string]any{"tools": []any{map[string]any{"name": "whoami", "inputSchema": map[string]any{"type": "object"}}}}
	case req.Method == "tools/call":
		resp["result"] = map[string]any{"content": []any{}, "structuredContent": map[string]any{"auth": auth, "session": sid}}
	default:
		resp["error"] = map[string]any{"code": mcp.METHOD_NOT_FOUND, "message": "method not found"}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// log returns a copy of what the server saw.
func (f *eraServer) log() (requests []seen, sessions map[string]string, deleted, mismatch []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sessions = map[string]string{}
	for k, v := range f.sessions {
		sessions[k] = v
	}
	return slices.Clone(f.requests), sessions, slices.Clone(f.deleted), slices.Clone(f.mismatch)
}

func (f *eraServer) set(fn func(f *eraServer)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// whoami calls the fake's tool with headers and returns the Authorization
// and session the server saw it on. It may run on any goroutine, so a
// failure is reported with Errorf and empty results.
func whoami(t *testing.T, conn connect.Conn, headers map[string]string) (auth, session string) {
	t.Helper()
	got, err := conn.Call(t.Context(), connect.CallRequest{Op: "whoami", Principal: "p", Headers: headers})
	if err != nil {
		t.Errorf("whoami with %d headers: %v", len(headers), err)
		return "", ""
	}
	m, _ := got.(map[string]any)
	auth, _ = m["auth"].(string)
	session, _ = m["session"].(string)
	return auth, session
}

const discoveryAuth = "Bearer discovery"

// TestTenantSessions: calls with per-call headers go out on a session of
// their own per distinct header set, reused by later calls with that set;
// two tenants and discovery never share a session; Close closes them all.
func TestTenantSessions(t *testing.T) {
	t.Parallel()
	for _, era := range []string{"2025", "2026"} {
		t.Run(era, func(t *testing.T) {
			t.Parallel()
			fake, url := newEraServer(t, era)
			conn := openConn(t, "tenants", config.MCP{URL: url, Headers: map[string]string{"Authorization": discoveryAuth, "X-Team": "ops"}}, nil)
			alice := map[string]string{"Authorization": "Bearer alice"}
			bob := map[string]string{"authorization": "Bearer bob"} // names compare case-insensitively

			callers := []struct {
				headers map[string]string
				want    string
			}{{nil, discoveryAuth}, {alice, "Bearer alice"}, {bob, "Bearer bob"}}
			var wg sync.WaitGroup
			var mu sync.Mutex
			sessionsOf := map[string]map[string]bool{} // auth → sessions its calls rode on
			for i := range 12 {
				caller := callers[i%len(callers)]
				wg.Go(func() {
					auth, session := whoami(t, conn, caller.headers)
					if auth != caller.want {
						t.Errorf("a call for %q arrived with Authorization %q", caller.want, auth)
					}
					mu.Lock()
					if sessionsOf[auth] == nil {
						sessionsOf[auth] = map[string]bool{}
					}
					sessionsOf[auth][session] = true
					mu.Unlock()
				})
			}
			wg.Wait()
			if n := conn.Info()["tenantSessions"]; n != 2 {
				t.Errorf("tenantSessions = %v, want 2", n)
			}

			requests, _, _, mismatch := fake.log()
			if len(mismatch) > 0 {
				t.Errorf("requests on another tenant's session: %v", mismatch)
			}
			opens := map[string]int{} // auth → initialize or server/discover requests
			for _, r := range requests {
				if r.method == "initialize" || r.method == "server/discover" && era == "2026" {
					opens[r.auth]++
				}
				if r.method == "initialize" && era == "2026" {
					t.Errorf("initialize sent to a 2026-07-28 server with %q", r.auth)
				}
			}
			for _, auth := range []string{discoveryAuth, "Bearer alice", "Bearer bob"} {
				if opens[auth] != 1 {
					t.Errorf("%q opened %d sessions, want 1 (opens %v)", auth, opens[auth], opens)
				}
				if era == "2025" && len(sessionsOf[auth]) != 1 {
					t.Errorf("%q rode on sessions %v, want one", auth, sessionsOf[auth])
				}
			}
			if era == "2025" {
				all := map[string]bool{}
				for _, ss := range sessionsOf {
					for s := range ss {
						if all[s] {
							t.Errorf("session %s carried two Authorizations: %v", s, sessionsOf)
						}
						all[s] = true
					}
				}
			}

			if err := conn.Close(); err != nil {
				t.Fatal(err)
			}
			if n := conn.Info()["tenantSessions"]; n != 0 {
				t.Errorf("tenantSessions after Close = %v", n)
			}
			if era == "2025" {
				_, live, deleted, _ := fake.log()
				if len(live) != 0 || len(deleted) != 3 {
					t.Errorf("after Close: live sessions %v, deleted %v; want none live, 3 deleted", live, deleted)
				}
			}
		})
	}
}

// TestTenantSessionBound: at most 64 tenant sessions stay open; the least
// recently used is closed (its session deleted) and opened again if needed.
func TestTenantSessionBound(t *testing.T) {
	t.Parallel()
	fake, url := newEraServer(t, "2025")
	conn := openConn(t, "many", config.MCP{URL: url, Headers: map[string]string{"Authorization": discoveryAuth}}, nil)
	tenant := func(i int) map[string]string { return map[string]string{"Authorization": fmt.Sprintf("Bearer t%d", i)} }
	_, first := whoami(t, conn, tenant(0))
	for i := 1; i <= 64; i++ {
		whoami(t, conn, tenant(i))
	}
	if n := conn.Info()["tenantSessions"]; n != 64 {
		t.Errorf("tenantSessions = %v, want 64", n)
	}
	waitFor(t, "the oldest session deleted", func() bool {
		_, _, deleted, _ := fake.log()
		return slices.Contains(deleted, first)
	})
	auth, again := whoami(t, conn, tenant(0))
	if auth != "Bearer t0" || again == first {
		t.Errorf("tenant 0 after eviction: %q on %s (was %s)", auth, again, first)
	}
	if _, _, _, mismatch := fake.log(); len(mismatch) > 0 {
		t.Errorf("mismatches: %v", mismatch)
	}
}

// TestTenantFaults: a tenant whose credentials the server refuses, or
// whose headers are unusable, fails its own calls only, with a clear error.
func TestTenantFaults(t *testing.T) {
	t.Parallel()
	for _, era := range []string{"2025", "2026"} {
		t.Run(era, func(t *testing.T) {
			t.Parallel()
			fake, url := newEraServer(t, era)
			fake.set(func(f *eraServer) { f.refuse = "Bearer mallory" })
			conn := openConn(t, "faults", config.MCP{URL: url}, nil)
			_, err := conn.Call(t.Context(), connect.CallRequest{Op: "whoami", Principal: "mallory",
				Headers: map[string]string{"Authorization": "Bearer mallory"}})
			if !errors.Is(err, connect.ErrNeedsSignIn) || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), `principal "mallory"`) {
				t.Errorf("refused tenant: err = %v, want ErrNeedsSignIn naming 401", err)
			}
			if err != nil && strings.Contains(err.Error(), "Bearer mallory") {
				t.Errorf("the error shows the header value: %v", err)
			}
			for _, bad := range []struct {
				headers map[string]string
				want    string
			}{
				{map[string]string{"Mcp-Session-Id": "s1"}, "Mcp-Session-Id: set by the transport"},
				{map[string]string{"Bad Name": "x"}, "not a valid header name"},
				{map[string]string{"X-Token": "a\r\nInjected: yes"}, "line break"},
				{map[string]string{"X-Token": "a", "x-token": "b"}, "given twice"},
			} {
				_, err := conn.Call(t.Context(), connect.CallRequest{Op: "whoami", Headers: bad.headers})
				if err == nil || !strings.Contains(err.Error(), bad.want) {
					t.Errorf("headers %v: err = %v, want %q", bad.headers, err, bad.want)
				}
			}
			if auth, _ := whoami(t, conn, map[string]string{"Authorization": "Bearer alice"}); auth != "Bearer alice" {
				t.Errorf("another tenant: %q", auth)
			}
			if _, err := conn.Call(t.Context(), connect.CallRequest{Op: "whoami"}); err != nil {
				t.Errorf("the connection's own session: %v", err)
			}
			select {
			case <-conn.(interface{ Done() <-chan struct{} }).Done():
				t.Error("a tenant's failure ended the connection")
			default:
			}
		})
	}
}

func TestTenantOverStdioRefused(t *testing.T) {
	t.Parallel()
	conn := openConn(t, "local", config.MCP{Command: demoBin}, nil)
	_, err := conn.Call(t.Context(), connect.CallRequest{Op: "echo", Args: map[string]any{"text": "x"}, Principal: "alice",
		Headers: map[string]string{"Authorization": "Bearer alice"}})
	if err == nil || !strings.Contains(err.Error(), "cannot be sent to a stdio server") {
		t.Fatalf("err = %v", err)
	}
	if _, err := conn.Call(t.Context(), connect.CallRequest{Op: "echo", Args: map[string]any{"text": "x"}}); err != nil {
		t.Errorf("a call without headers: %v", err)
	}
}

// TestSessionExpiry: a 2025 session the server expired (404) is
// re-initialized once and the call sent again, on a new session and with a
// new identity instance; a session expired again right after fails the
// call clearly instead of looping, and the next call recovers. A tenant's
// expiry is handled the same way on its own session.
func TestSessionExpiry(t *testing.T) {
	t.Parallel()
	for _, who := range []string{"discovery", "tenant"} {
		t.Run(who, func(t *testing.T) {
			t.Parallel()
			fake, url := newEraServer(t, "2025")
			conn := openConn(t, "expiry", config.MCP{URL: url, Headers: map[string]string{"Authorization": discoveryAuth}}, nil)
			var headers map[string]string
			auth := discoveryAuth
			if who == "tenant" {
				auth = "Bearer alice"
				headers = map[string]string{"Authorization": auth}
			}
			_, before := whoami(t, conn, headers)
			id := conn.Identity()

			fake.set(func(f *eraServer) { f.expire[auth] = 1 })
			gotAuth, after := whoami(t, conn, headers)
			if gotAuth != auth || after == before || after == "" {
				t.Errorf("after expiry: %q on session %q (was %q)", gotAuth, after, before)
			}
			if now := conn.Identity(); now.Instance != id.Instance || now.Epoch != id.Epoch+1 {
				t.Errorf("identity after re-initialize = %+v, was %+v; want the same instance, the next epoch", now, id)
			}

			fake.set(func(f *eraServer) { f.expire[auth] = 2 })
			inits := countMethod(fake, "initialize")
			_, err := conn.Call(t.Context(), connect.CallRequest{Op: "whoami", Headers: headers})
			if err == nil || !strings.Contains(err.Error(), "expired the session again right after it was re-initialized") {
				t.Fatalf("second expiry: err = %v", err)
			}
			if n := countMethod(fake, "initialize") - inits; n != 1 {
				t.Errorf("%d initialize requests for a double expiry, want 1", n)
			}
			select {
			case <-conn.(interface{ Done() <-chan struct{} }).Done():
				t.Error("the expiry ended the connection")
			default:
			}
			if gotAuth, _ := whoami(t, conn, headers); gotAuth != auth {
				t.Errorf("the call after: %q", gotAuth)
			}
			if _, _, _, mismatch := fake.log(); len(mismatch) > 0 {
				t.Errorf("mismatches: %v", mismatch)
			}
		})
	}
}

func countMethod(f *eraServer, method string) int {
	requests, _, _, _ := f.log()
	n := 0
	for _, r := range requests {
		if r.method == method {
			n++
		}
	}
	return n
}

// TestBrokenStream: a 2026-07-28 response stream that ends or breaks
// before the response is re-issued under a new request id, at most twice;
// then the call fails with ErrStreamBroken. The connection stays up.
func TestBrokenStream(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		breaks  int
		abort   bool
		tenant  bool
		wantErr bool
		calls   int
	}{
		{"ends once", 1, false, false, false, 2},
		{"breaks once", 1, true, false, false, 2},
		{"ends once on a tenant's session", 1, false, true, false, 2},
		{"ends always", -1, false, false, true, 3},
		{"breaks always", -1, true, false, true, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake, url := newEraServer(t, "2026")
			conn := openConn(t, "streams", config.MCP{URL: url}, nil)
			if era := conn.Info()["era"]; era != pbmcp.EraModern {
				t.Fatalf("era = %v", era)
			}
			var headers map[string]string
			if tt.tenant {
				headers = map[string]string{"Authorization": "Bearer alice"}
			}
			fake.set(func(f *eraServer) { f.breaks, f.abort = tt.breaks, tt.abort })
			got, err := conn.Call(t.Context(), connect.CallRequest{Op: "whoami", Headers: headers, IdempotencyKey: "k1"})
			if tt.wantErr {
				if !errors.Is(err, pbmcp.ErrStreamBroken) || !strings.Contains(err.Error(), "on all 3 attempts") {
					t.Errorf("err = %v, want ErrStreamBroken after 3 attempts", err)
				}
			} else if err != nil {
				t.Errorf("Call = %v, %v", got, err)
			}
			requests, _, _, _ := fake.log()
			ids := map[string]bool{}
			for _, r := range requests {
				if r.method == "tools/call" {
					ids[r.id] = true
				}
			}
			if len(ids) != tt.calls {
				t.Errorf("server saw %d distinct tools/call ids, want %d (%v)", len(ids), tt.calls, ids)
			}
			fake.set(func(f *eraServer) { f.breaks = 0 })
			if _, err := conn.Call(t.Context(), connect.CallRequest{Op: "whoami", Headers: headers}); err != nil {
				t.Errorf("the call after: %v", err)
			}
		})
	}
}

// sseServer is a legacy HTTP+SSE server: GET /sse is the event stream,
// POST /message takes requests whose answers go out on the stream. After
// the handshake, flood writes one event that never ends.
type sseServer struct {
	events  chan string
	flood   chan struct{}
	mu      sync.Mutex
	written int64 // bytes of the flood written
}

func (s *sseServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/sse":
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = fmt.Fprint(w, "event: endpoint\ndata: /message\n\n")
		w.(http.Flusher).Flush()
		for {
			select {
			case ev := <-s.events:
				_, _ = fmt.Fprintf(w, "event: message\ndata: %s\n\n", ev)
				w.(http.Flusher).Flush()
			case <-s.flood:
				_, _ = fmt.Fprint(w, "event: message\ndata: ")
				chunk := []byte(strings.Repeat("x", 64<<10))
				for range 1024 { // 64 MiB at most
					if _, err := w.Write(chunk); err != nil {
						return
					}
					s.mu.Lock()
					s.written += int64(len(chunk))
					s.mu.Unlock()
				}
				return
			case <-r.Context().Done():
				return
			}
		}
	case r.Method == http.MethodPost && r.URL.Path == "/message":
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.WriteHeader(http.StatusAccepted)
		if req.ID == nil {
			return
		}
		var result string
		switch req.Method {
		case "initialize":
			result = `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":{"name":"sse","version":"1"}}`
		case "tools/list":
			result = `{"tools":[{"name":"a","inputSchema":{"type":"object"}}]}`
		default:
			result = `{"content":[{"type":"text","text":"ok"}]}`
		}
		s.events <- `{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":` + result + `}`
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// TestSSEEventLimit: one event on the legacy SSE stream larger than
// maxResponseBytes fails the connection with a clear error, without the
// client reading (or buffering) the rest of it.
func TestSSEEventLimit(t *testing.T) {
	t.Parallel()
	srv := &sseServer{events: make(chan string, 4), flood: make(chan struct{})}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	conn := openConn(t, "flood", config.MCP{Type: "sse", URL: ts.URL + "/sse", MaxResponseBytes: 4096}, nil)
	if _, err := conn.Call(t.Context(), connect.CallRequest{Op: "a"}); err != nil {
		t.Fatalf("call before the flood: %v", err)
	}
	close(srv.flood)
	lost := conn.(interface {
		Done() <-chan struct{}
		Err() error
	})
	select {
	case <-lost.Done():
	case <-time.After(15 * time.Second):
		t.Fatal("the connection survived an oversized event")
	}
	if err := lost.Err(); !errors.Is(err, pbmcp.ErrResponseTooLarge) || !strings.Contains(err.Error(), "4096-byte limit (maxResponseBytes)") {
		t.Errorf("Err = %v", err)
	}
	if _, err := conn.Call(t.Context(), connect.CallRequest{Op: "a"}); !errors.Is(err, connect.ErrUnavailable) {
		t.Errorf("call after: %v, want ErrUnavailable", err)
	}
	srv.mu.Lock()
	written := srv.written
	srv.mu.Unlock()
	if written >= 64<<20 {
		t.Errorf("the server wrote the whole %d-byte event: the client kept reading", written)
	}
}
