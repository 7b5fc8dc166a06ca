package harness

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/telemetry"
)

// Tracing: with a tracer (ExecutionsOptions.Tracer) each run of an
// execution is a span, each step under it, each connection call a client
// span carrying its gate decisions as events, each model round a GenAI
// client span, and each decided approval a span covering the wait for the
// person. The execution's trace context is kept in its record, so a run
// resumed after a crash or on another replica joins the same trace, with a
// link to the run before it. Without a tracer none of it runs.
//
// Attributes are scrubbed again where spans leave the process
// (telemetry.Redacting); the harness does not put arguments or results on
// spans at all.

// traceRecord is the trace context an execution keeps in its record.
type traceRecord struct {
	// Parent is the W3C traceparent every run of the execution starts
	// under: the request that submitted it, or its first run.
	Parent string `json:"parent"`
	State  string `json:"state,omitempty"`
	// Run is the traceparent of the last run's span, which the next run
	// links to.
	Run string `json:"run,omitempty"`
}

var w3c = propagation.TraceContext{}

// spanContextOf parses a stored traceparent (and tracestate).
func spanContextOf(parent, state string) trace.SpanContext {
	if parent == "" {
		return trace.SpanContext{}
	}
	carrier := propagation.MapCarrier{"traceparent": parent}
	if state != "" {
		carrier["tracestate"] = state
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), carrier))
}

// traceparentOf is the W3C traceparent and tracestate of sc.
func traceparentOf(sc trace.SpanContext) (parent, state string) {
	carrier := propagation.MapCarrier{}
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), carrier)
	return carrier["traceparent"], carrier["tracestate"]
}

// stampTrace keeps the submitter's trace context (the API request's span)
// in a new execution's record, so that its runs continue that trace.
func (e *Executions) stampTrace(ctx context.Context, rec *record) {
	if e.tracer == nil {
		return
	}
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return
	}
	parent, state := traceparentOf(sc)
	rec.Trace = &traceRecord{Parent: parent, State: state}
	rec.TraceID = sc.TraceID().String()
}

// traceRun starts the span of one run of rec (claim epoch) under the
// execution's trace, linked to the run before it, and records it in rec
// for the next run; the first save of the run writes it. Log lines under
// the returned context carry the execution's id whether or not tracing is
// on. end closes the span with the run's outcome.
func (e *Executions) traceRun(ctx context.Context, rec *record, epoch int64) (context.Context, func(err error)) {
	ctx = telemetry.WithExecution(ctx, rec.ID)
	if e.tracer == nil {
		return ctx, func(err error) {
			if err == nil {
				e.executionDone(rec)
			}
		}
	}
	opts := []trace.SpanStartOption{trace.WithAttributes(
		attribute.String("patchbay.execution.id", rec.ID),
		attribute.Int64("patchbay.execution.epoch", epoch),
		attribute.Bool("patchbay.execution.resumed", epoch > 1),
	)}
	if rec.Trace != nil {
		if parent := spanContextOf(rec.Trace.Parent, rec.Trace.State); parent.IsValid() {
			ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
		}
		if prev := spanContextOf(rec.Trace.Run, ""); prev.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: prev,
				Attributes: []attribute.KeyValue{attribute.String("patchbay.link", "previous_run")}}))
		}
	}
	ctx, span := e.tracer.Start(ctx, "execution", opts...)
	run, _ := traceparentOf(span.SpanContext())
	if rec.Trace == nil || rec.Trace.Parent == "" {
		rec.Trace = &traceRecord{Parent: run}
		rec.TraceID = span.SpanContext().TraceID().String()
	}
	rec.Trace.Run = run
	return ctx, func(err error) {
		if err == nil {
			e.executionDone(rec)
		}
		span.SetAttributes(attribute.String("patchbay.execution.status", string(rec.Status)))
		if err != nil {
			span.SetStatus(codes.Error, e.redactor.String(err.Error()))
		} else if rec.Error != nil {
			span.SetStatus(codes.Error, rec.Error.Code)
		}
		span.End()
	}
}

// stepSpan is a step's span and timing; a value, so that a run without
// a tracer allocates nothing for it.
type stepSpan struct {
	r       *run
	n       *document.Node
	started time.Time
	span    trace.Span // nil: not traced
}

