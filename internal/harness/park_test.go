package harness_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// Parallel paths park and resume independently: a path waiting for a
// person does not cancel its siblings, and the resumed run continues every
// path where it was.

const parkGrant = `{"connections":{"svc":{"ops":["*"],"events":["deploy.*"]}}}`

// parkDoc has path a send (guarded: it needs approval) while path b waits
// for a deploy.done event of the same connection.
const parkDoc = `{"version":1,"connections":{"svc":{"events":["deploy.done"]}},"root":{"kind":"parallel","id":"p","paths":[
	[{"kind":"call","id":"a","connection":"svc","op":"send","args":{"to":"a"}}],
	[{"kind":"wait","id":"b","connection":"svc","event":"deploy.done","timeoutMs":%d}]]}}`

// bothApprovalsDoc has a guarded call in each path.
const bothApprovalsDoc = `{"version":1,"connections":{"svc":{}},"root":{"kind":"parallel","id":"p","paths":[
	[{"kind":"call","id":"a0","connection":"svc","op":"read"},{"kind":"call","id":"a","connection":"svc","op":"send","args":{"to":"a"}}],
	[{"kind":"call","id":"b","connection":"svc","op":"send","args":{"to":"b"}},{"kind":"call","id":"b2","connection":"svc","op":"read"}]]}}`

// parkRegistry has a connection "svc" whose "send" needs approval.
func parkRegistry(t *testing.T) (*registry.Registry, *connecttest.Memory) {
	t.Helper()
	mem := connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "send"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "read"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "slow"}, Fn: func(ctx context.Context, _ map[string]any) (any, error) {
			select {
			case <-time.After(300 * time.Millisecond):
				return map[string]any{"slow": true}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}},
	)
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("svc", mem))
	must(t, reg.SetPolicy("svc", registry.Policy{Approve: []string{"send"}}))
	must(t, reg.Start(context.Background()))
	t.Cleanup(func() { _ = reg.Close() })
	return reg, mem
}

func submitAs(t *testing.T, execs *harness.Executions, allowlist, doc string) string {
	t.Helper()
	ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Principal: "tester", Allowlist: allowlist})
	must(t, err)
	return ex.ID
}

// parked waits until the execution waits with n pending approvals, and
// returns them.
func parked(t *testing.T, execs *harness.Executions, id string, n int) []*gates.Approval {
	t.Helper()
	var mine []*gates.Approval
	waitFor(t, fmt.Sprintf("%s to wait with %d approvals", id, n), func() bool {
		ex, err := execs.Get(context.Background(), id)
		if err != nil || ex.Status != harness.ExecWaiting {
			return false
		}
		mine = pendingOf(t, execs, id)
		return len(mine) == n
	})
	return mine
}

func pendingOf(t *testing.T, execs *harness.Executions, id string) []*gates.Approval {
	t.Helper()
	aps, err := execs.Approvals().List(context.Background(), gates.ApprovalPending, 200)
	must(t, err)
	var mine []*gates.Approval
	for _, ap := range aps {
		if ap.Execution == id {
			mine = append(mine, ap)
		}
	}
	return mine
}

func approve(t *testing.T, execs *harness.Executions, aps ...*gates.Approval) {
	t.Helper()
	for _, ap := range aps {
		_, err := execs.Approvals().Decide(context.Background(), ap.ID, gates.ApprovalApproved, "op", "")
		must(t, err)
	}
}

// approveUntilDone approves every approval the execution asks for until
// it ends, and returns it.
func approveUntilDone(t *testing.T, execs *harness.Executions, id string) *harness.Execution {
	t.Helper()
	var ex *harness.Execution
	waitFor(t, id+" to end", func() bool {
		var err error
		if ex, err = execs.Get(context.Background(), id); err != nil || ex.Status.Terminal() {
			return err == nil
		}
		approve(t, execs, pendingOf(t, execs, id)...)
		return false
	})
	return ex
}

func pushEvent(t *testing.T, execs *harness.Executions, conn, id string) {
	t.Helper()
	must(t, execs.AppendEvent(context.Background(), harness.ConnEvent{Connection: conn, Type: "deploy.done", ID: id, ReceivedAt: time.Now()}))
}

