package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
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

// fakeSecrets resolves from a map and counts resolutions.
type fakeSecrets struct {
	mu       sync.Mutex
	values   map[string]string
	resolved []string
}

func (f *fakeSecrets) Resolve(_ context.Context, name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resolved = append(f.resolved, name)
	v, ok := f.values[name]
	if !ok {
		return "", errors.New("no such secret")
	}
	return v, nil
}

type gateBundle struct {
	execs   *harness.Executions
	mem     *connecttest.Memory
	secrets *fakeSecrets
}

// setupGates has a connection "svc" with a typed "send" operation, a
// policy denying "drop*" and guarding "send", and an allowlist "ops"
// granting everything with secret "svc.token" bound to send.auth.
func setupGates(t *testing.T, st *store.Store) gateBundle {
	t.Helper()
	schema := json.RawMessage(`{"type":"object","properties":{"to":{"type":"string"},"auth":{"type":"string"}},"required":["to"],"additionalProperties":false}`)
	mem := connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "send", InputSchema: schema}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "read"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "drop_all"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "fetch", HTTP: &connect.HTTPRoute{Method: "GET", Path: "/files/{dir}/{name}"},
			InputSchema: json.RawMessage(`{"type":"object","properties":{"dir":{"type":"string"},"name":{}},"required":["dir","name"]}`)}},
	)
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("svc", mem))
	must(t, reg.SetPolicy("svc", registry.Policy{Deny: []string{"drop*"}, Approve: []string{"send"}}))
	must(t, reg.Start(context.Background()))
	secrets := &fakeSecrets{values: map[string]string{"svc.token": "tok-very-secret-value"}}
	execs := startWorkers(t, st, reg, 2, "ops", `{"connections":{"svc":{"ops":["*"],"secrets":{"svc.token":"send.auth"}}}}`, harness.ExecutionsOptions{Secrets: secrets})
	return gateBundle{execs: execs, mem: mem, secrets: secrets}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func callDoc(op, args string) string {
	return `{"version":1,"connections":{"svc":{}},"root":{"kind":"call","id":"c","connection":"svc","op":"` + op + `","args":` + args + `}}`
}

func (g gateBundle) run(t *testing.T, doc string) *harness.Execution {
	t.Helper()
	ex, err := g.execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Principal: "tester", Allowlist: "ops"})
	must(t, err)
	ex, err = g.execs.Wait(context.Background(), ex.ID, 10*time.Second)
	must(t, err)
	return ex
}

func TestGatesRefuseInOrder(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		g := setupGates(t, st)
		tests := []struct {
			name string
			doc  string
			gate int
		}{
			{"schema: missing required", callDoc("send", `{"auth":{"$secret":"svc.token"}}`), 2},
			{"schema: extra field", callDoc("send", `{"to":"x","cc":"y"}`), 2},
			{"schema: wrong type", callDoc("send", `{"to":5}`), 2},
			{"policy deny", callDoc("drop_all", `{}`), 4},
			// Path parameters that would leave /files/{dir}/{name}.
			{"path: ..", callDoc("fetch", `{"dir":"..","name":"admin"}`), 2},
			{"path: .", callDoc("fetch", `{"dir":".","name":"x"}`), 2},
			{"path: slash", callDoc("fetch", `{"dir":"a/b","name":"x"}`), 2},
			{"path: encoded dots", callDoc("fetch", `{"dir":"%2e%2e","name":"x"}`), 2},
			{"path: encoded slash", callDoc("fetch", `{"dir":"a%2Fb","name":"x"}`), 2},
			{"path: encoded twice", callDoc("fetch", `{"dir":"%252E%252e","name":"x"}`), 2},
			{"path: backslash", callDoc("fetch", `{"dir":"..\\admin","name":"x"}`), 2},
			{"path: empty", callDoc("fetch", `{"dir":"","name":"x"}`), 2},
			{"path: in a list", callDoc("fetch", `{"dir":"d","name":["a",".."]}`), 2},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ex := g.run(t, tt.doc)
				if ex.Status != harness.ExecFailed || ex.Error.Code != "steering_denied" || ex.Error.Gate != tt.gate {
					t.Fatalf("got %s %+v, want steering_denied at gate %d", ex.Status, ex.Error, tt.gate)
				}
				if arg := strings.TrimPrefix(tt.name, "path: "); arg != tt.name {
					want := `argument "dir"`
					if arg == "in a list" {
						want = `argument "name"`
					}
					if !strings.Contains(ex.Error.Message, want) || !strings.Contains(ex.Error.Message, "/files/{dir}/{name}") {
						t.Fatalf("message %q does not name the argument and the path", ex.Error.Message)
					}
				}
			})
		}
		if n := len(g.mem.Calls()); n != 0 {
			t.Fatalf("refused calls reached the server %d times", n)
		}
		if len(g.secrets.resolved) != 0 {
			t.Fatalf("refused calls resolved secrets: %v", g.secrets.resolved)
		}
		pending, err := g.execs.Approvals().List(context.Background(), gates.ApprovalPending, 0)
		must(t, err)
		if len(pending) != 0 {
			t.Fatalf("a refused call reached the approver: %+v", pending)
		}
	})
}

