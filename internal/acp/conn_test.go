package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeCommand runs the test binary as the fake agent in mode.
func fakeCommand(t *testing.T, mode string, env ...string) Command {
	return Command{
		Path:   os.Args[0],
		Env:    append([]string{"ACP_FAKE_AGENT=" + mode}, env...),
		Stderr: testWriter{t},
	}
}

// TestUpdateKinds checks that the kinds ACP has are decoded and a kind it
// does not have yet, or an update that does not decode, is passed on raw.
func TestUpdateKinds(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	conn, err := Start(t.Context(), fakeCommand(t, "basic"), rec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Initialize(t.Context()); err != nil {
		t.Fatal(err)
	}
	id, err := conn.NewSession(t.Context(), "/work", nil)
	if err != nil {
		t.Fatal(err)
	}
	if stop, err := conn.Prompt(t.Context(), id, "hi"); err != nil || stop != StopEndTurn {
		t.Fatalf("Prompt = %q, %v", stop, err)
	}
	// Prompt returned: every update sent before the answer was delivered.
	got := rec.seen()
	if len(got) != len(fakeUpdates) {
		t.Fatalf("%d updates, want %d", len(got), len(fakeUpdates))
	}
	line := 3
	tests := []struct {
		kind  UpdateKind
		check func(n SessionNotification) bool
	}{
		{UpdateAgentThoughtChunk, func(n SessionNotification) bool { return *n.Content == ContentBlock{Type: "text", Text: "thinking"} }},
		{UpdateAgentMessageChunk, func(n SessionNotification) bool { return *n.Content == ContentBlock{Type: "text", Text: "hello"} }},
		{UpdateToolCall, func(n SessionNotification) bool {
			tc := n.ToolCall
			return tc.ToolCallID == "t1" && tc.Title == "Read" && tc.Kind == "read" && tc.Status == "pending" &&
				len(tc.Locations) == 1 && tc.Locations[0].Path == "/w/a.go" && *tc.Locations[0].Line == line &&
				string(tc.RawInput) == `{"path":"/w/a.go"}`
		}},
		{UpdateToolCallUpdate, func(n SessionNotification) bool {
			return n.ToolCall.ToolCallID == "t1" && n.ToolCall.Status == "completed" && string(n.ToolCall.RawOutput) == `{"ok":true}`
		}},
		{UpdatePlan, func(n SessionNotification) bool {
			return len(n.Plan) == 1 && n.Plan[0] == PlanEntry{Content: "step one", Priority: "high", Status: "in_progress"}
		}},
		{UpdateAvailableCommands, func(n SessionNotification) bool { return n.Content == nil && n.ToolCall == nil }},
		{UpdateCurrentMode, func(n SessionNotification) bool { return n.Content == nil && n.ToolCall == nil }},
		{"future_update", func(n SessionNotification) bool { return n.Content == nil && n.ToolCall == nil && n.Plan == nil }},
		{UpdateAgentMessageChunk, func(n SessionNotification) bool { return n.Content.Type == "image" && n.Content.Text == "" }},
		// A tool call whose id is not a string: kept raw, not decoded.
		{UpdateToolCall, func(n SessionNotification) bool { return n.ToolCall == nil }},
	}
	for i, tt := range tests {
		n := got[i]
		if n.SessionID != id || n.Kind != tt.kind || !tt.check(n) {
			t.Errorf("update %d: %+v (content %+v, tool call %+v)", i, n, n.Content, n.ToolCall)
		}
		// The raw update is the one sent, whatever its kind.
		var want, have any
		_ = json.Unmarshal([]byte(fakeUpdates[i]), &want)
		if err := json.Unmarshal(n.Update, &have); err != nil || fmt.Sprint(want) != fmt.Sprint(have) {
			t.Errorf("update %d raw %s, want %s", i, n.Update, fakeUpdates[i])
		}
	}
}

// TestLoadSession checks that the replayed history is delivered before
// LoadSession returns.
func TestLoadSession(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	conn, err := Start(t.Context(), fakeCommand(t, "basic"), rec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.LoadSession(t.Context(), "old", "/work", nil); !errors.Is(err, ErrNotInitialized) {
		t.Errorf("LoadSession before Initialize = %v", err)
	}
	if _, err := conn.Initialize(t.Context()); err != nil {
		t.Fatal(err)
	}
	servers := []MCPServer{{Type: MCPHTTP, Name: "patchbay", URL: "http://127.0.0.1:1/mcp", Headers: []Header{{"Authorization", "Bearer x"}}}}
	if err := conn.LoadSession(t.Context(), "old", "/work", servers); err != nil {
		t.Fatal(err)
	}
	got := rec.seen()
	if len(got) != 2 || got[0].Kind != UpdateUserMessageChunk || got[0].Content.Text != "earlier" || got[1].Content.Text != "answer" {
		t.Errorf("replayed %+v", got)
	}
	// The fake declares http MCP servers, not sse.
	_, err = conn.NewSession(t.Context(), "/work", []MCPServer{{Type: MCPSSE, Name: "s", URL: "http://x"}})
	if !errors.Is(err, ErrMCPUnsupported) {
		t.Errorf("NewSession with an sse server = %v, want ErrMCPUnsupported", err)
	}
	if _, err := conn.NewSession(t.Context(), "relative", nil); err == nil {
		t.Error("NewSession accepted a relative cwd")
	}
}

func TestMCPServerJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		server MCPServer
		want   string
	}{
		{MCPServer{Type: MCPHTTP, Name: "patchbay", URL: "http://127.0.0.1:8080/mcp", Headers: []Header{{"Authorization", "Bearer t"}}},
			`{"type":"http","name":"patchbay","url":"http://127.0.0.1:8080/mcp","headers":[{"name":"Authorization","value":"Bearer t"}]}`},
		{MCPServer{Type: MCPSSE, Name: "old", URL: "http://h/sse"}, `{"type":"sse","name":"old","url":"http://h/sse","headers":[]}`},
		{MCPServer{Name: "fs", Command: "/bin/mcp", Args: []string{"-v"}, Env: []EnvVar{{"A", "1"}}},
			`{"name":"fs","command":"/bin/mcp","args":["-v"],"env":[{"name":"A","value":"1"}]}`},
		{MCPServer{Name: "bare", Command: "mcp"}, `{"name":"bare","command":"mcp","args":[],"env":[]}`},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.server)
		if err != nil || string(b) != tt.want {
			t.Errorf("%+v: %s, %v; want %s", tt.server, b, err, tt.want)
		}
	}
	if _, err := json.Marshal(MCPServer{Type: "ws"}); err == nil {
		t.Error("unknown type marshalled")
	}
}

