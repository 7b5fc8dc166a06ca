package triggers

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// stampTrace keeps the trace context of the request that brought ev (a
// webhook's, a pushed event's) with it in the inbox, so the turn it
// starts continues that trace.
func stampTrace(ctx context.Context, ev *Event) {
	ev.Trace = nil // only ever the request's own, never a sender's field
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	ev.Trace = carrier
}

// traceContext is ctx under the trace context ev came with, which it
// takes off ev: trigger expressions and workflows see the event as it
// was sent.
func traceContext(ctx context.Context, ev *Event) context.Context {
	if ev.Trace == nil {
		return ctx
	}
	ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(ev.Trace))
	ev.Trace = nil
	return ctx
}
