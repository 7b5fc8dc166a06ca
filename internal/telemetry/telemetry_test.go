package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestReadDecidesFromTheStandardVariables(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		want    Settings
		wantErr string
	}{
		{name: "unset is off", env: nil, want: Settings{}},
		{name: "endpoint turns it on over HTTP", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, want: Settings{Enabled: true, Protocol: ProtocolHTTP}},
		{name: "traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, want: Settings{Enabled: true, Protocol: ProtocolHTTP}},
		{name: "exporter otlp alone", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, want: Settings{Enabled: true, Protocol: ProtocolHTTP}},
		{name: "grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: Settings{Enabled: true, Protocol: ProtocolGRPC}},
		{name: "traces protocol wins", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, want: Settings{Enabled: true, Protocol: ProtocolHTTP}},
		{name: "none", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_EXPORTER": "none"}, want: Settings{}},
		{name: "sdk disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_SDK_DISABLED": "true"}, want: Settings{}},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "OTEL_TRACES_EXPORTER"},
		{name: "http/json refused", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErr: "OTEL_EXPORTER_OTLP_PROTOCOL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Read(env(tt.env))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Read = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestSetupOffHasNoTracer(t *testing.T) {
	t.Parallel()
	tel, err := Setup(context.Background(), env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if tel.Enabled() || tel.Tracer != nil {
		t.Fatal("tracing is on with no OTEL_* variable set")
	}
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestSetupOnBuildsAnExporter(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1") // nothing listens; nothing is sent
	tel, err := Setup(context.Background(), env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !tel.Enabled() {
		t.Fatal("tracing is off with an endpoint set")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // shut down at once: the batch is dropped, not sent
	_ = tel.Shutdown(ctx)
}

func TestSetupGRPCBuildsAnExporter(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	tel, err := Setup(context.Background(), env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !tel.Enabled() {
		t.Fatal("tracing is off with an endpoint set")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = tel.Shutdown(ctx)
}

type replacer struct{ secret string }

func (r replacer) String(s string) string { return strings.ReplaceAll(s, r.secret, "<redacted>") }

func TestRedactingScrubsEverythingExported(t *testing.T) {
	t.Parallel()
	const secret = "hunter2-s3cr3t"
	rec := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(Redacting(rec, replacer{secret})))
	_, span := tp.Tracer("t").Start(context.Background(), "call "+secret,
		trace.WithLinks(trace.Link{Attributes: []attribute.KeyValue{attribute.String("l", secret)}}))
	span.SetAttributes(attribute.String("a", "x"+secret), attribute.StringSlice("s", []string{secret, "ok"}), attribute.Int("n", 7))
	span.AddEvent("ev "+secret, trace.WithAttributes(attribute.String("e", secret)))
	span.SetStatus(codes.Error, "failed with "+secret)
	span.End()
	spans := rec.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	data, err := json.Marshal(spans)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte(secret)) {
		t.Fatalf("the secret was exported: %s", data)
	}
	if !bytes.Contains(data, []byte("redacted")) || !bytes.Contains(data, []byte(`"Key":"n"`)) {
		t.Fatalf("attributes lost rather than scrubbed: %s", data)
	}
}

func TestLogHandlerJoinsLinesToExecutionAndTrace(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	logger := slog.New(LogHandler(slog.NewJSONHandler(&buf, nil))).With("k", "v")
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("t").Start(WithExecution(context.Background(), "ex_1"), "s")
	defer span.End()
	logger.InfoContext(ctx, "inside")
	logger.Info("outside")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var in, out map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &in); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &out); err != nil {
		t.Fatal(err)
	}
	sc := span.SpanContext()
	if in["execution_id"] != "ex_1" || in["trace_id"] != sc.TraceID().String() || in["span_id"] != sc.SpanID().String() || in["k"] != "v" {
		t.Fatalf("line inside the execution = %v", in)
	}
	if _, ok := out["execution_id"]; ok {
		t.Fatalf("line outside carries an execution: %v", out)
	}
}
