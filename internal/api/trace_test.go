package api_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// tracedServer is the API over a memory connection with tracing into an
// in-process recorder.
func tracedServer(t *testing.T) (url string, spans *tracetest.InMemoryExporter) {
	t.Helper()
	spans = tracetest.NewInMemoryExporter()
	tracer := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)).Tracer("test")
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("mem", mem))
	must(t, reg.Start(context.Background()))
	st := storetest.New(t)
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("test", []byte(`{"connections":{"mem":{"ops":["*"]}}}`))
	must(t, err)
	_, err = als.Put(context.Background(), al, "setup")
	must(t, err)
	metrics := api.NewMetrics()
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Observer: metrics, Allowlists: als, Tracer: tracer})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 2); close(done) }()
	srv := httptest.NewServer(api.New(api.Options{Executions: execs, Registry: reg, Allowlists: als, APIKeys: testKeys(), Metrics: metrics, Tracer: tracer}))
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return srv.URL, spans
}

func spanNamed(spans *tracetest.InMemoryExporter, name string) (tracetest.SpanStub, bool) {
	for _, s := range spans.GetSpans() {
		if s.Name == name {
			return s, true
		}
	}
	return tracetest.SpanStub{}, false
}

const (
	callerTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan   = "00f067aa0ba902b7"
	callerParent = "00-" + callerTrace + "-" + callerSpan + "-01"
)

// TestTraceparentOnSubmitIsTheParent: POST /v1/executions with a
// traceparent makes the request's span its child, the execution's run a
// child of the request, and the execution reports the trace.
func TestTraceparentOnSubmitIsTheParent(t *testing.T) {
	t.Parallel()
	url, spans := tracedServer(t)
	body := `{"wait":10,"workflow":{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"e","connection":"mem","op":"echo","args":{"v":1}}}}`
	req, err := http.NewRequest(http.MethodPost, url+"/v1/executions", strings.NewReader(body))
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", callerParent)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"traceId":"`+callerTrace+`"`) {
		t.Fatalf("POST = %d %s, want the caller's trace id", resp.StatusCode, data)
	}
	var run tracetest.SpanStub
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var ok bool
		if run, ok = spanNamed(spans, "execution"); ok {
			break
		}
	}
	post, ok := spanNamed(spans, "POST /v1/executions")
	if !ok || post.SpanKind != trace.SpanKindServer {
		t.Fatalf("no server span for the POST: %+v", spans.GetSpans())
	}
	if post.SpanContext.TraceID().String() != callerTrace || post.Parent.SpanID().String() != callerSpan || !post.Parent.IsRemote() {
		t.Fatalf("POST span trace %s parent %s, want the caller's", post.SpanContext.TraceID(), post.Parent.SpanID())
	}
	if run.Parent.SpanID() != post.SpanContext.SpanID() || run.SpanContext.TraceID().String() != callerTrace {
		t.Fatalf("execution span parent %s, want the POST's %s", run.Parent.SpanID(), post.SpanContext.SpanID())
	}
}

// TestTraceparentElsewhereStartsANewTrace: a route that starts no work
// does not join a caller's trace.
func TestTraceparentElsewhereStartsANewTrace(t *testing.T) {
	t.Parallel()
	url, spans := tracedServer(t)
	req, err := http.NewRequest(http.MethodGet, url+"/v1/connections", nil)
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("traceparent", callerParent)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	resp.Body.Close()
	get, ok := spanNamed(spans, "GET /v1/connections")
	if !ok || get.SpanContext.TraceID().String() == callerTrace || get.Parent.IsValid() {
		t.Fatalf("GET span = %+v, want a root of its own", get)
	}
}

// TestHealthHistogramsMove: an execution run through the API moves the
// execution and call histograms /metrics shows.
func TestHealthHistogramsMove(t *testing.T) {
	t.Parallel()
	url, _ := tracedServer(t)
	body := `{"wait":10,"workflow":{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"s","steps":[
		{"kind":"call","id":"a","connection":"mem","op":"echo","args":{"v":1}},
		{"kind":"call","id":"b","connection":"mem","op":"echo","args":{"v":2}}]}}}`
	req, err := http.NewRequest(http.MethodPost, url+"/v1/executions", strings.NewReader(body))
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST = %d", resp.StatusCode)
	}
	want := []string{
		`patchbay_execution_duration_seconds_count{state="succeeded"} 1`,
		`patchbay_call_duration_seconds_count{connection="mem",op="echo"} 2`,
	}
	var text string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(url + "/metrics")
		must(t, err)
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		text = string(data)
		missing := false
		for _, w := range want {
			missing = missing || !strings.Contains(text, w)
		}
		if !missing {
			return
		}
	}
	t.Fatalf("/metrics lacks %v:\n%s", want, text)
}
