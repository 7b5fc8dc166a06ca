package harness_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/telemetry"
)

// recorder is an in-process span sink behind the same redaction as the
// OTLP exporter.
type recorder struct {
	exp *tracetest.InMemoryExporter
	tp  *sdktrace.TracerProvider
}

func newRecorder(red telemetry.Redactor) *recorder {
	exp := tracetest.NewInMemoryExporter()
	return &recorder{exp: exp, tp: sdktrace.NewTracerProvider(sdktrace.WithSyncer(telemetry.Redacting(exp, red)))}
}

func (r *recorder) tracer() trace.Tracer { return r.tp.Tracer(telemetry.ScopeName) }

// named returns the ended spans called name.
func (r *recorder) named(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range r.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func (r *recorder) one(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	got := r.named(name)
	if len(got) != 1 {
		var names []string
		for _, s := range r.exp.GetSpans() {
			names = append(names, s.Name)
		}
		t.Fatalf("%d spans %q, want 1 (spans: %v)", len(got), name, names)
	}
	return got[0]
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func hasGateEvent(s tracetest.SpanStub, gate int, verdict string) bool {
	for _, ev := range s.Events {
		var g int64
		var v string
		for _, kv := range ev.Attributes {
			switch kv.Key {
			case "patchbay.gate":
				g = kv.Value.AsInt64()
			case "patchbay.gate.verdict":
				v = kv.Value.AsString()
			}
		}
		if ev.Name == "gate" && g == int64(gate) && v == verdict {
			return true
		}
	}
	return false
}

// submitSpan is the span of the request that submits: the execution's
// runs are its children.
func submitSpan(t *testing.T) (context.Context, trace.SpanContext) {
	t.Helper()
	tid, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	must(t, err)
	sid, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	must(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return trace.ContextWithRemoteSpanContext(context.Background(), sc), sc
}

// tracedSvc is a connection with a read and a guarded send, and a model
// that answers in one round.
func tracedSvc(t *testing.T) (*registry.Registry, *scriptModels) {
	t.Helper()
	mem := connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "lookup"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "send"}},
	)
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("svc", mem))
	must(t, reg.SetPolicy("svc", registry.Policy{Approve: []string{"send"}}))
	must(t, reg.Start(context.Background()))
	models := &scriptModels{rounds: []agent.ModelResponse{{Text: "ok, send it.", StopReason: "end_turn", Usage: agent.ModelUsage{InputTokens: 12, OutputTokens: 4}}}}
	return reg, models
}

const tracedDoc = `{"version":1,"connections":{"svc":{}},"root":{"kind":"sequence","id":"main","steps":[
	{"kind":"call","id":"look","connection":"svc","op":"lookup","args":{"q":"pb"}},
	{"kind":"model","id":"think","model":"fake/m1","instructions":"Decide.","tools":[]},
	{"kind":"call","id":"send","connection":"svc","op":"send","args":{"to":"ops"}}]}}`

