package harness_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/telemetry"
)

// BenchmarkTracedExecution runs the three-call execution (submit, run by
// a worker, wait for its end) with tracing off (no tracer: what a
// deployment without OTEL_* pays) and on with every span sampled, batched
// and exported (to a discarding exporter, behind the redaction). On the
// real Redis when PATCHBAY_TEST_REDIS_URL is set.
func BenchmarkTracedExecution(b *testing.B) {
	for _, bc := range []struct {
		name   string
		tracer func(b *testing.B) trace.Tracer
	}{
		{"off", func(*testing.B) trace.Tracer { return nil }},
		{"on", func(b *testing.B) trace.Tracer {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
				sdktrace.WithBatcher(telemetry.Redacting(tracetest.NewNoopExporter(), secrets.NewSecretRedactor())))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			return tp.Tracer(telemetry.ScopeName)
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			st := storetest.New(b)
			mem := connecttest.NewMemory(
				connecttest.MemoryOp{Operation: connect.Operation{Name: "add"}, Fn: func(_ context.Context, a map[string]any) (any, error) {
					return map[string]any{"sum": a["a"].(float64) + a["b"].(float64)}, nil
				}},
				connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}},
			)
			reg := registry.NewRegistry(nil)
			must(b, reg.Add("mem", mem))
			must(b, reg.Start(context.Background()))
			als := gates.NewAllowlists(st)
			al, err := gates.ParseAllowlist("test", []byte(`{"connections":{"mem":{"ops":["*"]}}}`))
			must(b, err)
			_, err = als.Put(context.Background(), al, "bench")
			must(b, err)
			execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: als, Tracer: bc.tracer(b)})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = execs.Run(ctx, 2); close(done) }()
			b.Cleanup(func() { cancel(); <-done })
			req := harness.Request{Workflow: json.RawMessage(threeCalls), Input: map[string]any{"x": 1.0}, Principal: "bench", Allowlist: "test"}
			b.ReportAllocs()
			for b.Loop() {
				ex, err := execs.Submit(context.Background(), req)
				must(b, err)
				ex, err = execs.Wait(context.Background(), ex.ID, 10*time.Second)
				must(b, err)
				if ex.Status != harness.ExecSucceeded {
					b.Fatalf("status %s", ex.Status)
				}
			}
		})
	}
}
