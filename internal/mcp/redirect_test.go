package mcp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// A redirect to another origin is not followed: the connection's headers
// (its credentials) and its requests go only to the configured origin.
func TestRedirectToAnotherOriginIsRefused(t *testing.T) {
	t.Parallel()
	var reached atomic.Int64
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if r.Header.Get("X-Api-Key") != "" {
			t.Errorf("the key reached another origin: %s %s", r.Method, r.URL)
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(elsewhere.Close)
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
		redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+r.URL.Path, code)
		}))
		t.Cleanup(redirecting.Close)
		spec := config.MCP{URL: redirecting.URL + "/mcp", Headers: map[string]string{"X-Api-Key": "key-that-stays-home"}, TimeoutMs: 10_000}
		conn, err := pbmcp.New("away", spec, nil).Connect(t.Context())
		if err == nil {
			_ = conn.Close()
			t.Fatalf("%d: connected through a redirect to another origin", code)
		}
		if !strings.Contains(err.Error(), "not followed") {
			t.Errorf("%d: error %q does not say the redirect was refused", code, err)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("the other origin got %d requests", n)
	}
}

// Within the origin a redirect is followed, POST included: a server
// mounted at /real/mcp behind a 307 from /mcp serves as if addressed.
func TestRedirectWithinTheOriginIsFollowed(t *testing.T) {
	t.Parallel()
	s := server.NewMCPServer("moved", "1.0.0")
	s.AddTool(mcp.NewTool("ping"), func(_ context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("pong"), nil
	})
	mux := http.NewServeMux()
	mux.Handle("/real/mcp", server.NewStreamableHTTPServer(s))
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/real/mcp", http.StatusTemporaryRedirect)
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	conn := openConn(t, "moved", config.MCP{URL: ts.URL + "/mcp", Headers: map[string]string{"X-Api-Key": "k"}, TimeoutMs: 10_000}, nil)
	if _, ok := conn.Manifest().Operation("ping"); !ok {
		t.Fatalf("manifest %+v lacks ping", conn.Manifest())
	}
}
