package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// fakeBrowsers provisions one Memory connection per lease and counts the
// open ones.
type fakeBrowsers struct {
	open     atomic.Int64
	failOnce atomic.Bool // "flaky" fails while set
	mu       sync.Mutex
	release  chan struct{} // "block" returns once closed
}

type closing struct {
	*connecttest.Memory
	f    *fakeBrowsers
	once sync.Once
}

func (c *closing) Close() error {
	c.once.Do(func() { c.f.open.Add(-1) })
	return nil
}

func (f *fakeBrowsers) provision(_ context.Context, setup map[string]any) (connect.Conn, error) {
	var m *connecttest.Memory
	m = connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "whoami"}, Fn: func(context.Context, map[string]any) (any, error) {
			return map[string]any{"instance": m.Identity().Instance, "setup": setup}, nil
		}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "element"}, Fn: func(context.Context, map[string]any) (any, error) {
			return map[string]any{"$ref": "e1", "kind": "element"}, nil
		}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "click"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "flaky"}, Fn: func(context.Context, map[string]any) (any, error) {
			if f.failOnce.Load() {
				return nil, &connect.CallError{Op: "flaky", Message: "not yet"}
			}
			return map[string]any{"ok": true}, nil
		}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "block"}, Fn: func(ctx context.Context, _ map[string]any) (any, error) {
			f.mu.Lock()
			ch := f.release
			f.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return map[string]any{"unblocked": true}, nil
		}},
	)
	f.open.Add(1)
	return &closing{Memory: m, f: f}, nil
}

type poolBundle struct {
	execs *harness.Executions
	reg   *registry.Registry
	fake  *fakeBrowsers
	pool  *pools.Pool
}

const poolGrant = `{"connections":{"browsers":{"ops":["*"],"setup":{"url":["http://ok/*"],"viewport":["*x*"]}}}}`

// poolSetup registers pool "browsers" of max slots over fake browsers.
func poolSetup(t *testing.T, st *store.Store, max int, wait time.Duration, opts *pools.Options) poolBundle {
	t.Helper()
	pool, err := pools.New(st, "browsers", max, opts)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBrowsers{release: make(chan struct{})}
	prov, err := pools.NewProvider(pool, pools.ProviderOptions{
		Wait: wait, Provision: f.provision, RefreshEvery: 50 * time.Millisecond,
		Schema: map[string]any{"type": "object", "additionalProperties": false, "properties": map[string]any{
			"url":      map[string]any{"type": "string"},
			"viewport": map[string]any{"type": "string", "pattern": "^[0-9]+x[0-9]+$", "default": "800x600"},
			"profile":  map[string]any{"type": "string", "default": "/srv/profile"},
		}},
		HostOnly: []string{"profile"},
	})
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.NewRegistry(nil)
	if err := reg.Add("browsers", prov); err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	execs := startWorkers(t, st, reg, 4, "test", poolGrant, harness.ExecutionsOptions{})
	return poolBundle{execs: execs, reg: reg, fake: f, pool: pool}
}

