package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// target is one way of reaching the demo server. spec starts a fresh server
// for the test and returns the connection entry that reaches it.
type target struct {
	name string
	spec func(t *testing.T) config.MCP
}

var targets = []target{
	{"stdio", func(*testing.T) config.MCP { return config.MCP{Command: demoBin} }},
	{"http", func(t *testing.T) config.MCP { _, spec := serveJobs(t); return spec }},
	{"http-binary", startDemoHTTP},
}

// serve serves s over Streamable HTTP in process and returns the base URL.
func serve(t *testing.T, s *server.MCPServer) string {
	t.Helper()
	ts := httptest.NewServer(server.NewStreamableHTTPServer(s))
	t.Cleanup(ts.Close)
	return ts.URL
}

// startDemoHTTP runs cmd/demo-mcp -http 127.0.0.1:0 and returns the URL it
// prints. At cleanup it sends SIGTERM and expects a clean exit.
func startDemoHTTP(t *testing.T) config.MCP {
	t.Helper()
	cmd := exec.Command(demoBin, "-http", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Errorf("signal demo-mcp: %v", err)
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("demo-mcp after SIGTERM: %v", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("demo-mcp did not exit after SIGTERM")
		}
	})
	lines := bufio.NewScanner(stderr)
	if !lines.Scan() {
		t.Fatalf("demo-mcp printed nothing: %v", lines.Err())
	}
	line := lines.Text()
	go func() {
		_, _ = io.Copy(io.Discard, stderr)
		exited <- cmd.Wait()
	}()
	url, ok := strings.CutPrefix(line, "demo-mcp listening on ")
	if !ok || !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/mcp") || strings.Contains(url, ":0/") {
		t.Fatalf("demo-mcp printed %q", line)
	}
	return config.MCP{URL: url}
}

// openConn opens a connection and closes it at cleanup.
func openConn(t *testing.T, name string, spec config.MCP, opts *pbmcp.Options) connect.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	conn, err := pbmcp.New(name, spec, opts).Connect(ctx)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() {
		if err := conn.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return conn
}

func TestManifest(t *testing.T) {
	t.Parallel()
	type want struct {
		required                        []string
		readOnly, destructive, idempote bool
	}
	wants := map[string]want{
		"add":         {[]string{"a", "b"}, true, false, true},
		"echo":        {[]string{"text"}, true, false, true},
		"fail":        {nil, true, false, true},
		"note_get":    {[]string{"key"}, true, false, true},
		"note_put":    {[]string{"key", "value"}, false, false, true},
		"open_ticket": {[]string{"title"}, false, false, false},
		"slow_job":    {[]string{"seconds"}, true, false, true},
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			conn := openConn(t, "demo", tg.spec(t), nil)
			ops := conn.Manifest().Operations
			var names []string
			for _, op := range ops {
				names = append(names, op.Name)
			}
			slices.Sort(names)
			want := []string{"add", "echo", "fail", "note_get", "note_put", "slow_job"}
			if tg.name != "http" { // the binary also raises events
				want = []string{"add", "echo", "fail", "note_get", "note_put", "open_ticket", "slow_job"}
			}
			if !slices.Equal(names, want) {
				t.Fatalf("operations = %v", names)
			}
			for _, op := range ops {
				w := wants[op.Name]
				if op.Description == "" {
					t.Errorf("%s: no description", op.Name)
				}
				var schema struct {
					Type       string         `json:"type"`
					Properties map[string]any `json:"properties"`
					Required   []string       `json:"required"`
				}
				if err := json.Unmarshal(op.InputSchema, &schema); err != nil {
					t.Fatalf("%s: schema %s: %v", op.Name, op.InputSchema, err)
				}
				slices.Sort(schema.Required)
				if schema.Type != "object" || !slices.Equal(schema.Required, w.required) {
					t.Errorf("%s: schema = %s", op.Name, op.InputSchema)
				}
				for _, r := range w.required {
					if _, ok := schema.Properties[r]; !ok {
						t.Errorf("%s: schema has no property %s", op.Name, r)
					}
				}
				a := op.Annotations
				if a.Title == "" || !is(a.ReadOnlyHint, w.readOnly) || !is(a.DestructiveHint, w.destructive) ||
					!is(a.IdempotentHint, w.idempote) || !is(a.OpenWorldHint, false) {
					b, _ := json.Marshal(a)
					t.Errorf("%s: annotations = %s", op.Name, b)
				}
			}
		})
	}
}

