package triggers_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

// TestEventTraceContinuesIntoItsTurn: the trace of the request that
// brought an event (a webhook's) is kept with it in the inbox, and the
// turn it starts runs in that trace; the workflow's input does not show
// it.
func TestEventTraceContinuesIntoItsTurn(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	f := baseFile()
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("mem", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})))
	for name, c := range f.Connections {
		must(t, reg.Add(name, triggers.NewProvider(name, c)))
	}
	must(t, reg.Start(context.Background()))
	tracer := sdktrace.NewTracerProvider().Tracer("test")
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Tracer: tracer})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 2); close(done) }()
	svc, err := triggers.New(triggers.Options{Store: st, Executions: execs, Registry: reg, File: f})
	must(t, err)
	t.Cleanup(func() { svc.Close(); cancel(); <-done })
	must(t, svc.Start(ctx))

	reqCtx, span := tracer.Start(context.Background(), "POST /hooks/:connection")
	_, err = svc.Emit(reqCtx, "deploys", failed("run-7", "api"), triggers.Via{Kind: "webhook"})
	span.End()
	must(t, err)
	var turn *harness.Execution
	waitFor(t, "the turn", func() bool {
		all := allExecutions(t, execs)
		if len(all) == 1 && all[0].Status.Terminal() {
			turn = all[0]
		}
		return turn != nil
	})
	if turn.TraceID != span.SpanContext().TraceID().String() {
		t.Fatalf("turn trace %q, want the request's %s", turn.TraceID, span.SpanContext().TraceID())
	}
	ev := turn.Input.(map[string]any)["connection_event"].(map[string]any)
	if _, ok := ev["trace"]; ok {
		t.Fatalf("the workflow sees the trace context: %v", ev)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