func (b poolBundle) run(t *testing.T, doc string) *harness.Execution {
	t.Helper()
	ex, err := b.execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Principal: "tester", Allowlist: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ex, err = b.execs.Wait(context.Background(), ex.ID, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

func (b poolBundle) unblock() {
	b.fake.mu.Lock()
	close(b.fake.release)
	b.fake.mu.Unlock()
}

func eventsOf(t *testing.T, execs *harness.Executions, id, typ string) []harness.Event {
	t.Helper()
	evs, err := execs.Events(context.Background(), id, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []harness.Event
	for _, e := range evs {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestPoolFreshPerPath(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		b := poolSetup(t, st, 2, 5*time.Second, nil)
		ex := b.run(t, `{"version":1,"connections":{"app":{"from":"browsers","fresh":"path","setup":{"url":"http://ok/a"}}},
			"root":{"kind":"parallel","id":"suite","paths":[
				[{"kind":"call","id":"a","connection":"app","op":"whoami"},{"kind":"call","id":"a2","connection":"app","op":"whoami"}],
				[{"kind":"call","id":"b","connection":"app","op":"whoami"}]]}}`)
		if ex.Status != harness.ExecSucceeded {
			t.Fatalf("status %s: %+v", ex.Status, ex.Error)
		}
		inst := func(id string) string {
			for _, s := range ex.Steps {
				if s.ID == id {
					return s.Output.(map[string]any)["instance"].(string)
				}
			}
			t.Fatalf("no step %s", id)
			return ""
		}
		if inst("a") != inst("a2") || inst("a") == inst("b") {
			t.Errorf("instances a=%s a2=%s b=%s: want one connection per path", inst("a"), inst("a2"), inst("b"))
		}
		setup := ex.Steps[0].Output.(map[string]any)["setup"].(map[string]any)
		if setup["url"] != "http://ok/a" || setup["viewport"] != "800x600" || setup["profile"] != "/srv/profile" {
			t.Errorf("setup given to the provider = %v", setup)
		}
		if n := len(eventsOf(t, b.execs, ex.ID, harness.EventLeaseAcquired)); n != 2 {
			t.Errorf("%d lease.acquired events, want 2", n)
		}
		if n := len(eventsOf(t, b.execs, ex.ID, harness.EventLeaseReleased)); n != 2 {
			t.Errorf("%d lease.released events, want 2", n)
		}
		if n := b.fake.open.Load(); n != 0 {
			t.Errorf("%d connections still open after the run", n)
		}
		u, err := b.pool.Status(context.Background())
		if err != nil || u.Leased != 0 {
			t.Errorf("usage after the run = %+v, %v", u, err)
		}
	})
}

func TestPoolDocumentValidation(t *testing.T) {
	t.Parallel()
	b := poolSetup(t, storetest.New(t), 1, time.Second, nil)
	doc := func(entry string) string {
		return `{"version":1,"connections":{"app":` + entry + `},"root":{"kind":"call","id":"a","connection":"app","op":"whoami"}}`
	}
	tests := []struct {
		name, doc, code, path string
	}{
		{"setup outside the allowlist", doc(`{"from":"browsers","setup":{"url":"http://evil/a"}}`), "CONNECTION_NOT_ALLOWED", "/workflow/connections/app/setup/url"},
		{"setup field not granted", doc(`{"from":"browsers","setup":{"viewport":"1x1","url":"http://ok/"}}`), "", ""},
		{"host-only field", doc(`{"from":"browsers","setup":{"profile":"/etc"}}`), "VALIDATION_FAILED", "/workflow/connections/app/setup"},
		{"schema refuses", doc(`{"from":"browsers","setup":{"viewport":"big"}}`), "VALIDATION_FAILED", "/workflow/connections/app/setup"},
		{"unknown setup field", doc(`{"from":"browsers","setup":{"colour":"red"}}`), "VALIDATION_FAILED", "/workflow/connections/app/setup"},
		{"secret in setup", doc(`{"from":"browsers","setup":{"url":{"$secret":"u"}}}`), "VALIDATION_FAILED", "/workflow/connections/app/setup/url"},
		{"expression failing on the input", doc(`{"from":"browsers","setup":{"url":{"$expr":"$input.u"}}}`), "EXPRESSION_INVALID", "/workflow/connections/app/setup/url"},
		{"bad fresh", doc(`{"from":"browsers","fresh":"thread"}`), "VALIDATION_FAILED", "/workflow/connections/app/fresh"},
		{"unknown pool", doc(`{"from":"nothing"}`), "CONNECTION_UNKNOWN", "/workflow/connections/app/from"},
		{"unknown op", `{"version":1,"connections":{"app":{"from":"browsers"}},"root":{"kind":"call","id":"a","connection":"app","op":"nope"}}`, "OPERATION_UNKNOWN", "/workflow/root/op"},
		{"pool by its own name", `{"version":1,"connections":{"browsers":{}},"root":{"kind":"call","id":"a","connection":"browsers","op":"whoami"}}`, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(tt.doc), Allowlist: "test"})
			if tt.code == "" {
				if err != nil {
					t.Fatalf("Submit = %v, want accepted", err)
				}
				return
			}
			var ve *fault.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Submit = %v, want a validation error", err)
			}
			for _, p := range ve.Problems {
				if string(p.Code) == tt.code && p.Path == tt.path {
					return
				}
			}
			t.Fatalf("problems = %+v, want %s at %s", ve.Problems, tt.code, tt.path)
		})
	}
	unblockAll(b)
}

