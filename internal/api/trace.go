package api

import (
	"net/http"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// continuesTrace are the routes whose caller's W3C trace context
// (traceparent, tracestate) the request's span continues: those that
// start work, so that a submitted execution or a webhook's turn joins the
// caller's trace. Other routes start traces of their own, so a client
// cannot graft them onto someone else's trace.
var continuesTrace = map[string]bool{
	http.MethodPost + " /v1/executions":     true,
	http.MethodPost + " /hooks/:connection": true,
}

// tracing starts a server span per request, named by method and route
// template (never the raw path, whose ids would make every name unique).
// Without a tracer it adds nothing.
func tracing(tracer trace.Tracer) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		if tracer == nil {
			return next
		}
		return func(c echo.Context) error {
			req := c.Request()
			route := c.Path()
			ctx := req.Context()
			if continuesTrace[req.Method+" "+route] {
				ctx = propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(req.Header))
			}
			name := req.Method
			if route != "" {
				name += " " + route
			}
			ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
				attribute.String("http.request.method", req.Method),
				attribute.String("http.route", route),
				attribute.String("url.path", req.URL.Path),
			))
			defer span.End()
			c.SetRequest(req.WithContext(ctx))
			err := next(c)
			status := c.Response().Status
			if err != nil {
				status = toProblem(err).Status
			}
			span.SetAttributes(attribute.Int("http.response.status_code", status))
			if status >= 500 {
				span.SetStatus(codes.Error, http.StatusText(status))
			}
			return err
		}
	}
}
