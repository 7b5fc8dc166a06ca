package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Redacting wraps exp so that every span it is given is scrubbed first:
// its name, status, and the string values of its attributes, its events'
// attributes and its links' attributes. Done here, at the one place every
// span leaves the process, a secret cannot slip out through an attribute
// some instrumented site forgot to scrub.
func Redacting(exp sdktrace.SpanExporter, r Redactor) sdktrace.SpanExporter {
	if r == nil {
		return exp
	}
	return &redactingExporter{SpanExporter: exp, r: r}
}

type redactingExporter struct {
	sdktrace.SpanExporter
	r Redactor
}

func (e *redactingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = e.redact(s)
	}
	return e.SpanExporter.ExportSpans(ctx, out)
}

func (e *redactingExporter) redact(s sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	st := s.Status()
	st.Description = e.r.String(st.Description)
	events := make([]sdktrace.Event, len(s.Events()))
	for i, ev := range s.Events() {
		ev.Name = e.r.String(ev.Name)
		ev.Attributes = e.attrs(ev.Attributes)
		events[i] = ev
	}
	links := make([]sdktrace.Link, len(s.Links()))
	for i, l := range s.Links() {
		l.Attributes = e.attrs(l.Attributes)
		links[i] = l
	}
	return &redactedSpan{ReadOnlySpan: s, name: e.r.String(s.Name()), attrs: e.attrs(s.Attributes()), events: events, links: links, status: st}
}

func (e *redactingExporter) attrs(kvs []attribute.KeyValue) []attribute.KeyValue {
	out := make([]attribute.KeyValue, len(kvs))
	for i, kv := range kvs {
		out[i] = kv
		switch kv.Value.Type() {
		case attribute.STRING:
			out[i] = attribute.String(string(kv.Key), e.r.String(kv.Value.AsString()))
		case attribute.STRINGSLICE:
			vs := kv.Value.AsStringSlice()
			for j := range vs {
				vs[j] = e.r.String(vs[j])
			}
			out[i] = attribute.StringSlice(string(kv.Key), vs)
		}
	}
	return out
}

// redactedSpan is a span as exported: the scrubbed copies stand in for the
// recorded name, attributes, events, links and status.
type redactedSpan struct {
	sdktrace.ReadOnlySpan
	name   string
	attrs  []attribute.KeyValue
	events []sdktrace.Event
	links  []sdktrace.Link
	status sdktrace.Status
}

func (s *redactedSpan) Name() string                     { return s.name }
func (s *redactedSpan) Attributes() []attribute.KeyValue { return s.attrs }
func (s *redactedSpan) Events() []sdktrace.Event         { return s.events }
func (s *redactedSpan) Links() []sdktrace.Link           { return s.links }
func (s *redactedSpan) Status() sdktrace.Status          { return s.status }