// A pool whose provider is still starting refuses a document as transient
// (CONNECTION_STARTING, which the API answers 503 with Retry-After),
// whether the document takes a handle from it or names it.
func TestPoolStartingIsTransient(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	b := poolSetup(t, st, 1, time.Second, nil)
	pool, err := pools.New(st, "later", 1, nil)
	must(t, err)
	prov, err := pools.NewProvider(pool, pools.ProviderOptions{Wait: time.Second, Provision: b.fake.provision})
	must(t, err)
	must(t, b.reg.Add("later", prov)) // added after Start, so it stays connecting
	call := `"root":{"kind":"call","id":"a","connection":"app","op":"whoami"}}`
	for name, doc := range map[string]string{
		"handle per path":      `{"version":1,"connections":{"app":{"from":"later","fresh":"path"}},` + call,
		"handle per execution": `{"version":1,"connections":{"app":{"from":"later"}},` + call,
		"pool by its own name": `{"version":1,"connections":{"later":{}},"root":{"kind":"call","id":"a","connection":"later","op":"whoami"}}`,
	} {
		_, err := b.execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Allowlist: "test"})
		var ve *fault.ValidationError
		if !errors.As(err, &ve) || ve.Code() != fault.CodeConnectionStarting || !ve.Transient() {
			t.Errorf("%s: Submit = %v, want a transient %s", name, err, fault.CodeConnectionStarting)
		}
	}
	unblockAll(b)
}

func unblockAll(b poolBundle) {
	b.fake.mu.Lock()
	defer b.fake.mu.Unlock()
	select {
	case <-b.fake.release:
	default:
		close(b.fake.release)
	}
}

func TestPoolFullWaitsThenTimesOut(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		b := poolSetup(t, st, 1, 400*time.Millisecond, nil)
		ctx := context.Background()
		holder, err := b.execs.Submit(ctx, harness.Request{Allowlist: "test", Workflow: json.RawMessage(
			`{"version":1,"connections":{"browsers":{}},"root":{"kind":"call","id":"hold","connection":"browsers","op":"block"}}`)})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the first lease", func() bool {
			u, _ := b.pool.Status(ctx)
			return u.Leased == 1
		})
		ex := b.run(t, `{"version":1,"connections":{"browsers":{}},"root":{"kind":"call","id":"w","connection":"browsers","op":"whoami"}}`)
		if ex.Status != harness.ExecFailed || ex.Error.Code != fault.LeaseTimeout || ex.Error.Step != "w" {
			t.Fatalf("got %s %+v, want failed lease_timeout at w", ex.Status, ex.Error)
		}
		waiting := false
		for _, e := range eventsOf(t, b.execs, ex.ID, harness.EventState) {
			if e.Data["status"] == "waiting" && e.Data["waitingFor"] == "lease" && e.Data["pool"] == "browsers" {
				waiting = true
			}
		}
		if !waiting {
			t.Error("no event says the execution waits for a lease")
		}
		// A waiter is served once the holder gives its lease back.
		next, err := b.execs.Submit(ctx, harness.Request{Allowlist: "test", Workflow: json.RawMessage(
			`{"version":1,"connections":{"browsers":{}},"root":{"kind":"call","id":"w","connection":"browsers","op":"whoami"}}`)})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the second execution to wait", func() bool {
			e, _ := b.execs.Get(ctx, next.ID)
			return e.Status == harness.ExecWaiting
		})
		cs := b.reg.List()[0].Status()
		if cs.Pool == nil || cs.Pool.Max != 1 || cs.Pool.Leased != 1 {
			t.Errorf("connection status pool = %+v", cs.Pool)
		}
		b.unblock()
		for _, id := range []string{holder.ID, next.ID} {
			e, err := b.execs.Wait(ctx, id, 10*time.Second)
			if err != nil || e.Status != harness.ExecSucceeded {
				t.Fatalf("%s: %v %+v", id, err, e)
			}
		}
	})
}