// traceStep starts the span of a step other than a sequence (which only
// orders its children) and a call (call makes its own, see traceCall),
// and times the step for the metrics. end takes the step's error.
func (r *run) traceStep(ctx context.Context, f *frame, n *document.Node) (context.Context, stepSpan) {
	if n.Kind == document.KindSequence || n.Kind == document.KindCall {
		return ctx, stepSpan{}
	}
	s := stepSpan{r: r, n: n, started: time.Now()}
	if r.e.tracer != nil {
		ctx, s.span = r.e.tracer.Start(ctx, "step "+n.ID, trace.WithAttributes(
			attribute.String("patchbay.step.id", n.ID),
			attribute.String("patchbay.step.kind", n.Kind),
			attribute.String("patchbay.step.key", n.ID+f.suffix),
		))
	}
	return ctx, s
}

func (s stepSpan) end(errp *error) {
	if s.r == nil {
		return
	}
	err := *errp
	if !interruption(err) {
		s.r.e.stepDone(s.n.Kind, s.n.Connection, s.n.Op, outcome(err), time.Since(s.started))
	}
	if s.span != nil {
		endSpan(s.span, err, s.r.e.redactor)
	}
}

// callSpan is a call's span (nil when not traced).
type callSpan struct {
	r    *run
	span trace.Span
}

// traceCall starts the client span of one connection call (a call step or
// a model's tool call): gate decisions become its events, and the
// provider names it and adds its protocol's attributes (MCP or HTTP).
// end records a refusal by its gate.
func (r *run) traceCall(ctx context.Context, n *document.Node, key, conn string) (context.Context, callSpan) {
	c := callSpan{r: r}
	if r.e.tracer != nil {
		ctx, c.span = r.e.tracer.Start(ctx, "call "+conn+" "+n.Op, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
			attribute.String("patchbay.connection", conn),
			attribute.String("patchbay.operation", n.Op),
			attribute.String("patchbay.step.id", n.ID),
			attribute.String("patchbay.step.key", key),
		))
	}
	return ctx, c
}

func (c callSpan) end(err error) {
	if err != nil {
		c.refused(err) // apart: its errors.As target would be allocated on every call
	}
	if c.span != nil {
		endSpan(c.span, err, c.r.e.redactor)
	}
}

// refused records a refusal: the gates checked before the one that
// refused passed (gates 1–4 are recorded only now: traceGates sees no
// refusal), then the refusing gate.
func (c callSpan) refused(err error) {
	var d *fault.Denied
	if !errors.As(err, &d) {
		return
	}
	c.r.e.gateRefused(d.Gate)
	if c.span != nil {
		gatesRefused(c.span, d.Gate)
	}
}

// gateChecks is the order gates 1–4 are checked in: refs are opened
// before the schema sees the arguments.
var gateChecks = [...]int{fault.GateDeclared, fault.GateRefs, fault.GateSchema, fault.GatePolicy}

// gateNames names the gates on span events.
var gateNames = [...]string{fault.GateDeclared: "declared", fault.GateSchema: "schema", fault.GateRefs: "refs", fault.GatePolicy: "policy", fault.GateApprover: "approver", fault.GateSecrets: "secrets"}

// gateEvent is one gate's verdict on span.
func gateEvent(span trace.Span, gate int, verdict string, more ...attribute.KeyValue) {
	name := ""
	if gate > 0 && gate < len(gateNames) {
		name = gateNames[gate]
	}
	span.AddEvent("gate", trace.WithAttributes(append([]attribute.KeyValue{attribute.Int("patchbay.gate", gate),
		attribute.String("patchbay.gate.name", name), attribute.String("patchbay.gate.verdict", verdict)}, more...)...))
}

// gatesRefused records gate's refusal after the gates of 1–4 checked
// before it; a refusal past gate 4 follows gates traceGates recorded.
func gatesRefused(span trace.Span, gate int) {
	if gate <= fault.GatePolicy {
		for _, g := range gateChecks {
			if g == gate {
				break
			}
			gateEvent(span, g, "pass")
		}
	}
	gateEvent(span, gate, "refused")
}

// traceGates records each of gates 1–4 on the call's span when they let
// the call on (a refusal is recorded when the call ends).
func traceGates(ctx context.Context, v gates.Verdict, err error) {
	span := trace.SpanFromContext(ctx)
	if err != nil || !span.IsRecording() {
		return
	}
	for _, g := range gateChecks[:len(gateChecks)-1] {
		gateEvent(span, g, "pass")
	}
	verdict := "allow"
	if v == gates.NeedsApproval {
		verdict = "approval_required"
	}
	gateEvent(span, fault.GatePolicy, verdict)
}