func is(p *bool, want bool) bool { return p != nil && *p == want }

func TestCall(t *testing.T) {
	t.Parallel()
	// The steps run in order on one connection: note_get reads what
	// note_put stored.
	steps := []struct {
		name    string
		req     connect.CallRequest
		want    any
		wantErr string // the *connect.CallError message
	}{
		{"echo", connect.CallRequest{Op: "echo", Args: map[string]any{"text": "hello"}},
			map[string]any{"text": "hello"}, ""},
		{"echo sends the idempotency key", connect.CallRequest{Op: "echo", Args: map[string]any{"text": "again"}, IdempotencyKey: "exec-1/step-2"},
			map[string]any{"text": "again", "idempotencyKey": "exec-1/step-2"}, ""},
		{"add", connect.CallRequest{Op: "add", Args: map[string]any{"a": 2, "b": 3.5}},
			map[string]any{"sum": 5.5}, ""},
		{"note_put", connect.CallRequest{Op: "note_put", Args: map[string]any{"key": "k", "value": "v"}},
			map[string]any{"key": "k", "stored": true}, ""},
		{"note_get", connect.CallRequest{Op: "note_get", Args: map[string]any{"key": "k"}},
			map[string]any{"key": "k", "value": "v"}, ""},
		{"note_get unknown key", connect.CallRequest{Op: "note_get", Args: map[string]any{"key": "nope"}},
			nil, "no note named nope"},
		{"fail", connect.CallRequest{Op: "fail"}, nil, "this tool always fails"},
		{"fail with message", connect.CallRequest{Op: "fail", Args: map[string]any{"message": "boom"}}, nil, "boom"},
		{"missing argument", connect.CallRequest{Op: "add", Args: map[string]any{"a": 1}}, nil, `missing required argument "b"`},
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			conn := openConn(t, "demo", tg.spec(t), nil)
			for _, s := range steps {
				got, err := conn.Call(t.Context(), s.req)
				if s.wantErr != "" {
					var ce *connect.CallError
					if !errors.As(err, &ce) || ce.Op != s.req.Op || ce.Message != s.wantErr {
						t.Errorf("%s: got %v, %v; want CallError %q", s.name, got, err, s.wantErr)
					}
					continue
				}
				if err != nil || !reflect.DeepEqual(got, s.want) {
					t.Errorf("%s: got %#v, %v; want %#v", s.name, got, err, s.want)
				}
			}
		})
	}
}

func TestIdentityAndInfo(t *testing.T) {
	t.Parallel()
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			t.Parallel()
			spec := tg.spec(t)
			a := openConn(t, "demo", spec, nil)
			b := openConn(t, "demo", spec, nil)
			ia, ib := a.Identity(), b.Identity()
			if ia.Surface != "mcp" || ia.Epoch != 1 || ia.Instance == "" {
				t.Errorf("identity = %+v", ia)
			}
			// Two stdio connects start two server processes; two HTTP
			// connects reach one server.
			if stdio := spec.Transport() == "stdio"; stdio == (ia.Instance == ib.Instance) {
				t.Errorf("%s: instances %q and %q", spec.Transport(), ia.Instance, ib.Instance)
			}
			info := a.Info()
			want := map[string]any{"transport": spec.Transport(), "serverName": demo.Name, "serverVersion": demo.Version}
			for k, v := range want {
				if info[k] != v {
					t.Errorf("Info()[%q] = %v, want %v (info %v)", k, info[k], v, info)
				}
			}
			if v, _ := info["protocolVersion"].(string); v == "" {
				t.Errorf("Info() has no protocolVersion: %v", info)
			}
		})
	}
}

