package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// fakeSpec runs the test binary as a misbehaving stdio server (fake_test.go).
func fakeSpec(mode string) config.MCP {
	return config.MCP{Command: os.Args[0], Env: map[string]string{"PATCHBAY_FAKE_MCP": mode},
		RequestTimeoutMs: 500, MaxResponseBytes: 1024, TimeoutMs: 20_000}
}

func TestStdioFaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		tool     string
		want     []error // errors.Is targets
		text     string  // in the message
		lost     bool    // the connection is gone afterwards
		wantText any     // a successful result instead
	}{
		{tool: "crash", want: []error{connect.ErrUnavailable}, text: "exited", lost: true},
		{tool: "hang", text: "no answer within 500ms (requestTimeoutMs)"},
		{tool: "garbage", want: []error{connect.ErrUnavailable, pbmcp.ErrInvalidJSON}, text: "not json", lost: true},
		{tool: "huge", want: []error{connect.ErrUnavailable, pbmcp.ErrResponseTooLarge}, text: "1024-byte limit", lost: true},
		{tool: "sample", wantText: "error: "}, // the server asked for sampling and got an error
		{tool: "ping", wantText: "result"},    // the server pinged and got an answer
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			t.Parallel()
			conn := openConn(t, "fake", fakeSpec("ok"), nil)
			other := openConn(t, "other", config.MCP{Command: demoBin}, nil)
			got, err := conn.Call(t.Context(), connect.CallRequest{Op: tt.tool})
			if tt.wantText != nil {
				if s, _ := got.(string); err != nil || !strings.HasPrefix(s, tt.wantText.(string)) {
					t.Fatalf("Call = %v, %v; want %q…", got, err, tt.wantText)
				}
				return
			}
			if err == nil {
				t.Fatalf("Call succeeded: %v", got)
			}
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Errorf("err = %v, want it to match %v", err, w)
				}
			}
			if !strings.Contains(err.Error(), tt.text) {
				t.Errorf("err = %q, want it to say %q", err, tt.text)
			}
			_, err = conn.Call(t.Context(), connect.CallRequest{Op: "echo"})
			if tt.lost != (err != nil) {
				t.Errorf("next call: err = %v, lost = %v", err, tt.lost)
			}
			if tt.lost {
				if !errors.Is(err, connect.ErrUnavailable) {
					t.Errorf("next call err = %v, want ErrUnavailable", err)
				}
				select {
				case <-conn.(interface{ Done() <-chan struct{} }).Done():
				default:
					t.Errorf("Done not closed after the connection was lost")
				}
			}
			if _, err := other.Call(t.Context(), connect.CallRequest{Op: "echo", Args: map[string]any{"text": "still here"}}); err != nil {
				t.Errorf("another connection was affected: %v", err)
			}
		})
	}
}

// TestCancelInFlight: cancelling the caller's context (an execution being
// cancelled) ends the call at once; the connection stays usable.
func TestCancelInFlight(t *testing.T) {
	t.Parallel()
	spec := fakeSpec("ok")
	spec.RequestTimeoutMs = 30_000
	conn := openConn(t, "cancel", spec, nil)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := conn.Call(ctx, connect.CallRequest{Op: "hang"})
	if !errors.Is(err, context.Canceled) || time.Since(start) > 5*time.Second {
		t.Fatalf("err = %v after %v, want context.Canceled at once", err, time.Since(start))
	}
	if _, err := conn.Call(t.Context(), connect.CallRequest{Op: "echo"}); err != nil {
		t.Errorf("after cancel: %v", err)
	}
}

func TestListingFaults(t *testing.T) {
	t.Parallel()
	t.Run("duplicate tool names fail the connection", func(t *testing.T) {
		t.Parallel()
		_, err := pbmcp.New("dup", fakeSpec("dup"), nil).Connect(t.Context())
		if !errors.Is(err, pbmcp.ErrListing) || !strings.Contains(err.Error(), `tool "echo" is listed twice`) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("a tool with an invalid schema fails its calls only", func(t *testing.T) {
		t.Parallel()
		conn := openConn(t, "bad", fakeSpec("badschema"), nil)
		if inv, _ := conn.Info()["invalidTools"].(map[string]string); inv["bad"] == "" {
			t.Errorf("Info = %v, want invalidTools[bad]", conn.Info())
		}
		_, err := conn.Call(t.Context(), connect.CallRequest{Op: "bad"})
		if err == nil || !strings.Contains(err.Error(), "not valid JSON Schema") {
			t.Errorf("Call(bad) err = %v", err)
		}
		if _, err := conn.Call(t.Context(), connect.CallRequest{Op: "echo"}); err != nil {
			t.Errorf("Call(echo): %v", err)
		}
	})
}

// pagedServer is a 2025-era HTTP server whose tools/list answers are given
// raw by cursor ("" for a request with no cursor, "<empty>" for cursor "").
type pagedServer struct {
	pages map[string]string
	calls atomic.Int32
}

func (p *pagedServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	var req struct {
		ID     json.RawMessage            `json:"id"`
		Method string                     `json:"method"`
		Params map[string]json.RawMessage `json:"params"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	if req.ID == nil {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	var result string
	switch req.Method {
	case "initialize":
		result = `{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"paged","version":"1"}}`
	case "tools/list":
		key := ""
		if c, ok := req.Params["cursor"]; ok {
			_ = json.Unmarshal(c, &key)
			if key == "" {
				key = "<empty>"
			}
		}
		result = p.pages[key]
	case "tools/call":
		p.calls.Add(1)
		result = p.pages["call:"+string(req.Params["name"])]
	}
	if result == "" {
		_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"error":{"code":-32601,"message":"nope"}}`))
		return
	}
	if strings.HasPrefix(result, "RAW:") {
		_, _ = w.Write([]byte(result[4:]))
		return
	}
	_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":` + result + `}`))
}