func stepOf(t *testing.T, ex *harness.Execution, id string) harness.StepRecord {
	t.Helper()
	s, ok := findStep(ex, id)
	if !ok {
		t.Fatalf("no step %s in %+v", id, ex.Steps)
	}
	return s
}

func findStep(ex *harness.Execution, id string) (harness.StepRecord, bool) {
	for _, s := range ex.Steps {
		if s.ID == id {
			return s, true
		}
	}
	return harness.StepRecord{}, false
}

// stepDone reports whether the execution's step id is done.
func stepDone(execs *harness.Executions, exec, id string) bool {
	ex, err := execs.Get(context.Background(), exec)
	if err != nil {
		return false
	}
	s, ok := findStep(ex, id)
	return ok && s.Status == harness.StepDone
}

// neverFailed fails t when any step of the execution was ever recorded
// failed (a parked sibling must be interrupted, not failed).
func neverFailed(t *testing.T, execs *harness.Executions, id string) {
	t.Helper()
	for _, e := range eventsOf(t, execs, id, harness.EventStepFinished) {
		if e.Data["status"] == harness.StepFailed {
			t.Errorf("step %v was recorded failed: %v", e.Data["id"], e.Data["error"])
		}
	}
}

func calls(mem *connecttest.Memory, op string) int {
	n := 0
	for _, c := range mem.Calls() {
		if c.Op == op {
			n++
		}
	}
	return n
}

func sends(mem *connecttest.Memory) map[any]int {
	n := map[any]int{}
	for _, c := range mem.Calls() {
		if c.Op == "send" {
			n[c.Args["to"]]++
		}
	}
	return n
}

func TestParallelPathParksWhileSiblingWaitsForAnEvent(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		reg, mem := parkRegistry(t)
		execs := startWorkers(t, st, reg, 2, "park", parkGrant, harness.ExecutionsOptions{})
		ctx := context.Background()
		for _, order := range []string{"approval first", "event first"} {
			t.Run(order, func(t *testing.T) {
				sent := sends(mem)["a"]
				id := submitAs(t, execs, "park", fmt.Sprintf(parkDoc, 30000))
				aps := parked(t, execs, id, 1)
				ex, err := execs.Get(ctx, id)
				must(t, err)
				if b := stepOf(t, ex, "b"); b.Status != harness.StepPending || b.Cursor == "" || b.Deadline == nil {
					t.Fatalf("parked wait = %+v, want pending with its cursor and deadline", b)
				}
				evID := "ev-" + id
				if order == "event first" {
					pushEvent(t, execs, "svc", evID)
					approve(t, execs, aps...)
				} else {
					approve(t, execs, aps...)
					waitFor(t, "the approved call to run", func() bool { return stepDone(execs, id, "a") })
					if ex, _ := execs.Get(ctx, id); ex.Status.Terminal() || stepOf(t, ex, "b").Status != harness.StepPending {
						t.Fatalf("before b's event: %s, b %+v", ex.Status, stepOf(t, ex, "b"))
					}
					pushEvent(t, execs, "svc", evID)
				}
				ex, err = execs.Wait(ctx, id, 15*time.Second)
				must(t, err)
				if ex.Status != harness.ExecSucceeded {
					t.Fatalf("status %s %+v", ex.Status, ex.Error)
				}
				if got := stepOf(t, ex, "b").Output.(map[string]any)["event"].(map[string]any)["id"]; got != evID {
					t.Errorf("b saw event %v, want %s", got, evID)
				}
				if n := sends(mem)["a"] - sent; n != 1 {
					t.Errorf("a's call sent %d times, want 1", n)
				}
				neverFailed(t, execs, id)
			})
		}
	})
}

func TestParallelApprovalsInBothPaths(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		reg, mem := parkRegistry(t)
		execs := startWorkers(t, st, reg, 2, "park", parkGrant, harness.ExecutionsOptions{})
		const runs = 20
		for i := range runs {
			id := submitAs(t, execs, "park", bothApprovalsDoc)
			ex := approveUntilDone(t, execs, id)
			if ex.Status != harness.ExecSucceeded {
				t.Fatalf("run %d: %s %+v", i, ex.Status, ex.Error)
			}
			for _, s := range ex.Steps {
				if s.Status != harness.StepDone {
					t.Fatalf("run %d: step %s is %s", i, s.ID, s.Status)
				}
			}
			neverFailed(t, execs, id)
		}
		if got := sends(mem); got["a"] != runs || got["b"] != runs {
			t.Fatalf("sends %v, want each path's call sent once per run (%d)", got, runs)
		}
	})
}

