package web_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// TestExecutionPageLinksItsTrace: with PATCHBAY_TRACE_URL the execution
// page links to the execution's trace, and a step refused at a gate says
// which.
func TestExecutionPageLinksItsTrace(t *testing.T) {
	t.Parallel()
	var traced *harness.Executions
	b := setupWith(t, func(o *web.Options) {
		o.TraceURL = "https://jaeger.example/trace/{traceId}"
		tracer := sdktrace.NewTracerProvider().Tracer("test")
		traced = harness.NewExecutions(o.Store, o.Registry, &harness.ExecutionsOptions{Allowlists: o.Allowlists, Tracer: tracer})
	})
	c := signIn(t, b)
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	doc := `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"s","steps":[
		{"kind":"call","id":"ok","connection":"mem","op":"echo","args":{"text":"hi"}},
		{"kind":"call","id":"bad","connection":"mem","op":"echo","args":{"text":{"$expr":"1 + 1"}}}]}}`
	ex, err := traced.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Principal: "ci-bot", Allowlist: "ops"})
	must(t, err)
	done, err := b.execs.Wait(context.Background(), ex.ID, 10*time.Second)
	must(t, err)
	if done.Status != harness.ExecFailed || done.TraceID != tid.String() {
		t.Fatalf("execution %s trace %q", done.Status, done.TraceID)
	}
	p := c.get("/admin/executions/" + ex.ID)
	link, _ := p.doc.Find("#execution-trace a").Attr("href")
	if link != "https://jaeger.example/trace/"+tid.String() {
		t.Fatalf("trace link %q", link)
	}
	if g, _ := p.doc.Find(`#ledger li[data-step="bad"] .gate`).Attr("data-gate"); g != "2" ||
		!strings.Contains(text(p.doc.Find(`#ledger li[data-step="bad"] .gate`)), "schema") {
		t.Fatalf("refused step shows gate %q: %q", g, text(p.doc.Find(`#ledger li[data-step="bad"]`)))
	}
	if g, _ := p.doc.Find(`#ledger li[data-step="ok"] .gate`).Attr("data-gate"); g != "all" {
		t.Fatalf("passed step shows gate %q", g)
	}
	if !strings.Contains(text(p.doc.Find(`#ledger li[data-step="ok"]`)), " ms") {
		t.Fatal("the step's latency is not shown")
	}
}