func TestListingPages(t *testing.T) {
	t.Parallel()
	tool := func(n string) string { return `{"name":"` + n + `","inputSchema":{"type":"object"}}` }
	tests := []struct {
		name  string
		pages map[string]string
		want  []string
		err   string
	}{
		{"empty cursor is a cursor", map[string]string{
			"":        `{"tools":[` + tool("a") + `],"nextCursor":""}`,
			"<empty>": `{"tools":[` + tool("b") + `]}`,
		}, []string{"a", "b"}, ""},
		{"null cursor ends", map[string]string{"": `{"tools":[` + tool("a") + `],"nextCursor":null}`}, []string{"a"}, ""},
		{"page without tools", map[string]string{
			"":  `{"tools":[` + tool("a") + `],"nextCursor":"2"}`,
			"2": `{"nextCursor":"3"}`,
		}, nil, "tools/list page 2 has no tools array"},
		{"repeated cursor", map[string]string{
			"":  `{"tools":[` + tool("a") + `],"nextCursor":"2"}`,
			"2": `{"tools":[` + tool("b") + `],"nextCursor":"2"}`,
		}, nil, `repeats cursor "2"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := httptest.NewServer(&pagedServer{pages: tt.pages})
			t.Cleanup(ts.Close)
			conn, err := pbmcp.New("paged", config.MCP{URL: ts.URL}, nil).Connect(t.Context())
			if tt.err != "" {
				if err == nil {
					conn.Close()
					t.Fatal("Connect succeeded")
				}
				if !errors.Is(err, pbmcp.ErrListing) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			var got []string
			for _, op := range conn.Manifest().Operations {
				got = append(got, op.Name)
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("tools = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestHTTPResponseFaults(t *testing.T) {
	t.Parallel()
	big := `{"content":[{"type":"text","text":"` + strings.Repeat("x", 4096) + `"}]}`
	ps := &pagedServer{pages: map[string]string{
		"":            `{"tools":[{"name":"big","inputSchema":{"type":"object"}},{"name":"junk","inputSchema":{"type":"object"}},{"name":"ok","inputSchema":{"type":"object"}}]}`,
		`call:"big"`:  big,
		`call:"junk"`: `RAW:{"jsonrpc":"2.0", this is not json`,
		`call:"ok"`:   `{"content":[{"type":"text","text":"fine"}]}`,
	}}
	ts := httptest.NewServer(ps)
	t.Cleanup(ts.Close)
	conn := openConn(t, "faulty", config.MCP{URL: ts.URL, MaxResponseBytes: 1024}, nil)

	_, err := conn.Call(t.Context(), connect.CallRequest{Op: "big"})
	if !errors.Is(err, pbmcp.ErrResponseTooLarge) || !strings.Contains(err.Error(), "1024-byte limit (maxResponseBytes)") {
		t.Errorf("big: err = %v", err)
	}
	_, err = conn.Call(t.Context(), connect.CallRequest{Op: "junk"})
	if err == nil || !strings.Contains(err.Error(), "decode") {
		t.Errorf("junk: err = %v", err)
	}
	if got, err := conn.Call(t.Context(), connect.CallRequest{Op: "ok"}); err != nil || got != "fine" {
		t.Errorf("ok after faults = %v, %v", got, err)
	}
}

// TestNoDowngrade: a server/discover that fails with 401, 403, a 5xx or no
// answer at all fails the connection; initialize is never sent.
func TestNoDowngrade(t *testing.T) {
	t.Parallel()
	for _, status := range []int{401, 403, 500, 503} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			var inits atomic.Int32
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var req struct{ Method string }
				_ = json.NewDecoder(r.Body).Decode(&req)
				if req.Method == "initialize" {
					inits.Add(1)
				}
				w.WriteHeader(status)
			}))
			t.Cleanup(ts.Close)
			_, err := pbmcp.New("strict", config.MCP{URL: ts.URL}, nil).Connect(t.Context())
			var se *pbmcp.StatusError
			if !errors.As(err, &se) || se.Status != status || !errors.Is(err, pbmcp.ErrHTTPStatus) {
				t.Errorf("err = %v, want a StatusError %d", err, status)
			}
			if n := inits.Load(); n != 0 {
				t.Errorf("initialize sent %d times after a failed discover", n)
			}
		})
	}
}
