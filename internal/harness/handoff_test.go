package harness_test

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// readsOf counts the commands that read an execution's head or ledger
// sent with a context marked by mark (so the workers' own reads and the
// repair sweep's are not counted).
type readsOf struct {
	mu    sync.Mutex
	id    string
	names []string
}

type readMark struct{}

func mark(ctx context.Context) context.Context { return context.WithValue(ctx, readMark{}, true) }

func (r *readsOf) note(ctx context.Context, cmds ...redis.Cmder) {
	if ctx.Value(readMark{}) == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cmds {
		name := strings.ToLower(c.Name())
		if (name == "get" || name == "hgetall") && len(c.Args()) > 1 && strings.Contains(c.Args()[1].(string), r.id) {
			r.names = append(r.names, name)
		}
	}
}

func (r *readsOf) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.names...)
}

func (r *readsOf) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *readsOf) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.note(ctx, cmd); return next(ctx, cmd) }
}
func (r *readsOf) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.note(ctx, cmds...); return next(ctx, cmds) }
}

// TestWaitTakesTheRecordOfARunHere: a run that finishes in the waiting
// process hands its record over, so Wait does not read back what the run
// wrote — its first look at the head is its only read, and after a Submit
// with Await, which listened before writing, it reads nothing — and what
// it answers is what a read answers, Go types included (the run holds an
// int64 where a read gives a float64).
func TestWaitTakesTheRecordOfARunHere(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "count"},
			Fn: func(context.Context, map[string]any) (any, error) {
				time.Sleep(20 * time.Millisecond) // Wait is listening before the run ends
				return map[string]any{"n": int64(7), "list": []int{1, 2}}, nil
			}})
		reg := registry.NewRegistry(nil)
		must(t, reg.Add("x", mem))
		must(t, reg.Start(context.Background()))
		execs := startWorkers(t, st, reg, 1, "all", `{"connections":{"x":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		doc := `{"version":1,"connections":{"x":{}},"root":{"kind":"sequence","id":"s","steps":[
			{"kind":"call","id":"a","connection":"x","op":"count","args":{}},
			{"kind":"call","id":"b","connection":"x","op":"count","args":{"m":{"$expr":"$steps.a.n + 1"}}}]}}`
		for _, tc := range []struct {
			await bool
			reads []string
		}{{false, []string{"get"}}, {true, nil}} {
			ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Allowlist: "all", Await: tc.await})
			must(t, err)
			reads := &readsOf{id: ex.ID}
			st.Client.AddHook(reads)
			got, err := execs.Wait(mark(context.Background()), ex.ID, 10*time.Second)
			must(t, err)
			if seen := reads.seen(); !slices.Equal(seen, tc.reads) {
				t.Errorf("await %v: Wait read %q of the execution, want %q", tc.await, seen, tc.reads)
			}
			if got.Status != harness.ExecSucceeded {
				t.Fatalf("status %s %+v", got.Status, got.Error)
			}
			read, err := execs.Get(context.Background(), ex.ID)
			must(t, err)
			if !reflect.DeepEqual(got.Output, read.Output) || !reflect.DeepEqual(got.Steps, read.Steps) {
				t.Errorf("Wait answered\n%#v\n%#v\na read answers\n%#v\n%#v", got.Output, got.Steps, read.Output, read.Steps)
			}
			a, _ := json.Marshal(got)
			b, _ := json.Marshal(read)
			if string(a) != string(b) {
				t.Errorf("Wait answered %s\na read answers %s", a, b)
			}
		}
	})
}

// TestAwaitOfAnExecutionWrittenBefore: a Submit with Await of an id
// written before (an idempotent retry) may find it ended, so its Wait
// looks first and answers at once.
func TestAwaitOfAnExecutionWrittenBefore(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		reg := registry.NewRegistry(nil)
		must(t, reg.Add("x", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})))
		must(t, reg.Start(context.Background()))
		execs := startWorkers(t, st, reg, 1, "all", `{"connections":{"x":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		req := harness.Request{Workflow: json.RawMessage(`{"version":1,"connections":{"x":{}},"root":{"kind":"call","id":"c","connection":"x","op":"echo","args":{}}}`),
			Allowlist: "all", ID: "ex_written_before", Await: true}
		for range 2 {
			ex, err := execs.Submit(context.Background(), req)
			must(t, err)
			start := time.Now()
			ex, err = execs.Wait(context.Background(), ex.ID, 5*time.Second)
			must(t, err)
			if ex.Status != harness.ExecSucceeded || time.Since(start) > 3*time.Second {
				t.Fatalf("Wait answered %s after %s, want succeeded at once", ex.Status, time.Since(start))
			}
		}
	})
}

// TestWaitAcrossAParkedRun: a run that ends without finishing (it waits
// for an approval) hands nothing over; Wait reads, keeps waiting, and
// takes the record of the run that finishes after the approval.
func TestWaitAcrossAParkedRun(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		execs, _ := guardedSetup(t, st, registry.Policy{})
		doc := `{"version":1,"connections":{"vault":{"profile":"vault@^1"}},"root":{"kind":"call","id":"v","connection":"vault","op":"vault.erase","args":{"key":"a"}}}`
		id := submitAs(t, execs, "test", doc)
		type answer struct {
			ex  *harness.Execution
			err error
		}
		done := make(chan answer, 1)
		go func() {
			ex, err := execs.Wait(context.Background(), id, 20*time.Second)
			done <- answer{ex, err}
		}()
		approve(t, execs, parked(t, execs, id, 1)...)
		got := <-done
		must(t, got.err)
		if got.ex.Status != harness.ExecSucceeded {
			t.Fatalf("Wait answered %s %+v, want succeeded", got.ex.Status, got.ex.Error)
		}
	})
}
