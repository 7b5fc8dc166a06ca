package telemetry

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/trace"
)

type executionKey struct{}

// WithExecution marks ctx as inside the execution id, for the log lines
// written under it (see LogHandler).
func WithExecution(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, executionKey{}, id)
}

// ExecutionID is the execution ctx runs inside, or "".
func ExecutionID(ctx context.Context) string {
	id, _ := ctx.Value(executionKey{}).(string)
	return id
}

// LogHandler wraps h so that a line logged with a context inside an
// execution carries execution_id, and one inside a span trace_id and
// span_id: logs, traces and the admin UI meet on them.
func LogHandler(h slog.Handler) slog.Handler { return &logHandler{base: h} }

type logHandler struct{ base slog.Handler }

func (h *logHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.base.Enabled(ctx, l) }

func (h *logHandler) Handle(ctx context.Context, rec slog.Record) error {
	if ctx != nil {
		if id := ExecutionID(ctx); id != "" {
			rec.AddAttrs(slog.String("execution_id", id))
		}
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			rec.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
		}
	}
	return h.base.Handle(ctx, rec)
}

func (h *logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &logHandler{base: h.base.WithAttrs(as)}
}

func (h *logHandler) WithGroup(name string) slog.Handler {
	return &logHandler{base: h.base.WithGroup(name)}
}
