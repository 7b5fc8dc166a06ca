package mcp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync"
	"testing"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// headerLog records the headers of every POST an HTTP handler gets.
type headerLog struct {
	mu   sync.Mutex
	seen []http.Header
}

func (l *headerLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			l.mu.Lock()
			l.seen = append(l.seen, r.Header.Clone())
			l.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

// find returns the headers of the last request with Mcp-Method method.
func (l *headerLog) find(method string) http.Header {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.seen) - 1; i >= 0; i-- {
		if l.seen[i].Get("Mcp-Method") == method {
			return l.seen[i]
		}
	}
	return nil
}

// goSDKServer serves a go-sdk (the official Go SDK) server speaking
// 2026-07-28, statelessly, on a loopback httptest server.
func goSDKServer(t *testing.T) (string, *headerLog) {
	t.Helper()
	s := sdk.NewServer(&sdk.Implementation{Name: "go-sdk-test", Version: "1.8.0"}, nil)
	readOnly := true
	s.AddTool(&sdk.Tool{
		Name:        "lookup",
		Title:       "Look up",
		Description: "finds q in a region",
		Annotations: &sdk.ToolAnnotations{ReadOnlyHint: readOnly},
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"region":{"type":"string","x-mcp-header":"Region"},
			"q":{"type":"string"}},"required":["region","q"]}`),
	}, func(_ context.Context, req *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		var args map[string]any
		if err := json.Unmarshal(req.Params.Arguments, &args); err != nil {
			return nil, err
		}
		return &sdk.CallToolResult{
			Content:           []sdk.Content{&sdk.TextContent{Text: "found"}},
			StructuredContent: map[string]any{"region": args["region"], "q": args["q"]},
		}, nil
	})
	s.AddTool(&sdk.Tool{
		Name:        "plain",
		InputSchema: json.RawMessage(`{"type":"object"}`),
	}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: `{"n":1}`}}}, nil
	})
	log := &headerLog{}
	h := sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s }, &sdk.StreamableHTTPOptions{Stateless: true})
	ts := httptest.NewServer(log.wrap(h))
	t.Cleanup(ts.Close)
	return ts.URL + "/mcp", log
}

func TestInteropGoSDKModern(t *testing.T) {
	t.Parallel()
	url, log := goSDKServer(t)
	conn := openConn(t, "gosdk", config.MCP{URL: url}, nil)
	info := conn.Info()
	if info["era"] != pbmcp.EraModern || info["protocolVersion"] != "2026-07-28" {
		t.Fatalf("info = %v, want the 2026-07-28 era", info)
	}
	if info["session"] != false {
		t.Errorf("a stateless connection has a session: %v", info)
	}
	op, ok := conn.Manifest().Operation("lookup")
	if !ok || op.Annotations.Title != "Look up" || op.Annotations.ReadOnlyHint == nil || !*op.Annotations.ReadOnlyHint {
		t.Errorf("lookup = %+v, %v", op, ok)
	}
	if h := log.find("server/discover"); h == nil || h.Get("MCP-Protocol-Version") != "2026-07-28" {
		t.Errorf("server/discover headers = %v", h)
	}
	if h := log.find("tools/list"); h == nil || h.Get("Mcp-Session-Id") != "" {
		t.Errorf("tools/list headers = %v", h)
	}

	tests := []struct {
		name, region string
	}{
		{"ascii", "eu-west-1"},
		{"non-ascii is base64", "Zürich"},
	}
	for _, tt := range tests {
		got, err := conn.Call(t.Context(), connect.CallRequest{Op: "lookup", Args: map[string]any{"region": tt.region, "q": "x"}, IdempotencyKey: "k1"})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if want := map[string]any{"region": tt.region, "q": "x"}; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: got %v, want %v", tt.name, got, want)
		}
		h := log.find("tools/call")
		want, _ := mcpgo.EncodeHeaderValue(tt.region)
		for k, v := range map[string]string{
			"MCP-Protocol-Version": "2026-07-28",
			"Mcp-Method":           "tools/call",
			"Mcp-Name":             "lookup",
			"Mcp-Param-Region":     want,
		} {
			if h.Get(k) != v {
				t.Errorf("%s: %s = %q, want %q", tt.name, k, h.Get(k), v)
			}
		}
		if tt.region != want && h.Get("Mcp-Param-Region") == tt.region {
			t.Errorf("%s: non-ASCII value sent raw", tt.name)
		}
	}
	got, err := conn.Call(t.Context(), connect.CallRequest{Op: "plain"})
	if err != nil || !reflect.DeepEqual(got, map[string]any{"n": 1.0}) {
		t.Errorf("plain = %v, %v", got, err)
	}
}