// TestExecutionSpanTree runs two calls, a model round and an approval
// under a submitting request's span. The run that parks at the approval
// runs on one replica; the decision resumes the execution on another,
// whose run continues the same trace from the record and links to the
// first run's span.
func TestExecutionSpanTree(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx, parent := submitSpan(t)
		reg, models := tracedSvc(t)
		const allow = `{"connections":{"svc":{"ops":["*"]}}}`
		first := newRecorder(nil)
		a, stopA := startReplica(t, st, reg, allow, harness.ExecutionsOptions{Models: models, Tracer: first.tracer()})

		ex, err := a.Submit(ctx, harness.Request{Workflow: json.RawMessage(tracedDoc), Principal: "alice", Allowlist: "ops"})
		must(t, err)
		if ex.TraceID != parent.TraceID().String() {
			t.Fatalf("traceId = %q, want the submitter's %s", ex.TraceID, parent.TraceID())
		}
		ap := waitApproval(t, a, ex.ID)
		waitStatus(t, a, ex.ID, harness.ExecWaiting)
		stopA()

		run1 := first.one(t, "execution")
		if run1.SpanContext.TraceID() != parent.TraceID() || run1.Parent.SpanID() != parent.SpanID() {
			t.Fatalf("first run: trace %s parent %s, want %s under %s", run1.SpanContext.TraceID(), run1.Parent.SpanID(), parent.TraceID(), parent.SpanID())
		}
		look := first.one(t, "call svc lookup")
		if look.Parent.SpanID() != run1.SpanContext.SpanID() || look.SpanKind != trace.SpanKindClient ||
			attr(look, "patchbay.operation").AsString() != "lookup" || !hasGateEvent(look, fault.GatePolicy, "allow") {
			t.Fatalf("lookup span = %+v", look)
		}
		step := first.one(t, "step think")
		chat := first.one(t, "chat m1")
		if chat.Parent.SpanID() != step.SpanContext.SpanID() || step.Parent.SpanID() != run1.SpanContext.SpanID() ||
			attr(chat, "gen_ai.operation.name").AsString() != "chat" || attr(chat, "gen_ai.request.model").AsString() != "m1" ||
			attr(chat, "gen_ai.provider.name").AsString() != "fake" ||
			attr(chat, "gen_ai.usage.input_tokens").AsInt64() != 12 || attr(chat, "gen_ai.usage.output_tokens").AsInt64() != 4 {
			t.Fatalf("model round span = %+v under %+v", chat, step)
		}
		held := first.one(t, "call svc send")
		if !hasGateEvent(held, fault.GatePolicy, "approval_required") || !hasGateEvent(held, fault.GateApprover, "pending") ||
			attr(held, "patchbay.outcome").AsString() != "waiting" {
			t.Fatalf("held send span = %+v", held)
		}

		second := newRecorder(nil)
		b, _ := startReplica(t, st, reg, allow, harness.ExecutionsOptions{Models: models, Tracer: second.tracer()})
		_, err = b.Approvals().Decide(context.Background(), ap.ID, gates.ApprovalApproved, "bob", "")
		must(t, err)
		done, err := b.Wait(context.Background(), ex.ID, 10*time.Second)
		must(t, err)
		if done.Status != harness.ExecSucceeded {
			t.Fatalf("status %s %+v", done.Status, done.Error)
		}
		run2 := waitSpan(t, second, "execution")
		if run2.SpanContext.TraceID() != parent.TraceID() || run2.Parent.SpanID() != parent.SpanID() {
			t.Fatalf("resumed run: trace %s parent %s, want the same trace under the submitter", run2.SpanContext.TraceID(), run2.Parent.SpanID())
		}
		if len(run2.Links) != 1 || run2.Links[0].SpanContext.SpanID() != run1.SpanContext.SpanID() {
			t.Fatalf("resumed run links %+v, want the first run %s", run2.Links, run1.SpanContext.SpanID())
		}
		if !attr(run2, "patchbay.execution.resumed").AsBool() || attr(run2, "patchbay.execution.status").AsString() != "succeeded" {
			t.Fatalf("resumed run attributes %+v", run2.Attributes)
		}
		sent := second.one(t, "call svc send")
		wait := second.one(t, "approval svc send")
		if !hasGateEvent(sent, fault.GateApprover, "approved") || wait.Parent.SpanID() != sent.SpanContext.SpanID() ||
			!wait.StartTime.Equal(ap.CreatedAt) || attr(wait, "patchbay.approval.decided_by").AsString() != "bob" {
			t.Fatalf("approval span %+v under send %+v", wait, sent)
		}
		if n := len(second.named("call svc lookup")) + len(second.named("chat m1")); n != 0 {
			t.Fatalf("replayed steps made %d spans on resume", n)
		}
	})
}

// waitSpan waits for the span to end (a run's span ends after Wait sees
// the execution finished).
func waitSpan(t *testing.T, r *recorder, name string) tracetest.SpanStub {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if s := r.named(name); len(s) > 0 {
			return s[0]
		}
	}
	t.Fatalf("no span %q", name)
	return tracetest.SpanStub{}
}

// startReplica runs workers until stop (or the end of the test); stop
// returns once they have.
func startReplica(t *testing.T, st *store.Store, reg *registry.Registry, allow string, opts harness.ExecutionsOptions) (execs *harness.Executions, stop func()) {
	t.Helper()
	opts.Allowlists = gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("ops", []byte(allow))
	must(t, err)
	_, err = opts.Allowlists.Put(context.Background(), al, "tester")
	must(t, err)
	execs = harness.NewExecutions(st, reg, &opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 2); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return execs, stop
}

