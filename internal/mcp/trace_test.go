package mcp_test

import (
	"context"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// TestCallCarriesTraceContextInMeta: a call made under a span sends its
// W3C trace context in the request's _meta, and the span is named and
// described after the OpenTelemetry MCP conventions.
func TestCallCarriesTraceContextInMeta(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got map[string]any
	s := server.NewMCPServer("meta", "1.0.0")
	s.AddTool(mcp.NewTool("look"), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		mu.Lock()
		defer mu.Unlock()
		if req.Params.Meta != nil {
			got = req.Params.Meta.AdditionalFields
		}
		return mcp.NewToolResultStructured(map[string]any{"ok": true}, "ok"), nil
	})
	conn := openConn(t, "meta", config.MCP{URL: serve(t, s) + "/mcp"}, nil)

	spans := tracetest.NewInMemoryExporter()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)).Tracer("test")
	ctx, span := tracer.Start(t.Context(), "call meta look", trace.WithSpanKind(trace.SpanKindClient))
	if _, err := conn.Call(ctx, connect.CallRequest{Op: "look", IdempotencyKey: "ex_1:look"}); err != nil {
		t.Fatal(err)
	}
	span.End()

	sc := span.SpanContext()
	want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	mu.Lock()
	defer mu.Unlock()
	if got["traceparent"] != want || got["io.patchbay/idempotency-key"] != "ex_1:look" {
		t.Fatalf("_meta = %v, want traceparent %s beside the idempotency key", got, want)
	}
	stub := spans.GetSpans()[0]
	attrs := map[string]string{}
	for _, kv := range stub.Attributes {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if stub.Name != "tools/call look" || attrs["mcp.method.name"] != "tools/call" || attrs["gen_ai.tool.name"] != "look" ||
		attrs["gen_ai.operation.name"] != "execute_tool" || attrs["mcp.protocol.version"] == "" ||
		attrs["network.transport"] != "tcp" {
		t.Fatalf("span %q attributes %v", stub.Name, attrs)
	}
	// mcp.session.id is there when the protocol keeps a session (2025
	// era); this server's protocol is sessionless.
	if id, ok := attrs["mcp.session.id"]; ok && id == "" {
		t.Fatal("empty mcp.session.id")
	}
}

// TestCallWithoutSpanSendsNoTraceContext: tracing off adds nothing.
func TestCallWithoutSpanSendsNoTraceContext(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got map[string]any
	s := server.NewMCPServer("meta", "1.0.0")
	s.AddTool(mcp.NewTool("look"), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		mu.Lock()
		defer mu.Unlock()
		got = map[string]any{}
		if req.Params.Meta != nil {
			got = req.Params.Meta.AdditionalFields
		}
		return mcp.NewToolResultStructured(map[string]any{"ok": true}, "ok"), nil
	})
	conn := openConn(t, "meta", config.MCP{URL: serve(t, s) + "/mcp"}, nil)
	if _, err := conn.Call(t.Context(), connect.CallRequest{Op: "look"}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if _, ok := got["traceparent"]; ok || got == nil {
		t.Fatalf("_meta = %v, want no traceparent", got)
	}
}
