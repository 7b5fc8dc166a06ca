package telemetry

import (
	"context"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// newGRPCExporter is set by exporter_grpc.go in binaries built with the
// otlpgrpc tag; nil otherwise.
var newGRPCExporter func(ctx context.Context) (sdktrace.SpanExporter, error)