// TestSpansNeverCarryASecret: whatever a call's secret is, and however a
// failing server echoes it back (in its error, its op's failure), no
// exported span name, attribute, event or status holds it.
func TestSpansNeverCarryASecret(t *testing.T) {
	t.Parallel()
	for i := range 20 {
		st := storetest.New(t) // a stream of its own: workers of the rounds before still run
		secret := "tok-" + rand.Text() + strings.Repeat("x", i)
		mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "leak"}, Fn: func(_ context.Context, a map[string]any) (any, error) {
			return nil, &connect.CallError{Op: "leak", Message: "refused token " + a["auth"].(string)}
		}})
		reg := registry.NewRegistry(nil)
		must(t, reg.Add("svc", mem))
		must(t, reg.Start(context.Background()))
		red := secrets.NewSecretRedactor()
		rec := newRecorder(red)
		secrets := &fakeSecrets{values: map[string]string{"svc.token": secret}}
		execs := startWorkers(t, st, reg, 1, "leaky", `{"connections":{"svc":{"ops":["*"],"secrets":{"svc.token":"leak.auth"}}}}`,
			harness.ExecutionsOptions{Secrets: secrets, Redactor: red, Tracer: rec.tracer()})
		ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(
			`{"version":1,"connections":{"svc":{}},"root":{"kind":"call","id":"c","connection":"svc","op":"leak","args":{"auth":{"$secret":"svc.token"}}}}`),
			Principal: "tester", Allowlist: "leaky"})
		must(t, err)
		ex, err = execs.Wait(context.Background(), ex.ID, 10*time.Second)
		must(t, err)
		if ex.Status != harness.ExecFailed {
			t.Fatalf("status %s, want failed", ex.Status)
		}
		waitSpan(t, rec, "execution")
		spans := rec.exp.GetSpans()
		data, err := json.Marshal(spans)
		must(t, err)
		if strings.Contains(string(data), secret) {
			t.Fatalf("secret %q exported in a span: %s", secret, data)
		}
		if !strings.Contains(string(data), "refused token") {
			t.Fatalf("the failure is not on the span at all: %s", data)
		}
	}
}

// TestNoTracerNoSpans: without a tracer nothing is recorded and the
// record keeps no trace.
func TestNoTracerNoSpans(t *testing.T) {
	t.Parallel()
	b := setup(t, storetest.New(t))
	ctx, _ := submitSpan(t)
	ex, err := b.submit(ctx, threeCalls, map[string]any{"x": 1.0})
	must(t, err)
	ex, err = b.execs.Wait(ctx, ex.ID, 10*time.Second)
	must(t, err)
	if ex.Status != harness.ExecSucceeded || ex.TraceID != "" {
		t.Fatalf("status %s traceId %q, want succeeded and none", ex.Status, ex.TraceID)
	}
	if errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// TestLookSpans: each read a model is shown is a span under its model
// step, with the read's form and estimated tokens (the look event's), and
// its tool's gate verdict as an event; a verify's read is one too.
func TestLookSpans(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	page := newPage()
	reg := startRegistry(t, map[string]connect.Provider{"web": pageServer(page)}, nil)
	models := &scriptModels{rounds: []agent.ModelResponse{
		{ToolCalls: []agent.ModelToolCall{toolCall("c1", "web_look", `{"read":"screen.current"}`)}},
		{Text: "Seen."},
	}}
	rec := newRecorder(nil)
	execs := startWorkers(t, st, reg, 1, "test", `{"connections":{"web":{"ops":["*"]}}}`, harness.ExecutionsOptions{Models: models, Tracer: rec.tracer()})
	doc := `{"version":1,"connections":{"web":{"profile":"browser@^1"}},"root":{"kind":"model","id":"turn","model":"fake/m1"}}`
	ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Input: "Look.", Principal: "alice", Allowlist: "test"})
	must(t, err)
	ex, err = execs.Wait(context.Background(), ex.ID, 20*time.Second)
	must(t, err)
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("execution %s %+v", ex.Status, ex.Error)
	}
	waitSpan(t, rec, "execution")
	step := rec.one(t, "step turn")
	var got []string
	for _, ev := range lookEvents(t, execs, ex.ID) {
		read, form, tokens := ev["read"].(string), ev["form"].(string), int64(ev["tokens"].(float64))
		got = append(got, read+" "+form)
		var span *tracetest.SpanStub
		for _, s := range rec.named("look " + read) {
			if attr(s, "patchbay.read.form").AsString() == form && attr(s, "patchbay.read.tokens_estimated").AsInt64() == tokens {
				span = &s
			}
		}
		if span == nil || span.Parent.SpanID() != step.SpanContext.SpanID() || attr(*span, "patchbay.connection").AsString() != "web" ||
			attr(*span, "patchbay.read").AsString() != read || !hasGateEvent(*span, fault.GatePolicy, "allow") {
			t.Fatalf("look event %v: span %+v under %s", ev, span, step.SpanContext.SpanID())
		}
	}
	spans := len(rec.named("look browser.page.summary")) + len(rec.named("look ui.tree")) + len(rec.named("look screen.current"))
	if strings.Join(got, ",") != "browser.page.summary full,ui.tree full,screen.current full,browser.page.summary unchanged" || spans != len(got) {
		t.Fatalf("look events %v, %d look spans", got, spans)
	}

	ex = runRead(t, execs, verifyDoc("web", `{"profile":"browser@^1"}`, "browser.page.summary", `[{"at":"title","equals":"Sign in"}]`))
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("verify %s %+v", ex.Status, ex.Error)
	}
	read := waitSpan(t, rec, "read browser.page.summary")
	if read.Parent.SpanID() != rec.one(t, "step v").SpanContext.SpanID() || attr(read, "patchbay.read.tokens_estimated").AsInt64() <= 0 {
		t.Fatalf("verify read span %+v", read)
	}
}

