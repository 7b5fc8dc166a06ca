package mcp

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traceCall carries the call's trace context to the server in the
// request's _meta (traceparent, tracestate: the W3C fields, as the MCP
// trace-context guidance and the OpenTelemetry MCP conventions describe)
// and names the harness's call span after the MCP conventions
// ("tools/call {tool}", mcp.method.name, gen_ai.tool.name,
// mcp.session.id, mcp.protocol.version). Without a span nothing is added.
// It returns meta with the trace fields appended.
func (c *conn) traceCall(ctx context.Context, sess *session, op string, meta []metaField) []metaField {
	span := trace.SpanFromContext(ctx)
	if !span.SpanContext().IsValid() {
		return meta
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	for k, v := range carrier {
		meta = append(meta, metaField{key: k, value: v})
	}
	if !span.IsRecording() {
		return meta
	}
	span.SetName("tools/call " + op)
	transport := "tcp"
	if c.kind == "stdio" {
		transport = "pipe"
	}
	attrs := []attribute.KeyValue{
		attribute.String("mcp.method.name", "tools/call"),
		attribute.String("gen_ai.tool.name", op),
		attribute.String("gen_ai.operation.name", "execute_tool"),
		attribute.String("mcp.protocol.version", sess.client.ProtocolVersion()),
		attribute.String("jsonrpc.protocol.version", "2.0"),
		attribute.String("network.transport", transport),
	}
	if id := sess.client.GetSessionId(); id != "" {
		attrs = append(attrs, attribute.String("mcp.session.id", id))
	}
	span.SetAttributes(attrs...)
	return meta
}