// An execution parked with one path waiting for a person and another for
// an event is resumed by another process: the wait listens again from its
// recorded cursor (an event pushed while nobody ran the execution is
// seen) until its recorded deadline (not a new one).
func TestParkedParallelResumesInAnotherProcess(t *testing.T) {
	t.Parallel()
	const timeout = 2500 * time.Millisecond
	tests := []struct {
		name  string
		event bool
		want  harness.ExecState
	}{
		{"an event pushed while parked is seen", true, harness.ExecSucceeded},
		{"without one the wait ends at its first deadline", false, harness.ExecFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				t.Parallel()
				ctx := context.Background()
				reg, mem := parkRegistry(t)
				als := allowlistsWith(t, st, "park", parkGrant)
				first, stopFirst := startInstance(t, st, reg, als, "first")
				id := submitAs(t, first, "park", fmt.Sprintf(parkDoc, timeout.Milliseconds()))
				aps := parked(t, first, id, 1)
				ex, err := first.Get(ctx, id)
				must(t, err)
				before := stepOf(t, ex, "b")
				stopFirst()

				if tt.event {
					pushEvent(t, first, "svc", "ev-while-parked")
				}
				// Past the wait's deadline: only a run that kept it sees
				// the difference between the first deadline and a new one.
				time.Sleep(time.Until(*before.Deadline) + 200*time.Millisecond)
				second, _ := startInstance(t, st, reg, als, "second")
				approved := time.Now()
				approve(t, second, aps...)
				ex, err = second.Wait(ctx, id, 15*time.Second)
				must(t, err)
				if ex.Status != tt.want {
					t.Fatalf("status %s %+v, want %s", ex.Status, ex.Error, tt.want)
				}
				if d := time.Since(approved); d > timeout/2 {
					t.Errorf("the resumed run took %s: the wait did not keep its deadline", d)
				}
				after := stepOf(t, ex, "b")
				if after.Cursor != before.Cursor || !after.Deadline.Equal(*before.Deadline) {
					t.Errorf("wait resumed from cursor %s until %s, want %s until %s", after.Cursor, after.Deadline, before.Cursor, before.Deadline)
				}
				if tt.event {
					if got := after.Output.(map[string]any)["event"].(map[string]any)["id"]; got != "ev-while-parked" {
						t.Errorf("b saw %v", got)
					}
					if n := sends(mem)["a"]; n != 1 {
						t.Errorf("a's call sent %d times, want 1", n)
					}
					neverFailed(t, second, id)
					return
				}
				// b's timeout is a real failure: it fails the run (and
				// cancels a, as any failure in an "all" parallel does).
				if after.Status != harness.StepFailed || after.Error == nil || !strings.Contains(after.Error.Message, "within") || ex.Error.Step != "b" {
					t.Errorf("b = %+v, execution error %+v; want b timed out", after, ex.Error)
				}
			})
		})
	}
}

// allowlistsWith returns the allowlists of st with one, name, granting
// grant: what instances started apart (startInstance) share.
func allowlistsWith(t *testing.T, st *store.Store, name, grant string) *gates.Allowlists {
	t.Helper()
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist(name, []byte(grant))
	must(t, err)
	_, err = als.Put(context.Background(), al, "tester")
	must(t, err)
	return als
}

// startInstance runs executions over st and reg as one process would;
// stop ends its workers, as the process ending would.
func startInstance(t *testing.T, st *store.Store, reg *registry.Registry, als *gates.Allowlists, consumer string) (*harness.Executions, func()) {
	t.Helper()
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: als, Consumer: consumer})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 2); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return execs, stop
}

// parkPoolSetup is poolSetup with the pool's "click" guarded by approval
// and a source connection "src" whose deploy.done events waits hear.
func parkPoolSetup(t *testing.T, st *store.Store) poolBundle {
	t.Helper()
	b := parkPoolRegistry(t, st, nil)
	b.execs = startWorkers(t, st, b.reg, 2, "test", parkPoolGrant, harness.ExecutionsOptions{})
	return b
}