// gateEvents lists span's gate events as "<gate> <name> <verdict>".
func gateEvents(s tracetest.SpanStub) []string {
	var out []string
	for _, ev := range s.Events {
		if ev.Name != "gate" {
			continue
		}
		e := map[attribute.Key]attribute.Value{}
		for _, kv := range ev.Attributes {
			e[kv.Key] = kv.Value
		}
		out = append(out, fmt.Sprintf("%d %s %s", e["patchbay.gate"].AsInt64(), e["patchbay.gate.name"].AsString(), e["patchbay.gate.verdict"].AsString()))
	}
	return out
}

// TestGateEventsPerGate: a call's span has one event per gate checked, in
// the order they are checked, ending with the refusing gate if one
// refused.
func TestGateEventsPerGate(t *testing.T) {
	t.Parallel()
	mem := connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "lookup", InputSchema: obj("q")}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "drop"}},
	)
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("svc", mem))
	must(t, reg.SetPolicy("svc", registry.Policy{Deny: []string{"drop"}}))
	must(t, reg.Start(context.Background()))
	for _, tc := range []struct {
		name, call string
		want       []string
	}{
		{"allowed", `"op":"lookup","args":{"q":"pb"}`, []string{"1 declared pass", "3 refs pass", "2 schema pass", "4 policy allow"}},
		{"schema", `"op":"lookup","args":{"q":7}`, []string{"1 declared pass", "3 refs pass", "2 schema refused"}},
		{"policy", `"op":"drop","args":{}`, []string{"1 declared pass", "3 refs pass", "2 schema pass", "4 policy refused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder(nil)
			execs := startWorkers(t, storetest.New(t), reg, 1, "ops", `{"connections":{"svc":{"ops":["*"]}}}`, harness.ExecutionsOptions{Tracer: rec.tracer()})
			ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(
				`{"version":1,"connections":{"svc":{}},"root":{"kind":"call","id":"c","connection":"svc",` + tc.call + `}}`), Principal: "tester", Allowlist: "ops"})
			must(t, err)
			_, err = execs.Wait(context.Background(), ex.ID, 10*time.Second)
			must(t, err)
			waitSpan(t, rec, "execution")
			var call tracetest.SpanStub
			for _, s := range rec.exp.GetSpans() {
				if strings.HasPrefix(s.Name, "call svc ") {
					call = s
				}
			}
			if got := gateEvents(call); strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("gate events %v, want %v", got, tc.want)
			}
		})
	}
}