func TestPoolFailedRunKeepsLeaseAndResumeTakesItBack(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		b := poolSetup(t, st, 1, time.Second, nil)
		ctx := context.Background()
		b.fake.failOnce.Store(true)
		ex := b.run(t, `{"version":1,"connections":{"browsers":{}},"root":{"kind":"sequence","id":"s","steps":[
			{"kind":"call","id":"who","connection":"browsers","op":"whoami"},
			{"kind":"call","id":"f","connection":"browsers","op":"flaky"},
			{"kind":"call","id":"who2","connection":"browsers","op":"whoami"}]}}`)
		if ex.Status != harness.ExecFailed {
			t.Fatalf("status %s", ex.Status)
		}
		u, _ := b.pool.Status(ctx)
		if u.Leased != 1 || b.fake.open.Load() != 1 {
			t.Fatalf("after failure: usage %+v, open %d; want the lease and its connection kept", u, b.fake.open.Load())
		}
		acquired := eventsOf(t, b.execs, ex.ID, harness.EventLeaseAcquired)
		b.fake.failOnce.Store(false)
		// The runner lets go of its claim just after the finish is seen.
		waitFor(t, "the resume to be accepted", func() bool {
			_, err := b.execs.Resume(ctx, ex.ID, nil)
			return err == nil
		})
		ex, err := b.execs.Wait(ctx, ex.ID, 10*time.Second)
		if err != nil || ex.Status != harness.ExecSucceeded {
			t.Fatalf("resumed: %v %+v", err, ex)
		}
		all := eventsOf(t, b.execs, ex.ID, harness.EventLeaseAcquired)
		if len(all) != 2 || all[1].Data["lease"] != acquired[0].Data["lease"] || all[1].Data["resumed"] != true {
			t.Fatalf("lease events %+v: want the same lease taken back", all)
		}
		if ex.Steps[0].Output.(map[string]any)["instance"] != ex.Steps[2].Output.(map[string]any)["instance"] {
			t.Error("the resumed run got another connection, want the kept one")
		}
		if b.fake.open.Load() != 0 {
			t.Errorf("%d connections open after success", b.fake.open.Load())
		}
	})
}

func TestPoolKeptLeaseReclaimedClosesConnection(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	b := poolSetup(t, st, 1, time.Second, &pools.Options{ReclaimAfter: 600 * time.Millisecond})
	b.fake.failOnce.Store(true)
	ex := b.run(t, `{"version":1,"connections":{"browsers":{}},"root":{"kind":"call","id":"f","connection":"browsers","op":"flaky"}}`)
	if ex.Status != harness.ExecFailed || b.fake.open.Load() != 1 {
		t.Fatalf("status %s, open %d", ex.Status, b.fake.open.Load())
	}
	waitFor(t, "the kept lease to be reclaimed and its connection closed", func() bool { return b.fake.open.Load() == 0 })
	u, err := b.pool.Status(context.Background())
	if err != nil || u.Leased != 0 {
		t.Fatalf("usage %+v %v", u, err)
	}
}