// TestAgentErrors checks a JSON-RPC error answer, requests patchbay does
// not serve, and malformed input.
func TestAgentErrors(t *testing.T) {
	t.Parallel()
	conn, p := pipeConn(t, &recorder{}, Options{})
	ctx := t.Context()

	errc := make(chan error, 1)
	go func() { _, err := conn.Initialize(ctx); errc <- err }()
	m := p.recv()
	p.send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"error":{"code":-32000,"message":"Authentication required","data":{"methods":["x"]}}}`)
	err := <-errc
	var rpcErr *RPCError
	if !errors.As(err, &rpcErr) || rpcErr.Code != CodeAuthRequired || rpcErr.Message != "Authentication required" {
		t.Fatalf("Initialize = %v, want an RPCError -32000", err)
	}
	if !strings.HasPrefix(err.Error(), "acp: initialize: Authentication required (code -32000") {
		t.Errorf("error text %q", err)
	}

	for _, tt := range []struct{ in, wantCode string }{
		// Capabilities not declared, and methods ACP does not have.
		{`{"jsonrpc":"2.0","id":1,"method":"fs/read_text_file","params":{"sessionId":"s1","path":"/etc/passwd"}}`, "-32601"},
		{`{"jsonrpc":"2.0","id":"two","method":"terminal/create","params":{"sessionId":"s1","command":"sh"}}`, "-32601"},
		{`{"jsonrpc":"2.0","id":3,"method":"x/unknown"}`, "-32601"},
		// Malformed input: answered, never fatal.
		{`not json at all`, "-32700"},
		{`[1,2,3]`, "-32700"},
		{`{"jsonrpc":"2.0"}`, "-32600"},
		{`{"jsonrpc":"2.0","id":4,"method":"session/request_permission","params":"nope"}`, "-32602"},
	} {
		p.send(tt.in)
		m := p.recv()
		if m.Error == nil || fmt.Sprint(m.Error.Code) != tt.wantCode {
			t.Errorf("%s: answered %+v, want code %s", tt.in, m, tt.wantCode)
		}
	}
	// Ignored: a response to nothing, an unknown notification, an update
	// without a kind, an empty line.
	p.send(`{"jsonrpc":"2.0","id":99,"result":{}}`)
	p.send(`{"jsonrpc":"2.0","method":"x/notice","params":{}}`)
	p.send(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{}}}`)
	p.send(``)
	// The connection still works.
	go func() { _, err := conn.Initialize(ctx); errc <- err }()
	m = p.recv()
	p.send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":"yes"}}}`)
	if err := <-errc; err != nil {
		t.Errorf("Initialize after malformed input: %v", err)
	}
	go func() { _, err := conn.Initialize(ctx); errc <- err }()
	m = p.recv()
	p.send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"protocolVersion":2}}`)
	if err := <-errc; !errors.Is(err, ErrProtocolVersion) {
		t.Errorf("Initialize answered version 2 = %v, want ErrProtocolVersion", err)
	}
}

// TestLineTooLong checks that a line over the bound ends the connection
// with ErrLineTooLong, and a waiting call with it.
func TestLineTooLong(t *testing.T) {
	t.Parallel()
	conn, p := pipeConn(t, &recorder{}, Options{MaxLineBytes: 1024})
	errc := make(chan error, 1)
	go func() { _, err := conn.Initialize(t.Context()); errc <- err }()
	p.recv()
	// The reader stops at the bound: the rest of the line is never read.
	go io.WriteString(p.w, `{"jsonrpc":"2.0","method":"x","params":"`+strings.Repeat("a", 100<<10)+`"}`+"\n")
	if err := <-errc; !errors.Is(err, ErrLineTooLong) {
		t.Errorf("Initialize = %v, want ErrLineTooLong", err)
	}
	select {
	case <-conn.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed")
	}
	if !errors.Is(conn.Err(), ErrLineTooLong) {
		t.Errorf("Err = %v", conn.Err())
	}
}

// TestRequestTimeout checks that a call returns when its ctx ends, and a
// late answer is dropped.
func TestRequestTimeout(t *testing.T) {
	t.Parallel()
	conn, p := pipeConn(t, &recorder{}, Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := conn.Initialize(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Initialize = %v, want DeadlineExceeded", err)
	}
	m := p.recv()
	p.send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"protocolVersion":1}}`)
	if conn.Err() != nil {
		t.Errorf("a late answer broke the connection: %v", conn.Err())
	}
}

