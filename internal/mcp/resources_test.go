package mcp_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// TestReadResource reads resources for bindings' resource reads: JSON
// text parsed, other text as is, blobs with their type; credentials of a
// principal are refused.
func TestReadResource(t *testing.T) {
	t.Parallel()
	s := server.NewMCPServer("res", "1.0.0", server.WithResourceCapabilities(false, false), server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("noop"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	text := func(uri, body string) server.ResourceHandlerFunc {
		return func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, MIMEType: "application/json", Text: body}}, nil
		}
	}
	s.AddResource(mcp.NewResource("page://summary", "summary"), text("page://summary", `{"url":"http://a.test/","title":"A"}`))
	s.AddResource(mcp.NewResource("page://tree", "tree"), text("page://tree", "- button \"Go\""))
	s.AddResource(mcp.NewResource("page://shot", "shot"), func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.BlobResourceContents{URI: "page://shot", MIMEType: "image/png", Blob: "iVBORw0KGgo="}}, nil
	})
	conn, err := pbmcp.New("res", config.MCP{URL: serve(t, s) + "/mcp"}, nil).Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	rr, ok := conn.(connect.ResourceReader)
	if !ok {
		t.Fatal("an MCP connection cannot read resources")
	}
	for uri, want := range map[string]any{
		"page://summary": map[string]any{"url": "http://a.test/", "title": "A"},
		"page://tree":    "- button \"Go\"",
		"page://shot":    map[string]any{"blob": "iVBORw0KGgo=", "mimeType": "image/png"},
	} {
		got, err := rr.ReadResource(t.Context(), uri, nil)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %#v, %v; want %#v", uri, got, err, want)
		}
	}
	if _, err := rr.ReadResource(t.Context(), "page://nope", nil); err == nil || !strings.Contains(err.Error(), "read resource page://nope") {
		t.Errorf("unknown resource: %v", err)
	}
	if _, err := rr.ReadResource(t.Context(), "page://summary", map[string]string{"Authorization": "Bearer x"}); err == nil || !strings.Contains(err.Error(), "not sent with resource reads") {
		t.Errorf("a principal's credentials: %v", err)
	}
}
