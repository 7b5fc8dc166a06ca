// Package telemetry owns patchbay's OpenTelemetry setup: the tracer
// provider and its OTLP exporter, configured by the standard OTEL_*
// variables, and the redaction every exported attribute passes.
//
// Tracing is off unless an OTLP endpoint is configured
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, or
// OTEL_TRACES_EXPORTER=otlp for the default localhost endpoint). Off, Setup
// returns a nil Tracer and the instrumented code skips its spans
// altogether, so an untraced deployment pays nothing for them.
//
// The exporter reads the rest of the OTEL_EXPORTER_OTLP_* variables
// (headers, timeout, compression, certificates) itself, the sampler comes
// from OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, and the resource
// from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (service.name
// defaults to "patchbay").
package telemetry

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of patchbay's spans.
const ScopeName = "github.com/patchbay-dev/patchbay"

// Redactor scrubs secrets from text; the harness's secret redactor is one.
type Redactor interface {
	String(s string) string
}

// Telemetry is the tracing of one process.
type Telemetry struct {
	// Tracer starts patchbay's spans; nil when tracing is off.
	Tracer trace.Tracer
	// Provider is the tracer provider behind Tracer; nil when off.
	Provider trace.TracerProvider
	shutdown func(context.Context) error
}

// Enabled reports whether spans are recorded and exported.
func (t *Telemetry) Enabled() bool { return t != nil && t.Tracer != nil }

// Shutdown flushes the spans still buffered and stops the exporter.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t == nil || t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// Protocols of OTEL_EXPORTER_OTLP_PROTOCOL.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Settings is what Setup reads of the environment to decide whether and
// how to export.
type Settings struct {
	Enabled  bool
	Protocol string
}

// Read decides from the OTEL_* variables whether tracing is on and over
// which protocol.
func Read(getenv func(string) string) (Settings, error) {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return Settings{}, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return Settings{}, nil
	case "", "otlp":
		on := exp == "otlp" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
		if !on {
			return Settings{}, nil
		}
	default:
		return Settings{}, fmt.Errorf("OTEL_TRACES_EXPORTER: %q is not supported (otlp or none)", exp)
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch proto {
	case "", ProtocolHTTP:
		proto = ProtocolHTTP
	case ProtocolGRPC:
	default:
		return Settings{}, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL: %q is not supported (http/protobuf or grpc)", proto)
	}
	return Settings{Enabled: true, Protocol: proto}, nil
}

// Setup builds the tracing that getenv asks for. Every span it exports
// passes redactor first.
func Setup(ctx context.Context, getenv func(string) string, redactor Redactor) (*Telemetry, error) {
	s, err := Read(getenv)
	if err != nil || !s.Enabled {
		return &Telemetry{}, err
	}
	var exp sdktrace.SpanExporter
	switch s.Protocol {
	case ProtocolGRPC:
		exp, err = newGRPCExporter(ctx)
	default:
		exp, err = newHTTPExporter(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP %s exporter: %w", s.Protocol, err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "patchbay"), attribute.String("service.version", Version())),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res),
		sdktrace.WithBatcher(Redacting(exp, redactor)))
	return &Telemetry{Tracer: tp.Tracer(ScopeName), Provider: tp, shutdown: tp.Shutdown}, nil
}

// Version is patchbay's module version as built, or "dev".
func Version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