func TestCallErrors(t *testing.T) {
	t.Parallel()
	slow := demo.NewServer()
	slow.AddTool(mcp.NewTool("slow"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(30 * time.Second):
			return mcp.NewToolResultText("late"), nil
		}
	})
	url := serve(t, slow) + "/mcp"

	tests := []struct {
		name    string
		spec    config.MCP
		ctx     func(t *testing.T) context.Context
		op      string
		closed  bool
		wantErr error
	}{
		{name: "request timeout", spec: config.MCP{URL: url, RequestTimeoutMs: 100}, op: "slow", wantErr: context.DeadlineExceeded},
		{name: "caller deadline sooner", spec: config.MCP{URL: url}, op: "slow", wantErr: context.DeadlineExceeded,
			ctx: func(t *testing.T) context.Context {
				ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
				t.Cleanup(cancel)
				return ctx
			}},
		{name: "unknown operation", spec: config.MCP{URL: url}, op: "nope", wantErr: connect.ErrUnknownOperation},
		{name: "after close", spec: config.MCP{URL: url}, op: "echo", closed: true, wantErr: connect.ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			conn := openConn(t, "slowpoke", tt.spec, nil)
			if tt.closed {
				if err := conn.Close(); err != nil {
					t.Fatal(err)
				}
			}
			ctx := t.Context()
			if tt.ctx != nil {
				ctx = tt.ctx(t)
			}
			start := time.Now()
			_, err := conn.Call(ctx, connect.CallRequest{Op: tt.op, Args: map[string]any{"text": "x"}})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if want := "mcp slowpoke: call " + tt.op + ": "; !strings.HasPrefix(err.Error(), want) {
				t.Errorf("err = %q, want prefix %q", err, want)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("call took %v", d)
			}
		})
	}
}

func TestConnectErrors(t *testing.T) {
	t.Parallel()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	notMCP := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notMCP.Close)

	tests := []struct {
		name string
		spec config.MCP
		want string
	}{
		{"command does not exist", config.MCP{Command: "patchbay-no-such-command"}, "patchbay-no-such-command"},
		{"command exits", config.MCP{Command: demoBin, Args: []string{"-no-such-flag"}}, "initialize"},
		{"no command", config.MCP{Type: "stdio"}, "needs a command"},
		{"no url", config.MCP{Type: "http"}, "needs a url"},
		{"unknown transport", config.MCP{Type: "ws", URL: "http://127.0.0.1:1/ws"}, `transport "ws"`},
		{"server unreachable", config.MCP{URL: gone.URL + "/mcp"}, "initialize"},
		{"not an MCP server", config.MCP{URL: notMCP.URL}, "initialize"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.spec.TimeoutMs = 10_000
			conn, err := pbmcp.New("bad", tt.spec, nil).Connect(t.Context())
			if err == nil {
				conn.Close()
				t.Fatal("Connect succeeded")
			}
			if !strings.HasPrefix(err.Error(), "mcp bad: connect: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %q, want it to mention %q", err, tt.want)
			}
		})
	}
}