func TestApprovalFlow(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		g := setupGates(t, st)
		ctx := context.Background()
		doc := `{"version":1,"connections":{"svc":{}},"root":{"kind":"sequence","id":"m","steps":[
			{"kind":"call","id":"r","connection":"svc","op":"read","args":{"n":1}},
			{"kind":"call","id":"s","connection":"svc","op":"send","args":{"to":"ops","auth":{"$secret":"svc.token"}}}]}}`
		ex, err := g.execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Principal: "alice", Allowlist: "ops"})
		must(t, err)
		ap := waitApproval(t, g.execs, ex.ID)
		if ap.Step != "s" || ap.Op != "send" || ap.RequestedBy != "alice" || ap.Args["auth"] != "<redacted>" || ap.Args["to"] != "ops" {
			t.Fatalf("approval = %+v", ap)
		}
		// The approval is written just before the execution turns waiting.
		var got *harness.Execution
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if got, err = g.execs.Get(ctx, ex.ID); err == nil && got.Status == harness.ExecWaiting {
				break
			}
		}
		must(t, err)
		if got.Status != harness.ExecWaiting {
			t.Fatalf("status while pending = %s", got.Status)
		}
		if len(g.secrets.resolved) != 0 {
			t.Fatal("secret resolved before approval")
		}

		// Approve twice, concurrently: the call proceeds exactly once.
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if _, err := g.execs.Approvals().Decide(ctx, ap.ID, gates.ApprovalApproved, "bob", "ok"); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		got, err = g.execs.Wait(ctx, ex.ID, 10*time.Second)
		must(t, err)
		if got.Status != harness.ExecSucceeded {
			t.Fatalf("after approval: %s %+v", got.Status, got.Error)
		}
		var sends, reads int
		for _, c := range g.mem.Calls() {
			switch c.Op {
			case "send":
				sends++
				if c.Args["auth"] != "tok-very-secret-value" {
					t.Fatalf("secret not filled in: %v", c.Args)
				}
			case "read":
				reads++
			}
		}
		if sends != 1 || reads != 1 {
			t.Fatalf("sends = %d, reads = %d; want 1 and 1 (the replay must not repeat the read)", sends, reads)
		}
		decided, err := g.execs.Approvals().Get(ctx, ap.ID)
		must(t, err)
		if decided.State != gates.ApprovalApproved || decided.DecidedBy != "bob" || decided.Note != "ok" {
			t.Fatalf("decided = %+v", decided)
		}
		if _, err := g.execs.Approvals().Decide(ctx, ap.ID, gates.ApprovalDenied, "eve", ""); !errors.Is(err, gates.ErrApprovalDecided) {
			t.Fatalf("deny after approve = %v", err)
		}
		// The secret was sent, and is nowhere in what is stored or shown.
		out, _ := json.Marshal(got)
		if strings.Contains(string(out), "tok-very-secret-value") || got.Output.(map[string]any)["auth"] != "<redacted>" {
			t.Fatalf("secret not redacted from the execution record: %s", out)
		}
	})
}

func TestApprovalDenied(t *testing.T) {
	t.Parallel()
	g := setupGates(t, storetest.New(t))
	ctx := context.Background()
	ex, err := g.execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(callDoc("send", `{"to":"x"}`)), Allowlist: "ops"})
	must(t, err)
	ap := waitApproval(t, g.execs, ex.ID)
	_, err = g.execs.Approvals().Decide(ctx, ap.ID, gates.ApprovalDenied, "bob", "no")
	must(t, err)
	got, err := g.execs.Wait(ctx, ex.ID, 10*time.Second)
	must(t, err)
	if got.Status != harness.ExecFailed || got.Error.Code != "steering_denied" || got.Error.Gate != 5 {
		t.Fatalf("got %s %+v", got.Status, got.Error)
	}
	if len(g.mem.Calls()) != 0 {
		t.Fatal("a denied call was sent")
	}
}