func TestPoolRefsBoundToTheirLease(t *testing.T) {
	t.Parallel()
	b := poolSetup(t, storetest.New(t), 2, time.Second, nil)
	ex := b.run(t, `{"version":1,"connections":{"one":{"from":"browsers"},"two":{"from":"browsers"}},"root":{"kind":"sequence","id":"s","steps":[
		{"kind":"call","id":"el","connection":"one","op":"element"},
		{"kind":"call","id":"ok","connection":"one","op":"click","args":{"target":{"$expr":"$steps.el"}}},
		{"kind":"call","id":"bad","connection":"two","op":"click","args":{"target":{"$expr":"$steps.el"}}}]}}`)
	if ex.Status != harness.ExecFailed || ex.Error.Step != "bad" || ex.Error.Gate != fault.GateRefs {
		t.Fatalf("got %s %+v, want refused at gate 3 on step bad", ex.Status, ex.Error)
	}
	if got := ex.Steps[1].Output.(map[string]any)["target"]; got != "e1" {
		t.Errorf("click through the issuing lease got %v, want the raw ref", got)
	}
	if !strings.Contains(ex.Error.Message, "ref") {
		t.Errorf("message %q", ex.Error.Message)
	}
	unblockAll(b)
}

// An execution that waits for an approval longer than the reclaim window
// keeps its lease (a wait is not a crash) and carries on, after the
// approval, on the same lease and the same connection.
func TestPoolLeaseSurvivesAnApprovalWait(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	b := poolSetup(t, st, 1, time.Second, &pools.Options{ReclaimAfter: 600 * time.Millisecond})
	if err := b.reg.SetPolicy("browsers", registry.Policy{Approve: []string{"click"}}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ex, err := b.execs.Submit(ctx, harness.Request{Principal: "tester", Allowlist: "test", Workflow: json.RawMessage(`{"version":1,
		"connections":{"browsers":{}},"root":{"kind":"sequence","id":"s","steps":[
		{"kind":"call","id":"who","connection":"browsers","op":"whoami"},
		{"kind":"call","id":"c","connection":"browsers","op":"click"},
		{"kind":"call","id":"who2","connection":"browsers","op":"whoami"}]}}`)})
	if err != nil {
		t.Fatal(err)
	}
	var pending []*gates.Approval
	waitFor(t, "the click to wait for approval", func() bool {
		pending, _ = b.execs.Approvals().List(ctx, gates.ApprovalPending, 0)
		return len(pending) == 1
	})
	time.Sleep(1500 * time.Millisecond) // more than twice the window
	if u, _ := b.pool.Status(ctx); u.Leased != 1 || b.fake.open.Load() != 1 {
		t.Fatalf("while waiting: usage %+v, open %d; want the lease and its connection kept", u, b.fake.open.Load())
	}
	if _, err := b.execs.Approvals().Decide(ctx, pending[0].ID, gates.ApprovalApproved, "op", ""); err != nil {
		t.Fatal(err)
	}
	ex, err = b.execs.Wait(ctx, ex.ID, 10*time.Second)
	if err != nil || ex.Status != harness.ExecSucceeded {
		t.Fatalf("after approval: %v %+v", err, ex)
	}
	if ex.Steps[0].Output.(map[string]any)["instance"] != ex.Steps[2].Output.(map[string]any)["instance"] {
		t.Error("the approved run got another connection, want the one it waited with")
	}
	acquired := eventsOf(t, b.execs, ex.ID, harness.EventLeaseAcquired)
	if len(acquired) != 2 || acquired[1].Data["lease"] != acquired[0].Data["lease"] {
		t.Fatalf("lease events %+v: want the same lease taken back", acquired)
	}
}

// A resumed run whose kept lease was reclaimed meanwhile gets a new
// connection: results recorded on the old one describe a world that is
// gone, so (determinism unsafe, the default) the resume is refused, and a
// resume that names the handle in rerun runs those steps live again.
func TestPoolResumeOnANewConnectionFollowsDeterminism(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	b := poolSetup(t, st, 1, time.Second, &pools.Options{ReclaimAfter: 600 * time.Millisecond})
	ctx := context.Background()
	b.fake.failOnce.Store(true)
	ex := b.run(t, `{"version":1,"connections":{"browsers":{}},"root":{"kind":"sequence","id":"s","steps":[
		{"kind":"call","id":"who","connection":"browsers","op":"whoami"},
		{"kind":"call","id":"f","connection":"browsers","op":"flaky"}]}}`)
	if ex.Status != harness.ExecFailed {
		t.Fatalf("status %s", ex.Status)
	}
	first := ex.Steps[0].Output.(map[string]any)["instance"]
	waitFor(t, "the kept lease to be reclaimed", func() bool { return b.fake.open.Load() == 0 })
	b.fake.failOnce.Store(false)

	resume := func(rerun []string) *harness.Execution {
		t.Helper()
		waitFor(t, "the resume to be accepted", func() bool {
			_, err := b.execs.Resume(ctx, ex.ID, rerun)
			return err == nil
		})
		got, err := b.execs.Wait(ctx, ex.ID, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := resume(nil); got.Status != harness.ExecFailed || got.Error == nil || got.Error.Code != "resume_refused" {
		t.Fatalf("resume over a replaced connection: %s %+v, want resume_refused", got.Status, got.Error)
	}
	got := resume([]string{"browsers"})
	if got.Status != harness.ExecSucceeded {
		t.Fatalf("resume with rerun: %s %+v", got.Status, got.Error)
	}
	if again := got.Steps[0].Output.(map[string]any)["instance"]; again == first {
		t.Errorf("step who was replayed from the old connection (%v), want it run live on the new one", first)
	}
}

// A setup value may be an expression over $input (a preview URL per run):
// it is resolved at submit, so the allowlist and the pool's schema judge
// the value the lease will get.
func TestPoolSetupFromInput(t *testing.T) {
	t.Parallel()
	b := poolSetup(t, storetest.New(t), 1, time.Second, nil)
	ctx := context.Background()
	doc := func(expr string) json.RawMessage {
		return json.RawMessage(`{"version":1,"connections":{"browsers":{"setup":{"url":{"$expr":"` + expr + `"}}}},
			"root":{"kind":"call","id":"who","connection":"browsers","op":"whoami"}}`)
	}
	ex, err := b.execs.Submit(ctx, harness.Request{Workflow: doc("$input.preview"), Input: map[string]any{"preview": "http://ok/pr-7"},
		Principal: "tester", Allowlist: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ex, err = b.execs.Wait(ctx, ex.ID, 10*time.Second)
	if err != nil || ex.Status != harness.ExecSucceeded {
		t.Fatalf("%v %+v", err, ex)
	}
	if got := ex.Steps[0].Output.(map[string]any)["setup"].(map[string]any)["url"]; got != "http://ok/pr-7" {
		t.Fatalf("the lease got url %v, want the input's", got)
	}

	refused := []struct {
		name, expr string
		input      any
		path       string
		code       fault.Code
	}{
		{"outside the allowlist", "$input.preview", map[string]any{"preview": "http://evil/"}, "/workflow/connections/browsers/setup/url", gates.CodeConnectionNotAllowed},
		{"against the schema", "$input.preview", map[string]any{"preview": 5}, "/workflow/connections/browsers/setup", fault.CodeValidationFailed},
		{"reads a step", "$steps.who.instance", nil, "/workflow/connections/browsers/setup/url/$expr", fault.CodeExpressionInvalid},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b.execs.Submit(ctx, harness.Request{Workflow: doc(tt.expr), Input: tt.input, Principal: "tester", Allowlist: "test"})
			var ve *fault.ValidationError
			if !errors.As(err, &ve) || ve.Problems[0].Path != tt.path || ve.Problems[0].Code != tt.code {
				t.Fatalf("Submit = %v, want %s at %s", err, tt.code, tt.path)
			}
		})
	}
}