const parkPoolGrant = `{"connections":{"browsers":{"ops":["*"]},"src":{"events":["deploy.*"]}}}`

// parkPoolRegistry is parkPoolSetup without workers.
func parkPoolRegistry(t *testing.T, st *store.Store, opts *pools.Options) poolBundle {
	t.Helper()
	pool, err := pools.New(st, "browsers", 4, opts)
	must(t, err)
	f := &fakeBrowsers{release: make(chan struct{})}
	prov, err := pools.NewProvider(pool, pools.ProviderOptions{Wait: 5 * time.Second, Provision: f.provision, RefreshEvery: 50 * time.Millisecond})
	must(t, err)
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("browsers", prov))
	must(t, reg.Add("src", connecttest.NewMemory()))
	must(t, reg.SetPolicy("browsers", registry.Policy{Approve: []string{"click"}}))
	must(t, reg.Start(context.Background()))
	t.Cleanup(func() { _ = reg.Close() })
	return poolBundle{reg: reg, fake: f, pool: pool}
}

// Each path has its own lease (fresh: path): a path that parks keeps its
// lease, and carries on with the same connection once resumed.
const poolParkDoc = `{"version":1,"connections":{"app":{"from":"browsers","fresh":"path"},"src":{"events":["deploy.done"]}},
	"root":{"kind":"parallel","id":"p","paths":[
	[{"kind":"call","id":"a0","connection":"app","op":"whoami"},{"kind":"call","id":"a","connection":"app","op":"click"},{"kind":"call","id":"a2","connection":"app","op":"whoami"}],
	[{"kind":"call","id":"b0","connection":"app","op":"whoami"},%s,{"kind":"call","id":"b2","connection":"app","op":"whoami"}]]}}`

const (
	poolWait  = `{"kind":"wait","id":"b","connection":"src","event":"deploy.done","timeoutMs":30000}`
	poolClick = `{"kind":"call","id":"b","connection":"app","op":"click"}`
)

func TestParallelPathsParkOnPooledLeases(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, step string
		runs       int
		approvals  int
		event      string // "", "before" or "after" the approval
	}{
		{"approval then event", poolWait, 1, 1, "after"},
		{"event then approval", poolWait, 1, 1, "before"},
		{"approvals in both paths", poolClick, 5, 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				t.Parallel()
				b := parkPoolSetup(t, st)
				ctx := context.Background()
				for i := range tt.runs {
					id := submitAs(t, b.execs, "test", fmt.Sprintf(poolParkDoc, tt.step))
					aps := parked(t, b.execs, id, tt.approvals)
					if u, _ := b.pool.Status(ctx); u.Leased != 2 {
						t.Fatalf("run %d parked with %d leases, want both paths' kept", i, u.Leased)
					}
					if tt.event == "before" {
						pushEvent(t, b.execs, "src", "ev-"+id)
					}
					approve(t, b.execs, aps...)
					if tt.event == "after" {
						waitFor(t, "the approved click", func() bool { return stepDone(b.execs, id, "a2") })
						pushEvent(t, b.execs, "src", "ev-"+id)
					}
					ex, err := b.execs.Wait(ctx, id, 15*time.Second)
					must(t, err)
					if ex.Status != harness.ExecSucceeded {
						t.Fatalf("run %d: %s %+v", i, ex.Status, ex.Error)
					}
					inst := func(id string) any { return stepOf(t, ex, id).Output.(map[string]any)["instance"] }
					if inst("a0") != inst("a2") || inst("b0") != inst("b2") || inst("a0") == inst("b0") {
						t.Errorf("run %d: instances a %v/%v b %v/%v; want each path to keep its own", i, inst("a0"), inst("a2"), inst("b0"), inst("b2"))
					}
					neverFailed(t, b.execs, id)
					if u, _ := b.pool.Status(ctx); u.Leased != 0 || b.fake.open.Load() != 0 {
						t.Fatalf("run %d: after success %d leased, %d open", i, u.Leased, b.fake.open.Load())
					}
				}
			})
		})
	}
}