// fakeServer is a minimal Streamable HTTP MCP server that predates protocol
// 2026-07-28 and pages tools/list as page says. It exists to produce what
// mcp-go's server never does (a cursor that repeats, endless pages).
type fakeServer struct {
	page func(cursor string) (tools []map[string]any, next string)

	mu     sync.Mutex
	pages  int
	header http.Header // of the last request
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.header = r.Header.Clone()
	f.mu.Unlock()
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	var req struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Cursor string `json:"cursor"`
		} `json:"params"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if req.ID == nil {
		w.WriteHeader(http.StatusAccepted) // a notification
		return
	}
	resp := map[string]any{"jsonrpc": "2.0", "id": req.ID}
	switch req.Method {
	case "initialize":
		resp["result"] = map[string]any{
			"protocolVersion": "2025-06-18",
			"capabilities":    map[string]any{"tools": map[string]any{}},
			"serverInfo":      map[string]any{"name": "fake", "version": "1"},
		}
	case "tools/list":
		f.mu.Lock()
		f.pages++
		f.mu.Unlock()
		tools, next := f.page(req.Params.Cursor)
		result := map[string]any{"tools": tools}
		if next != "" {
			result["nextCursor"] = next
		}
		resp["result"] = result
	default:
		resp["error"] = map[string]any{"code": mcp.METHOD_NOT_FOUND, "message": "method not found"}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func (f *fakeServer) lastHeader() http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.header
}

func fakeTool(name string) map[string]any {
	return map[string]any{"name": name, "inputSchema": map[string]any{"type": "object"}}
}

func TestToolPaging(t *testing.T) {
	t.Parallel()

	// mcp-go's own server, three tools a page.
	paged := server.NewMCPServer("paged", "1", server.WithPaginationLimit(3))
	var want []string
	for i := range 25 {
		name := fmt.Sprintf("tool%02d", i)
		want = append(want, name)
		paged.AddTool(mcp.NewTool(name, mcp.WithString("x")), nil)
	}
	// A schema with keywords mcp-go's client does not model must arrive
	// whole.
	rawSchema := `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"n":{"type":"integer"},"s":{"type":"string"}},"oneOf":[{"required":["n"]},{"required":["s"]}],"additionalProperties":false}`
	paged.AddTool(mcp.NewToolWithRawSchema("zz_raw", "raw schema", json.RawMessage(rawSchema)), nil)
	want = append(want, "zz_raw")

	t.Run("all pages", func(t *testing.T) {
		t.Parallel()
		conn := openConn(t, "paged", config.MCP{URL: serve(t, paged) + "/mcp"}, nil)
		var got []string
		for _, op := range conn.Manifest().Operations {
			got = append(got, op.Name)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("operations = %v\nwant %v", got, want)
		}
		op, _ := conn.Manifest().Operation("zz_raw")
		if !jsonEqual(t, op.InputSchema, []byte(rawSchema)) {
			t.Errorf("schema = %s\nwant %s", op.InputSchema, rawSchema)
		}
	})

	tests := []struct {
		name      string
		page      func(cursor string) ([]map[string]any, string)
		wantErr   string
		wantPages int
	}{
		{"legacy server, two pages", func(cursor string) ([]map[string]any, string) {
			if cursor == "" {
				return []map[string]any{fakeTool("a")}, "p2"
			}
			return []map[string]any{fakeTool("b")}, ""
		}, "", 2},
		{"repeated cursor", func(cursor string) ([]map[string]any, string) {
			return []map[string]any{fakeTool("t" + cursor)}, "again"
		}, "repeats cursor", 2},
		{"endless pages", func(cursor string) ([]map[string]any, string) {
			return []map[string]any{fakeTool("t" + cursor)}, cursor + "x"
		}, "more than 100 pages", 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fake := &fakeServer{page: tt.page}
			ts := httptest.NewServer(fake)
			t.Cleanup(ts.Close)
			conn, err := pbmcp.New("fake", config.MCP{URL: ts.URL}, nil).Connect(t.Context())
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				if n := len(conn.Manifest().Operations); n != 2 {
					t.Errorf("%d operations", n)
				}
				if v := conn.Info()["protocolVersion"]; v != "2025-06-18" {
					t.Errorf("protocolVersion = %v", v)
				}
			} else if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				if conn != nil {
					conn.Close()
				}
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			fake.mu.Lock()
			defer fake.mu.Unlock()
			if fake.pages != tt.wantPages {
				t.Errorf("server answered %d pages, want %d", fake.pages, tt.wantPages)
			}
		})
	}
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

func TestHTTPHeaders(t *testing.T) {
	t.Parallel()
	fake := &fakeServer{page: func(string) ([]map[string]any, string) { return []map[string]any{fakeTool("a")}, "" }}
	ts := httptest.NewServer(fake)
	t.Cleanup(ts.Close)
	const secret = "sk-very-secret"
	conn := openConn(t, "hdr", config.MCP{URL: ts.URL, Headers: map[string]string{"X-Api-Key": secret}}, nil)
	if got := fake.lastHeader().Get("X-Api-Key"); got != secret {
		t.Errorf("server saw X-Api-Key %q", got)
	}
	b, err := json.Marshal(conn.Info())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), secret) {
		t.Errorf("Info() shows a header value: %s", b)
	}
}