// TestAgentExit checks that the agent exiting ends the connection and
// says how.
func TestAgentExit(t *testing.T) {
	t.Parallel()
	conn, err := Start(t.Context(), Command{Path: "/bin/sh", Args: []string{"-c", "read line; exit 3"}}, &recorder{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Initialize(t.Context()); !errors.Is(err, ErrAgentExited) || err.Error() != "acp: initialize: agent exited: exit status 3" {
		t.Errorf("Initialize = %v, want ErrAgentExited with exit status 3", err)
	}
	<-conn.Done()
	if err := conn.Err(); err == nil || err.Error() != "acp: agent exited: exit status 3" {
		t.Errorf("Err = %v", err)
	}
	if _, err := Start(t.Context(), Command{Path: "/nonexistent/agent"}, &recorder{}, Options{}); err == nil {
		t.Error("Start of a missing command succeeded")
	}
}

// TestConcurrentPromptCancel runs turns on several sessions at once, each
// cancelled from another goroutine (run with -race).
func TestConcurrentPromptCancel(t *testing.T) {
	t.Parallel()
	conn, err := Start(t.Context(), fakeCommand(t, "basic"), &recorder{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Initialize(t.Context()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		id, err := conn.NewSession(t.Context(), "/work", nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if i%2 == 0 {
				if stop, err := conn.Prompt(t.Context(), id, "hi"); err != nil || stop != StopEndTurn {
					t.Errorf("Prompt = %q, %v", stop, err)
				}
				return
			}
			ctx, cancel := context.WithCancel(t.Context())
			go func() {
				time.Sleep(50 * time.Millisecond)
				if i%4 == 1 {
					cancel()
				} else if err := conn.Cancel(id); err != nil {
					t.Errorf("Cancel: %v", err)
				}
			}()
			defer cancel()
			if stop, err := conn.Prompt(ctx, id, "wait"); err != nil || stop != StopCancelled {
				t.Errorf("Prompt = %q, %v; want cancelled", stop, err)
			}
		})
	}
	wg.Wait()
}

// TestNoGoroutineLeak checks that Close leaves no goroutine behind. It is
// not parallel: the count is taken while no other test runs.
func TestNoGoroutineLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 3 {
		conn, err := Start(t.Context(), fakeCommand(t, "basic"), &recorder{}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Initialize(t.Context()); err != nil {
			t.Fatal(err)
		}
		id, err := conn.NewSession(t.Context(), "/work", nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Prompt(t.Context(), id, "hi"); err != nil {
			t.Fatal(err)
		}
		if err := conn.Close(); err != nil {
			t.Fatal(err)
		}
		if err := conn.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after Close:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FuzzHandleLine feeds arbitrary lines to a connection: nothing may
// panic, and a handler's answer goes to a discarded writer.
func FuzzHandleLine(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"plan","entries":7}}}`,
		`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","locations":[{"line":"x"}]}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"session/request_permission","params":{"options":null}}`,
		`{"jsonrpc":"2.0","id":{"x":1},"method":"fs/read_text_file","params":{}}`,
		`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":[1]}}`,
		`{"jsonrpc":"2.0","id":"1e400","result":null,"error":{"code":"x"}}`,
		`{"id":null}`, `null`, `"str"`, `{`,
	} {
		f.Add([]byte(seed))
	}
	conn, _ := discardConn(f)
	f.Fuzz(func(t *testing.T, line []byte) {
		conn.handleLine(line)
	})
}

// discardConn is a connection whose output is discarded and whose input
// never comes: lines are fed to handleLine directly.
func discardConn(tb testing.TB) (*Conn, *recorder) {
	rec := &recorder{}
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	out, in, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { w.Close(); out.Close() })
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := out.Read(buf); err != nil {
				return
			}
		}
	}()
	conn := newConn(in, r, rec, Options{}, nil, nil)
	tb.Cleanup(func() { conn.Close() })
	return conn, rec
}
