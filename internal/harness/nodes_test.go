package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/refs"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// setupNodes runs workers over two memory connections, "a" and "b", each
// with "whoami" (answers its name), "slow" (answers after 200ms), "count"
// (answers how often it was called) and "fail".
func setupNodes(t *testing.T) *harness.Executions {
	t.Helper()
	reg := registry.NewRegistry(nil)
	for _, name := range []string{"a", "b"} {
		var n atomic.Int64
		mem := connecttest.NewMemory(
			connecttest.MemoryOp{Operation: connect.Operation{Name: "whoami"}, Fn: func(context.Context, map[string]any) (any, error) {
				return map[string]any{"name": name}, nil
			}},
			connecttest.MemoryOp{Operation: connect.Operation{Name: "slow"}, Fn: func(ctx context.Context, _ map[string]any) (any, error) {
				select {
				case <-time.After(200 * time.Millisecond):
					return "slow " + name, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}},
			connecttest.MemoryOp{Operation: connect.Operation{Name: "count"}, Fn: func(context.Context, map[string]any) (any, error) {
				return map[string]any{"n": n.Add(1), "tags": []any{"x", name}}, nil
			}},
			connecttest.MemoryOp{Operation: connect.Operation{Name: "fail"}, Fn: func(context.Context, map[string]any) (any, error) {
				return nil, &connect.CallError{Op: "fail", Message: "no"}
			}},
			connecttest.MemoryOp{Operation: connect.Operation{Name: "mkref"}, Fn: func(context.Context, map[string]any) (any, error) {
				return map[string]any{"button": map[string]any{"$ref": "el-" + name, "kind": "element", "volatile": true}}, nil
			}},
			connecttest.MemoryOp{Operation: connect.Operation{Name: "use"}},
		)
		must(t, reg.Add(name, mem))
	}
	must(t, reg.Start(context.Background()))
	st := storetest.New(t)
	execs := startWorkers(t, st, reg, 2, "all", `{"connections":{"a":{"ops":["*"]},"b":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
	return execs
}

func runDoc(t *testing.T, execs *harness.Executions, doc string) *harness.Execution {
	t.Helper()
	ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Allowlist: "all"})
	must(t, err)
	ex, err = execs.Wait(context.Background(), ex.ID, 15*time.Second)
	must(t, err)
	return ex
}

func TestNodes(t *testing.T) {
	t.Parallel()
	execs := setupNodes(t)
	both := `"connections":{"a":{},"b":{}}`
	tests := []struct {
		name   string
		doc    string
		status harness.ExecState
		check  func(t *testing.T, ex *harness.Execution)
	}{
		{"fan-out over connections with merge", `{"version":1,` + both + `,"root":{"kind":"parallel","id":"p","over":["a","b"],
			"steps":[{"kind":"call","id":"w","connection":{"$expr":"$item"},"op":"whoami"}],"merge":"map($results, .name)"}}`,
			harness.ExecSucceeded, func(t *testing.T, ex *harness.Execution) {
				if got, _ := json.Marshal(ex.Output); string(got) != `["a","b"]` {
					t.Fatalf("output = %s", got)
				}
				keys := map[string]bool{}
				for _, s := range ex.Steps {
					keys[s.Key] = true
				}
				if !keys["w@a"] || !keys["w@b"] {
					t.Fatalf("ledger keys = %v", keys)
				}
			}},
		{"fan-out shorthand on the item", `{"version":1,` + both + `,"root":{"kind":"parallel","id":"p","over":["a","b"],"steps":[{"whoami":{}}]}}`,
			harness.ExecSucceeded, func(t *testing.T, ex *harness.Execution) {
				if got, _ := json.Marshal(ex.Output); string(got) != `[{"name":"a"},{"name":"b"}]` {
					t.Fatalf("output = %s", got)
				}
			}},
		{"paths all, later step reads a path", `{"version":1,` + both + `,"root":{"kind":"sequence","id":"m","steps":[
			{"kind":"parallel","id":"p","paths":[{"kind":"call","id":"x","connection":"a","op":"whoami"},[{"kind":"call","id":"y","connection":"b","op":"whoami"}]]},
			{"kind":"call","id":"z","connection":"a","op":"whoami","args":{"saw":{"$expr":"$steps.y.name"}}}]}}`,
			harness.ExecSucceeded, nil},
		{"paths all fails when one fails", `{"version":1,` + both + `,"root":{"kind":"parallel","id":"p","paths":[
			{"kind":"call","id":"x","connection":"a","op":"slow"},{"kind":"call","id":"y","connection":"b","op":"fail"}]}}`,
			harness.ExecFailed, func(t *testing.T, ex *harness.Execution) {
				if ex.Error.Step != "y" || ex.Error.Code != "step_failed" {
					t.Fatalf("error = %+v", ex.Error)
				}
			}},
		{"paths any takes the first success", `{"version":1,` + both + `,"root":{"kind":"parallel","id":"p","mode":"any","paths":[
			{"kind":"call","id":"x","connection":"a","op":"slow"},{"kind":"call","id":"y","connection":"b","op":"whoami"}]}}`,
			harness.ExecSucceeded, func(t *testing.T, ex *harness.Execution) {
				if got, _ := json.Marshal(ex.Output); string(got) != `{"name":"b"}` {
					t.Fatalf("output = %s", got)
				}
			}},
		{"verify a read until it holds", `{"version":1,"connections":{"a":{}},"root":{"kind":"verify","id":"v","read":{"connection":"a","op":"count"},
			"claims":[{"expr":"$subject.n >= 3"},{"contains":"a","at":"tags"}],"intervalMs":10,"timeoutMs":5000}}`,
			harness.ExecSucceeded, func(t *testing.T, ex *harness.Execution) {
				if out := ex.Output.(map[string]any); out["n"].(float64) < 3 {
					t.Fatalf("output = %v", out)
				}
			}},
		{"verify names the claim that did not hold", `{"version":1,"connections":{"a":{}},"root":{"kind":"sequence","id":"m","steps":[
			{"kind":"call","id":"w","connection":"a","op":"whoami"},
			{"kind":"verify","id":"v","of":"w","claims":[{"equals":"a","at":"name"},{"equals":"zed","at":"name"}],"intervalMs":10,"timeoutMs":50}]}}`,
			harness.ExecFailed, func(t *testing.T, ex *harness.Execution) {
				if ex.Error.Step != "v" || !strings.Contains(ex.Error.Message, "claim 1") || !strings.Contains(ex.Error.Message, `"zed"`) {
					t.Fatalf("error = %+v", ex.Error)
				}
			}},
		{"shorthand on the only connection", `{"version":1,"connections":{"a":{}},"root":{"kind":"sequence","id":"m","steps":[{"whoami":{}}]}}`,
			harness.ExecSucceeded, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ex := runDoc(t, execs, tt.doc)
			if ex.Status != tt.status {
				t.Fatalf("status = %s, error = %+v", ex.Status, ex.Error)
			}
			if tt.check != nil {
				tt.check(t, ex)
			}
		})
	}
}

func TestNodeValidation(t *testing.T) {
	t.Parallel()
	execs := setupNodes(t)
	tests := []struct{ name, doc, path string }{
		{"over an undeclared connection", `{"version":1,"connections":{"a":{}},"root":{"kind":"parallel","id":"p","over":["a","b"],"steps":[{"whoami":{}}]}}`, "/workflow/root/over/1"},
		{"$item outside a fan-out", `{"version":1,"connections":{"a":{}},"root":{"kind":"call","id":"c","connection":{"$expr":"$item"},"op":"whoami"}}`, "/workflow/root/connection"},
		{"fan-out op missing on one item", `{"version":1,"connections":{"a":{},"b":{}},"root":{"kind":"parallel","id":"p","over":["a","b"],"steps":[{"nope":{}}]}}`, "/workflow/root/steps/0/op"},
		{"paths and over", `{"version":1,"connections":{"a":{}},"root":{"kind":"parallel","id":"p","over":["a"],"paths":[],"steps":[{"whoami":{}}]}}`, "/workflow/root"},
		{"bad mode", `{"version":1,"connections":{"a":{}},"root":{"kind":"parallel","id":"p","mode":"some","paths":[{"whoami":{}}]}}`, "/workflow/root/mode"},
		{"path reads a sibling path", `{"version":1,"connections":{"a":{}},"root":{"kind":"parallel","id":"p","paths":[{"kind":"call","id":"x","connection":"a","op":"whoami"},{"kind":"call","id":"y","connection":"a","op":"whoami","args":{"v":{"$expr":"$steps.x"}}}]}}`, "/workflow/root/paths/1/args/v/$expr"},
		{"shorthand with two connections", `{"version":1,"connections":{"a":{},"b":{}},"root":{"kind":"sequence","id":"m","steps":[{"whoami":{}}]}}`, "/workflow/root/steps/0"},
		{"verify without subject", `{"version":1,"connections":{"a":{}},"root":{"kind":"verify","id":"v","claims":[{"expr":"true"}]}}`, "/workflow/root"},
		{"verify of a later step", `{"version":1,"connections":{"a":{}},"root":{"kind":"verify","id":"v","of":"w","claims":[{"expr":"true"}]}}`, "/workflow/root/of"},
		{"claim with two tests", `{"version":1,"connections":{"a":{}},"root":{"kind":"verify","id":"v","read":{"connection":"a","op":"whoami"},"claims":[{"expr":"true","equals":1}]}}`, "/workflow/root/claims/0"},
		{"verify timeout too long", `{"version":1,"connections":{"a":{}},"root":{"kind":"verify","id":"v","read":{"connection":"a","op":"whoami"},"claims":[{"expr":"true"}],"timeoutMs":999999999}}`, "/workflow/root/timeoutMs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(tt.doc), Allowlist: "all"})
			var ve *fault.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Submit = %v", err)
			}
			for _, p := range ve.Problems {
				if p.Path == tt.path {
					return
				}
			}
			t.Fatalf("problems %+v name no %s", ve.Problems, tt.path)
		})
	}
}

func TestSealedRefs(t *testing.T) {
	t.Parallel()
	execs := setupNodes(t)
	both := `"connections":{"a":{},"b":{}}`
	ex := runDoc(t, execs, `{"version":1,`+both+`,"root":{"kind":"sequence","id":"m","steps":[
		{"kind":"call","id":"r","connection":"a","op":"mkref"},
		{"kind":"call","id":"u","connection":"a","op":"use","args":{"target":{"$expr":"$steps.r.button"}}}]}}`)
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("status = %s %+v", ex.Status, ex.Error)
	}
	sealed := ex.Steps[0].Output.(map[string]any)["button"].(map[string]any)
	token, _ := sealed["$ref"].(string)
	if !refs.IsSealedRef(token) || strings.Contains(token, "el-a") {
		t.Fatalf("ref not sealed: %v", sealed)
	}
	if got := ex.Output.(map[string]any)["target"]; got != "el-a" {
		t.Fatalf("the server saw %v, want the raw ref el-a", got)
	}

	refused := []struct{ name, doc string }{
		{"another thread", `{"version":1,"connections":{"a":{}},"root":{"kind":"call","id":"u","connection":"a","op":"use","args":{"target":{"$expr":"$input.ref"}}}}`},
		{"another connection", `{"version":1,` + both + `,"root":{"kind":"sequence","id":"m","steps":[
			{"kind":"call","id":"r","connection":"a","op":"mkref"},
			{"kind":"call","id":"u","connection":"b","op":"use","args":{"target":{"$expr":"$steps.r.button"}}}]}}`},
		{"forged", `{"version":1,"connections":{"a":{}},"root":{"kind":"call","id":"u","connection":"a","op":"use","args":{"target":{"$ref":"el-a","kind":"element"}}}}`},
		{"tampered", `{"version":1,"connections":{"a":{}},"root":{"kind":"call","id":"u","connection":"a","op":"use","args":{"target":{"$ref":"` + token[:len(token)-4] + `AAAA","kind":"element"}}}}`},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(tt.doc), Input: map[string]any{"ref": sealed}, Allowlist: "all"})
			must(t, err)
			ex, err = execs.Wait(context.Background(), ex.ID, 10*time.Second)
			must(t, err)
			if ex.Status != harness.ExecFailed || ex.Error.Code != "steering_denied" || ex.Error.Gate != 3 {
				t.Fatalf("got %s %+v, want steering_denied at gate 3", ex.Status, ex.Error)
			}
		})
	}
}

func TestRefIDInExpressions(t *testing.T) {
	t.Parallel()
	execs := setupNodes(t)
	ex := runDoc(t, execs, `{"version":1,"connections":{"a":{}},"root":{"kind":"sequence","id":"m","steps":[
		{"kind":"call","id":"r","connection":"a","op":"mkref"},
		{"kind":"call","id":"u","connection":"a","op":"use","args":{"same":{"$expr":"$refId($steps.r.button) == 'el-a'"},"raw":{"$expr":"$refId('plain')"}}}]}}`)
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("status %s %+v", ex.Status, ex.Error)
	}
	if out := ex.Output.(map[string]any); out["same"] != true || out["raw"] != "plain" {
		t.Fatalf("output = %v", out)
	}
}