func waitApproval(t *testing.T, execs *harness.Executions, exec string) *gates.Approval {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		aps, err := execs.Approvals().List(context.Background(), gates.ApprovalPending, 0)
		must(t, err)
		for _, ap := range aps {
			if ap.Execution == exec {
				return ap
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no approval requested")
	return nil
}

func TestAllowlistBoundsDocuments(t *testing.T) {
	t.Parallel()
	g := setupGates(t, storetest.New(t))
	tests := []struct {
		name, allowlist, doc, path string
	}{
		{"no allowlist grants nothing", "", callDoc("read", `{}`), "/workflow/connections/svc"},
		{"unknown allowlist grants nothing", "nope", callDoc("read", `{}`), "/workflow/connections/svc"},
		{"secret bound to another field", "ops", callDoc("send", `{"to":{"$secret":"svc.token"}}`), "/workflow/root/args/to/$secret"},
		{"secret not granted", "ops", callDoc("send", `{"to":"x","auth":{"$secret":"other"}}`), "/workflow/root/args/auth/$secret"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := g.execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(tt.doc), Allowlist: tt.allowlist})
			var ve *fault.ValidationError
			if !errors.As(err, &ve) || ve.Code() != gates.CodeConnectionNotAllowed {
				t.Fatalf("Submit = %v, want CONNECTION_NOT_ALLOWED", err)
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

func TestParseAllowlist(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, path string
	}{
		{"bad glob", `{"connections":{"svc":{"ops":["ui.[*"]}}}`, "/connections/svc/ops/0"},
		{"unknown field", `{"connections":{"svc":{"opz":["*"]}}}`, ""},
		{"bad connection name", `{"connections":{"9x":{"ops":["*"]}}}`, "/connections/9x"},
		{"secret without field", `{"connections":{"svc":{"secrets":{"a":"send"}}}}`, "/connections/svc/secrets/a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := gates.ParseAllowlist("x", []byte(tt.body))
			var ve *fault.ValidationError
			if !errors.As(err, &ve) || ve.Problems[0].Path != tt.path {
				t.Fatalf("ParseAllowlist = %v, want a problem at %q", err, tt.path)
			}
		})
	}
}

// TestPathArgsThatStayOnThePath: values that stay one segment pass gate
// 2 and are sent as they are.
func TestPathArgsThatStayOnThePath(t *testing.T) {
	t.Parallel()
	g := setupGates(t, storetest.New(t))
	ex := g.run(t, callDoc("fetch", `{"dir":"..a","name":"report 100%.txt"}`))
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("got %s %+v", ex.Status, ex.Error)
	}
	if calls := g.mem.Calls(); len(calls) != 1 || calls[0].Args["dir"] != "..a" {
		t.Fatalf("calls = %+v", calls)
	}
}

func TestCheckPathArgs(t *testing.T) {
	t.Parallel()
	route := &connect.HTTPRoute{Method: "GET", Path: "/files/{dir}/{name}"}
	for _, tt := range []struct {
		args map[string]any
		want string // "" when it passes
	}{
		{map[string]any{"dir": "docs", "name": "a.txt"}, ""},
		{map[string]any{"dir": "...", "name": 5.0}, ""},
		{map[string]any{"dir": "%zz", "name": "x"}, ""},
		{map[string]any{"other": "..", "dir": "d"}, ""},
		{map[string]any{"dir": ".."}, `argument "dir" is ".."`},
		{map[string]any{"dir": ".%2E"}, `argument "dir" is ".%2E" (decoded: "..")`},
		{map[string]any{"dir": "d", "name": "a%2fb"}, `argument "name" is "a%2fb" (decoded: "a/b") and holds "/" or "\"`},
		{map[string]any{"dir": map[string]any{"k": "x/y"}}, `argument "dir" is "x/y" and holds`},
	} {
		err := connect.CheckPathArgs(route, tt.args)
		var pe *connect.PathArgError
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%v: %v", tt.args, err)
		case tt.want != "" && (!errors.As(err, &pe) || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%v: err = %v, want %s", tt.args, err, tt.want)
		}
	}
	if err := connect.CheckPathArgs(nil, map[string]any{"dir": ".."}); err != nil {
		t.Fatalf("an operation without a route: %v", err)
	}
}
