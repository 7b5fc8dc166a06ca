package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

type bundle struct {
	execs *harness.Executions
	mem   *connecttest.Memory
	reg   *registry.Registry
}

// submit sends doc under the "test" allowlist, which grants every
// operation of mem.
func (b bundle) submit(ctx context.Context, doc string, input any) (*harness.Execution, error) {
	return b.execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Input: input, Principal: "tester", Allowlist: "test"})
}

// setup runs workers over a registry with one memory connection "mem".
func setup(t *testing.T, st *store.Store) bundle {
	t.Helper()
	mem := connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "add"}, Fn: func(_ context.Context, a map[string]any) (any, error) {
			return map[string]any{"sum": a["a"].(float64) + a["b"].(float64)}, nil
		}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "fail"}, Fn: func(context.Context, map[string]any) (any, error) {
			return nil, &connect.CallError{Op: "fail", Message: "always fails"}
		}},
	)
	reg := registry.NewRegistry(nil)
	if err := reg.Add("mem", mem); err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	execs := startWorkers(t, st, reg, 2, "test", `{"connections":{"mem":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
	return bundle{execs: execs, mem: mem, reg: reg}
}

const threeCalls = `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"main","steps":[
	{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":{"$expr":"$input.x"},"b":2}},
	{"kind":"call","id":"b","connection":"mem","op":"add","args":{"a":{"$expr":"$steps.a.sum"},"b":10}},
	{"kind":"call","id":"c","connection":"mem","op":"echo","args":{"total":{"$expr":"$steps.b.sum"},"label":{"$literal":{"$expr":"as is"}}}}]}}`

func TestExecutionRunsThreeCalls(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		b := setup(t, st)
		ctx := context.Background()
		ex, err := b.submit(ctx, threeCalls, map[string]any{"x": 1.0})
		if err != nil {
			t.Fatal(err)
		}
		if ex.Status != harness.ExecQueued {
			t.Fatalf("status after submit = %s", ex.Status)
		}
		ex, err = b.execs.Wait(ctx, ex.ID, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ex.Status != harness.ExecSucceeded {
			t.Fatalf("status = %s, error = %+v", ex.Status, ex.Error)
		}
		out := ex.Output.(map[string]any)
		if out["total"] != 13.0 || out["label"].(map[string]any)["$expr"] != "as is" {
			t.Fatalf("output = %v", ex.Output)
		}
		if len(ex.Steps) != 3 || ex.Steps[1].Output.(map[string]any)["sum"] != 13.0 || ex.StartedAt == nil || ex.FinishedAt == nil {
			t.Fatalf("steps = %+v", ex.Steps)
		}
		calls := b.mem.Calls()
		if len(calls) != 3 || calls[0].IdempotencyKey != ex.ID+":a" {
			t.Fatalf("calls = %+v", calls)
		}
	})
}

func TestExecutionFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, doc, code, step string
	}{
		{"remote error", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"f","connection":"mem","op":"fail"}}`, "step_failed", "f"},
		{"expression error", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"e","connection":"mem","op":"echo","args":{"v":{"$expr":"$input.a.b.c"}}}}`, "step_failed", "e"},
	}
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		b := setup(t, st)
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ex, err := b.submit(context.Background(), tt.doc, nil)
				if err != nil {
					t.Fatal(err)
				}
				ex, err = b.execs.Wait(context.Background(), ex.ID, 10*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if ex.Status != harness.ExecFailed || ex.Error == nil || ex.Error.Code != tt.code || ex.Error.Step != tt.step {
					t.Fatalf("got %s %+v, want failed %s at %s", ex.Status, ex.Error, tt.code, tt.step)
				}
				if ex.Steps[0].Status != "failed" || ex.Steps[0].Error == nil {
					t.Fatalf("step = %+v", ex.Steps[0])
				}
			})
		}
	})
}

func TestSubmitRefusesInvalidDocument(t *testing.T) {
	t.Parallel()
	b := setup(t, storetest.New(t))
	_, err := b.submit(context.Background(), `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"nope"}}`, nil)
	var ve *fault.ValidationError
	if !errors.As(err, &ve) || ve.Code() != fault.CodeOperationUnknown {
		t.Fatalf("Submit = %v", err)
	}
	if _, err := b.execs.Get(context.Background(), "ex_missing"); !errors.Is(err, fault.ErrNotFound) {
		t.Fatalf("Get missing = %v", err)
	}
}

func TestListPagesNewestFirstAndFilters(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		b := setup(t, st)
		ctx := context.Background()
		var ids []string
		for i := range 5 {
			doc := threeCalls
			if i%2 == 1 {
				doc = `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"f","connection":"mem","op":"fail"}}`
			}
			ex, err := b.submit(ctx, doc, map[string]any{"x": 1.0})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.execs.Wait(ctx, ex.ID, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, ex.ID)
			time.Sleep(2 * time.Millisecond) // distinct creation times
		}
		var got []string
		cursor := ""
		for {
			page, err := b.execs.List(ctx, harness.ListOptions{Limit: 2, Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			for _, ex := range page.Items {
				got = append(got, ex.ID)
			}
			if cursor = page.Next; cursor == "" {
				break
			}
		}
		want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
		if len(got) != 5 {
			t.Fatalf("listed %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("listed %v, want %v", got, want)
			}
		}
		page, err := b.execs.List(ctx, harness.ListOptions{Status: harness.ExecFailed})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) != 2 || page.Items[0].ID != ids[3] || page.Next != "" {
			t.Fatalf("failed filter = %d items, next %q", len(page.Items), page.Next)
		}
		if _, err := b.execs.List(ctx, harness.ListOptions{Cursor: "!!"}); !errors.Is(err, harness.ErrBadCursor) {
			t.Fatalf("bad cursor = %v", err)
		}
	})
}

// startWorkers returns executions over reg on st, with the allowlist name
// (body as PUT /v1/allowlists takes it) and n workers running until the
// test ends.
func startWorkers(t *testing.T, st *store.Store, reg *registry.Registry, n int, name, body string, opts harness.ExecutionsOptions) *harness.Executions {
	t.Helper()
	opts.Allowlists = gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist(name, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := opts.Allowlists.Put(context.Background(), al, "tester"); err != nil {
		t.Fatal(err)
	}
	execs := harness.NewExecutions(st, reg, &opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, n); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return execs
}
