package openapi

import (
	"context"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traceRequest sends the call's trace context in the request's W3C
// headers (traceparent, tracestate) and names the harness's call span
// after the HTTP client conventions ("{method} {path template}",
// http.request.method, url.template, server.address). The full URL is
// left off: its query may carry credentials.
func traceRequest(ctx context.Context, req *http.Request, op operation) {
	span := trace.SpanFromContext(ctx)
	if !span.SpanContext().IsValid() {
		return
	}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	if !span.IsRecording() {
		return
	}
	span.SetName(op.Method + " " + op.Path)
	attrs := []attribute.KeyValue{
		attribute.String("http.request.method", op.Method),
		attribute.String("url.template", op.Path),
		attribute.String("url.scheme", req.URL.Scheme),
		attribute.String("server.address", req.URL.Hostname()),
	}
	if p, err := strconv.Atoi(req.URL.Port()); err == nil {
		attrs = append(attrs, attribute.Int("server.port", p))
	}
	span.SetAttributes(attrs...)
}

// traceResponse adds the response's status to the call's span; a status
// of 400 or more is an error of the client span.
func traceResponse(ctx context.Context, status int) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 400 {
		span.SetAttributes(attribute.String("error.type", strconv.Itoa(status)))
		span.SetStatus(codes.Error, "")
	}
}
