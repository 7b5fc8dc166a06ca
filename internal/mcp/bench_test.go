package mcp_test

import (
	"log/slog"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// The two benchmarks measure the harness's overhead per call: the same echo
// call to the same demo server over stdio, through registry.Registry and
// this package (BenchmarkCallHarness) and with a bare mcp-go client
// (BenchmarkCallRaw). Compare their ns/op from one run.

func BenchmarkCallHarness(b *testing.B) {
	reg := registry.NewRegistry(slog.New(slog.DiscardHandler))
	if err := reg.Add("demo", pbmcp.New("demo", config.MCP{Command: demoBin}, &pbmcp.Options{Logger: slog.New(slog.DiscardHandler)})); err != nil {
		b.Fatal(err)
	}
	if err := reg.Start(b.Context()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = reg.Close() })
	conn, err := reg.Get("demo")
	if err != nil {
		b.Fatal(err)
	}
	req := connect.CallRequest{Op: "echo", Args: map[string]any{"text": "hello"}, IdempotencyKey: "bench"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := conn.Call(b.Context(), req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCallRaw(b *testing.B) {
	c, err := client.NewStdioMCPClient(demoBin, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	if _, err := c.Initialize(b.Context(), mcp.InitializeRequest{Params: mcp.InitializeParams{
		ClientInfo: mcp.Implementation{Name: "raw", Version: "1"}}}); err != nil {
		b.Fatal(err)
	}
	var call mcp.CallToolRequest
	call.Params.Name = "echo"
	call.Params.Arguments = map[string]any{"text": "hello"}
	call.Params.Meta = mcp.NewMetaFromMap(map[string]any{pbmcp.MetaIdempotencyKey: "bench"})
	b.ReportAllocs()
	for b.Loop() {
		res, err := c.CallTool(b.Context(), call)
		if err != nil || res.IsError {
			b.Fatal(err, res)
		}
	}
}
