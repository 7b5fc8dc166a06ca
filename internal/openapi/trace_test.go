package openapi

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// TestCallCarriesTraceContextInHeaders: a call under a span sends the W3C
// traceparent header, and the span follows the HTTP client conventions.
func TestCallCarriesTraceContextInHeaders(t *testing.T) {
	t.Parallel()
	c, rec, _ := connectCalls(t, config.OpenAPI{})
	spans := tracetest.NewInMemoryExporter()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)).Tracer("test")
	ctx, span := tracer.Start(t.Context(), "call api get", trace.WithSpanKind(trace.SpanKindClient))
	if _, err := c.Call(ctx, connect.CallRequest{Op: "get", Args: map[string]any{"id": "7"}}); err != nil {
		t.Fatal(err)
	}
	span.End()
	sc := span.SpanContext()
	rec.mu.Lock()
	got := rec.last.Header.Get("traceparent")
	rec.mu.Unlock()
	if want := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"; got != want {
		t.Fatalf("traceparent = %q, want %q", got, want)
	}
	stub := spans.GetSpans()[0]
	attrs := map[string]string{}
	for _, kv := range stub.Attributes {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if stub.Name != "GET /items/{id}" || attrs["http.request.method"] != "GET" || attrs["url.template"] != "/items/{id}" ||
		attrs["http.response.status_code"] != "200" || attrs["server.address"] != "127.0.0.1" {
		t.Fatalf("span %q attributes %v", stub.Name, attrs)
	}

	if _, err := c.Call(t.Context(), connect.CallRequest{Op: "get", Args: map[string]any{"id": "8"}}); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if got := rec.last.Header.Get("traceparent"); got != "" {
		t.Fatalf("traceparent %q sent without a span", got)
	}
}
