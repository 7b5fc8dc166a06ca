//go:build otlpgrpc

package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func init() {
	newGRPCExporter = func(ctx context.Context) (sdktrace.SpanExporter, error) {
		return otlptracegrpc.New(ctx)
	}
}
