package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// newHTTPExporter is the OTLP/HTTP exporter; it reads its endpoint,
// headers, timeout and TLS settings from OTEL_EXPORTER_OTLP_*.
func newHTTPExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	return otlptracehttp.New(ctx)
}