// A parallel run that fails gives back every path's lease at once, the
// lease of a path parked for an approval included: nothing waits for the
// reclaim window.
func TestFailedParallelRunReleasesPathLeases(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		b := parkPoolSetup(t, st)
		ctx := context.Background()
		b.fake.failOnce.Store(true)
		id := submitAs(t, b.execs, "test", `{"version":1,"connections":{"app":{"from":"browsers","fresh":"path"},"src":{"events":["deploy.done"]}},
			"root":{"kind":"parallel","id":"p","paths":[
			[{"kind":"call","id":"a0","connection":"app","op":"whoami"},{"kind":"call","id":"a","connection":"app","op":"click"}],
			[{"kind":"call","id":"b0","connection":"app","op":"whoami"},{"kind":"wait","id":"b","connection":"src","event":"deploy.done","timeoutMs":30000}],
			[{"kind":"call","id":"c0","connection":"app","op":"whoami"},{"kind":"call","id":"c","connection":"app","op":"flaky"}]]}}`)
		ex, err := b.execs.Wait(ctx, id, 15*time.Second)
		must(t, err)
		if ex.Status != harness.ExecFailed || ex.Error.Step != "c" {
			t.Fatalf("status %s %+v, want failed at c", ex.Status, ex.Error)
		}
		u, err := b.pool.Status(ctx)
		must(t, err)
		if u.Leased != 0 || b.fake.open.Load() != 0 {
			t.Fatalf("right after the failure: %d leased (%+v), %d open; want every lease given back", u.Leased, u.Leases, b.fake.open.Load())
		}
	})
}