// traceApproval records gate 5 on the call's span and, once a person
// decided (or the approval expired), a span covering the wait from the
// request to the decision: it is made when the run that goes on after the
// decision asks again, since the wait itself spans no process.
func (r *run) traceApproval(ctx context.Context, ap *gates.Approval) {
	if r.e.tracer == nil || ap == nil {
		return
	}
	span := trace.SpanFromContext(ctx)
	gateEvent(span, fault.GateApprover, string(ap.State), attribute.String("patchbay.approval.id", ap.ID))
	if ap.State == gates.ApprovalPending || ap.DecidedAt == nil {
		return
	}
	_, wait := r.e.tracer.Start(ctx, "approval "+ap.Connection+" "+ap.Op, trace.WithTimestamp(ap.CreatedAt), trace.WithAttributes(
		attribute.String("patchbay.approval.id", ap.ID),
		attribute.String("patchbay.approval.state", string(ap.State)),
		attribute.String("patchbay.approval.decided_by", ap.DecidedBy),
		attribute.String("patchbay.connection", ap.Connection),
		attribute.String("patchbay.operation", ap.Op),
	))
	if ap.State != gates.ApprovalApproved {
		wait.SetStatus(codes.Error, string(ap.State))
	}
	wait.End(trace.WithTimestamp(*ap.DecidedAt))
}

// readSpan is the span of one profile read (nil when not traced).
type readSpan struct {
	r    *run
	span trace.Span
}

// traceRead starts the span of one profile read: "look <read>" for a read
// shown to a model (under its model step), "read <read>" for one a verify
// judges. Gates 1–4 of the read's tool are its events, as on a call.
func (r *run) traceRead(ctx context.Context, use, conn, read string) (context.Context, readSpan) {
	s := readSpan{r: r}
	if r.e.tracer != nil {
		ctx, s.span = r.e.tracer.Start(ctx, use+" "+read, trace.WithAttributes(
			attribute.String("patchbay.connection", conn),
			attribute.String("patchbay.read", read),
		))
	}
	return ctx, s
}

// end records how the read was shown (form: full, diff, unchanged,
// failed; "" for a verify) and its estimated tokens, bytes/4 of what the
// model was shown (of the render, for a verify).
func (s readSpan) end(form string, tokens int, err error) {
	if s.span == nil {
		return
	}
	if form != "" {
		s.span.SetAttributes(attribute.String("patchbay.read.form", form))
	}
	s.span.SetAttributes(attribute.Int("patchbay.read.tokens_estimated", tokens))
	var d *fault.Denied
	if errors.As(err, &d) {
		gateEvent(s.span, d.Gate, "refused") // the read's own checks run in no fixed gate order
	}
	endSpan(s.span, err, s.r.e.redactor)
}

// traceRound starts the GenAI client span of one model round. end adds
// the response's model, token use and finish reason.
func (r *run) traceRound(ctx context.Context, spec *document.ModelSpec) (context.Context, func(*agent.ModelResponse, error)) {
	if r.e.tracer == nil {
		return ctx, func(*agent.ModelResponse, error) {}
	}
	ctx, span := r.e.tracer.Start(ctx, "chat "+spec.Name(), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("gen_ai.operation.name", "chat"),
		attribute.String("gen_ai.provider.name", spec.Provider()),
		attribute.String("gen_ai.request.model", spec.Name()),
	))
	return ctx, func(resp *agent.ModelResponse, err error) {
		if resp != nil {
			span.SetAttributes(
				attribute.Int64("gen_ai.usage.input_tokens", resp.Usage.InputTokens),
				attribute.Int64("gen_ai.usage.output_tokens", resp.Usage.OutputTokens),
			)
			if resp.StopReason != "" {
				span.SetAttributes(attribute.StringSlice("gen_ai.response.finish_reasons", []string{resp.StopReason}))
			}
		}
		endSpan(span, err, r.e.redactor)
	}
}

// endSpan ends span with err's outcome: a run parking or cut short is not
// an error of the step.
func endSpan(span trace.Span, err error, red secrets.Redactor) {
	switch {
	case err == nil:
	case errors.Is(err, errWaiting):
		span.SetAttributes(attribute.String("patchbay.outcome", "waiting"))
	case interruption(err):
		span.SetAttributes(attribute.String("patchbay.outcome", "interrupted"))
	default:
		span.SetAttributes(attribute.String("error.type", asExecError(err).Code))
		span.SetStatus(codes.Error, red.String(err.Error()))
	}
	span.End()
}

// inExecution is a context for the log lines of goroutines that work for
// an execution outside its run's context (lease renewal and release), so
// that they carry its execution_id too.
func inExecution(id string) context.Context {
	return telemetry.WithExecution(context.Background(), id)
}