func TestParkingParallelShapes(t *testing.T) {
	t.Parallel()
	const wait = `{"kind":"wait","id":"%s","connection":"svc","event":"deploy.done","timeoutMs":30000}`
	tests := []struct {
		name, root string
		approvals  int  // approvals the parked run asks for; 0: it does not park
		event      bool // push an event while parked
	}{
		{"any: a path that finishes wins over a parked one", `{"kind":"parallel","id":"p","mode":"any","paths":[
			[{"kind":"call","id":"a","connection":"svc","op":"send","args":{"to":"a"}}],
			[{"kind":"call","id":"b","connection":"svc","op":"read"}]]}`, 0, false},
		{"any: parked paths resume and race again", `{"kind":"parallel","id":"p","mode":"any","paths":[
			[{"kind":"call","id":"a","connection":"svc","op":"send","args":{"to":"a"}}],
			[` + fmt.Sprintf(wait, "b") + `]]}`, 1, true},
		{"nested: a park reaches the waits of enclosing paths", `{"kind":"parallel","id":"outer","paths":[
			[{"kind":"parallel","id":"inner","paths":[
				[{"kind":"call","id":"a","connection":"svc","op":"send","args":{"to":"a"}}],
				[` + fmt.Sprintf(wait, "b1") + `]]}],
			[` + fmt.Sprintf(wait, "b2") + `,{"kind":"call","id":"b3","connection":"svc","op":"read"}]]}`, 1, true},
		{"fan-out", `{"kind":"parallel","id":"p","over":["svc","svc2"],"steps":[{"send":{"to":"a"}}]}`, 2, false},
		{"a call in flight when a sibling parks finishes, once", `{"kind":"parallel","id":"p","paths":[
			[{"kind":"call","id":"a","connection":"svc","op":"send","args":{"to":"a"}}],
			[{"kind":"call","id":"b","connection":"svc","op":"slow"},{"kind":"call","id":"b2","connection":"svc","op":"read"}]]}`, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				t.Parallel()
				reg, mem := parkRegistry(t)
				svc2 := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "send"}})
				must(t, reg.Add("svc2", svc2))
				must(t, reg.SetPolicy("svc2", registry.Policy{Approve: []string{"send"}}))
				must(t, reg.Start(context.Background()))
				execs := startWorkers(t, st, reg, 2, "park", `{"connections":{"svc":{"ops":["*"],"events":["deploy.*"]},"svc2":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
				id := submitAs(t, execs, "park", `{"version":1,"connections":{"svc":{"events":["deploy.done"]},"svc2":{}},"root":`+tt.root+`}`)
				if tt.approvals > 0 {
					aps := parked(t, execs, id, tt.approvals)
					if tt.event {
						pushEvent(t, execs, "svc", "ev-"+id)
					}
					approve(t, execs, aps...)
				}
				ex, err := execs.Wait(context.Background(), id, 15*time.Second)
				must(t, err)
				if ex.Status != harness.ExecSucceeded {
					t.Fatalf("status %s %+v", ex.Status, ex.Error)
				}
				// In an "any" race the loser is recorded cancelled by the
				// winner, whichever that is; elsewhere nothing may fail.
				if tt.approvals > 0 && !strings.HasPrefix(tt.name, "any:") {
					neverFailed(t, execs, id)
				}
				for _, c := range mem.Calls() {
					if c.Op == "slow" && c.IdempotencyKey != id+":b" {
						t.Errorf("slow call with key %q", c.IdempotencyKey)
					}
				}
				if n := calls(mem, "slow"); n > 1 {
					t.Errorf("the call in flight was sent %d times, want once", n)
				}
			})
		})
	}
}

// The same across a process restart, on pooled leases, with a wait in one
// path or an approval in both: the second process takes each path's lease
// back (the first renewed them while parked) and every path carries on
// with its own connection.
func TestParkedPooledParallelResumesInAnotherProcess(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, step string
		approvals  int
		event      bool // push b's event while parked
	}{
		{"approval in one path, a wait in the other", poolWait, 1, true},
		{"approvals in both paths", poolClick, 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				t.Parallel()
				ctx := context.Background()
				b := parkPoolRegistry(t, st, nil)
				als := allowlistsWith(t, st, "test", parkPoolGrant)
				first, stopFirst := startInstance(t, st, b.reg, als, "first")
				id := submitAs(t, first, "test", fmt.Sprintf(poolParkDoc, tt.step))
				aps := parked(t, first, id, tt.approvals)
				stopFirst()
				if tt.event {
					pushEvent(t, first, "src", "ev-"+id)
				}

				second, _ := startInstance(t, st, b.reg, als, "second")
				approve(t, second, aps...)
				ex, err := second.Wait(ctx, id, 15*time.Second)
				must(t, err)
				if ex.Status != harness.ExecSucceeded {
					t.Fatalf("status %s %+v", ex.Status, ex.Error)
				}
				inst := func(id string) any { return stepOf(t, ex, id).Output.(map[string]any)["instance"] }
				if inst("a0") != inst("a2") || inst("b0") != inst("b2") || inst("a0") == inst("b0") {
					t.Errorf("instances a %v/%v b %v/%v; want each path to keep its own", inst("a0"), inst("a2"), inst("b0"), inst("b2"))
				}
				acquired := eventsOf(t, second, id, harness.EventLeaseAcquired)
				taken := 0
				for _, e := range acquired {
					if e.Data["resumed"] == true {
						taken++
					}
				}
				if len(acquired) != 4 || taken != 2 {
					t.Errorf("lease events %+v: want both paths' leases taken back", acquired)
				}
				neverFailed(t, second, id)
				if u, _ := b.pool.Status(ctx); u.Leased != 0 || b.fake.open.Load() != 0 {
					t.Fatalf("after success %d leased, %d open", u.Leased, b.fake.open.Load())
				}
			})
		})
	}
}

// Approvals in both paths of a plain connection, across a process restart
// while parked: each path continues where it was (a0, done before the
// park, is not called again) and each approved call is sent once.
func TestParkedApprovalsInBothPathsResumeInAnotherProcess(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		ctx := context.Background()
		reg, mem := parkRegistry(t)
		als := allowlistsWith(t, st, "park", parkGrant)
		first, stopFirst := startInstance(t, st, reg, als, "first")
		id := submitAs(t, first, "park", bothApprovalsDoc)
		aps := parked(t, first, id, 2)
		stopFirst()

		second, _ := startInstance(t, st, reg, als, "second")
		approve(t, second, aps...)
		ex, err := second.Wait(ctx, id, 15*time.Second)
		must(t, err)
		if ex.Status != harness.ExecSucceeded {
			t.Fatalf("status %s %+v", ex.Status, ex.Error)
		}
		if got := sends(mem); got["a"] != 1 || got["b"] != 1 {
			t.Errorf("sends %v, want each path's call sent once", got)
		}
		if n := calls(mem, "read"); n != 2 {
			t.Errorf("read called %d times, want twice (a0 before the park, b2 after)", n)
		}
		neverFailed(t, second, id)
	})
}

// A decision recorded by a process that died before it enqueued the
// execution leaves the run parked. Two things bring it back: the
// approver's retry of the same decision (its answer was lost), and, when
// nobody retries, the repair sweep once the grace period has passed. Either
// way the approved call is sent once.
func TestDecisionNotEnqueuedIsRecovered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		recover func(t *testing.T, execs *harness.Executions, ap *gates.Approval)
	}{
		{"the approver retries", func(t *testing.T, execs *harness.Executions, ap *gates.Approval) { approve(t, execs, ap) }},
		{"the repair sweep", func(t *testing.T, execs *harness.Executions, _ *gates.Approval) {
			rep, err := execs.Repair(context.Background())
			if err != nil || rep.Resumed != 1 {
				t.Fatalf("sweep = %+v, %v; want the parked run resumed", rep, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				t.Parallel()
				ctx := context.Background()
				reg, mem := parkRegistry(t)
				execs := startWorkers(t, st, reg, 2, "park", parkGrant, harness.ExecutionsOptions{})
				id := submitAs(t, execs, "park", `{"version":1,"connections":{"svc":{}},"root":{"kind":"call","id":"a","connection":"svc","op":"send","args":{"to":"a"}}}`)
				ap := parked(t, execs, id, 1)[0]
				if rep, err := execs.Repair(ctx); err != nil || rep.Resumed != 0 {
					t.Fatalf("sweep = %+v, %v: a pending approval's run was resumed", rep, err)
				}
				// What the decision script writes, a minute ago, and nothing after it.
				must(t, st.Client.HSet(ctx, st.Key("approval", "{"+ap.ID+"}"), "state", string(gates.ApprovalApproved),
					"decidedBy", "op", "decidedAt", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano), "note", "").Err())
				tc.recover(t, execs, ap)
				ex, err := execs.Wait(ctx, id, 10*time.Second)
				must(t, err)
				if ex.Status != harness.ExecSucceeded {
					t.Fatalf("after recovery: %s %+v", ex.Status, ex.Error)
				}
				if n := sends(mem)["a"]; n != 1 {
					t.Errorf("the approved call was sent %d times, want once", n)
				}
				if rep, err := execs.Repair(ctx); err != nil || rep.Resumed != 0 {
					t.Errorf("sweep after the run = %+v, %v; want nothing to resume", rep, err)
				}
			})
		})
	}
}

// An execution cancelled while parked is not run again: the leases its
// paths kept go back when the cancel is asked, not at the next renewal
// (every 15 s with the default window) nor after the reclaim window.
func TestCancelledParkedRunGivesBackItsLeases(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		b := parkPoolRegistry(t, st, nil)
		b.execs = startWorkers(t, st, b.reg, 2, "test", parkPoolGrant, harness.ExecutionsOptions{})
		ctx := context.Background()
		id := submitAs(t, b.execs, "test", fmt.Sprintf(poolParkDoc, poolClick))
		parked(t, b.execs, id, 2)
		asked := time.Now()
		_, err := b.execs.Cancel(ctx, id)
		must(t, err)
		// Cancel answers within a few seconds; on a loaded machine the
		// parked run may still be letting go of its claim then, and the
		// cancellation lands when it has.
		waitFor(t, "the execution to be cancelled", func() bool {
			ex, err := b.execs.Get(ctx, id)
			return err == nil && ex.Status == harness.ExecCancelled
		})
		if d := time.Since(asked); d > 5*time.Second {
			t.Logf("cancelled %s after Cancel was asked", d)
		}
		waitFor(t, "the leases to go back", func() bool {
			u, _ := b.pool.Status(ctx)
			return u.Leased == 0 && b.fake.open.Load() == 0
		})
		if d := time.Since(asked); d > 10*time.Second {
			t.Fatalf("the leases went back %s after the cancel was asked: at a renewal, not at once", d)
		}
	})
}
