package gates_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/refs"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// pipelineOn is a Pipeline and one ready connection "mem" with operations
// lookup (a schema), delete and files/{dir} (an HTTP path), under policy.
func pipelineOn(t *testing.T, policy registry.Policy, sec secrets.SecretStore) (*gates.Pipeline, *registry.Connection, *refs.Sealer) {
	t.Helper()
	st := storetest.NewEmbedded(t)
	reg := registry.NewRegistry(nil)
	mem := connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "lookup", InputSchema: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}`)}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "delete"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "files", HTTP: &connect.HTTPRoute{Method: "GET", Path: "/files/{dir}"}}},
	)
	if err := reg.Add("mem", mem); err != nil {
		t.Fatal(err)
	}
	if err := reg.SetPolicy("mem", policy); err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	conn, err := reg.Get("mem")
	if err != nil {
		t.Fatal(err)
	}
	sealer := refs.NewSealer(st)
	return gates.New(gates.Options{Sealer: sealer, Secrets: sec, Redactor: secrets.NewSecretRedactor()}), conn, sealer
}

func gateOf(err error) int {
	var d *fault.Denied
	if errors.As(err, &d) {
		return d.Gate
	}
	return 0
}

// Each stage refuses at its own gate, and Check runs them in order.
func TestPipelineStages(t *testing.T) {
	p, conn, sealer := pipelineOn(t, registry.Policy{Deny: []string{"delete"}, Approve: []string{"lookup"}}, nil)
	token, err := sealer.Seal(t.Context(), "raw-1", "item", false, refs.RefContext{Thread: "ex_1", Connection: "mem", Identity: conn.Identity()})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		op      string
		args    map[string]any
		thread  string
		gate    int
		verdict gates.Verdict
		opened  map[string]any
	}{
		{name: "undeclared", op: "nope", args: map[string]any{}, gate: fault.GateDeclared},
		{name: "schema", op: "lookup", args: map[string]any{"q": 1}, gate: fault.GateSchema},
		{name: "path leaves the operation", op: "files", args: map[string]any{"dir": ".."}, gate: fault.GateSchema},
		{name: "forged ref", op: "lookup", args: map[string]any{"q": map[string]any{"$ref": "raw-1"}}, gate: fault.GateRefs},
		{name: "ref of another thread", op: "lookup", args: map[string]any{"q": map[string]any{"$ref": token}}, thread: "ex_2", gate: fault.GateRefs},
		{name: "policy denies", op: "delete", args: map[string]any{}, gate: fault.GatePolicy},
		{name: "policy asks a person, ref opened", op: "lookup", args: map[string]any{"q": map[string]any{"$ref": token}}, thread: "ex_1",
			verdict: gates.NeedsApproval, opened: map[string]any{"q": "raw-1"}},
		{name: "allowed", op: "files", args: map[string]any{"dir": "docs"}, verdict: gates.Allow, opened: map[string]any{"dir": "docs"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			thread := tt.thread
			if thread == "" {
				thread = "ex_1"
			}
			v, opened, err := p.Check(t.Context(), gates.Call{Conn: conn, Op: tt.op, Args: tt.args, Thread: thread})
			if tt.gate != 0 {
				if gateOf(err) != tt.gate {
					t.Fatalf("Check = %v; want a refusal at gate %d", err, tt.gate)
				}
				return
			}
			if err != nil || v != tt.verdict {
				t.Fatalf("Check = %v, %v; want verdict %v", v, err, tt.verdict)
			}
			if got, _ := json.Marshal(opened); string(got) != mustJSON(t, tt.opened) {
				t.Errorf("opened %s, want %s", got, mustJSON(t, tt.opened))
			}
		})
	}
}

// A guarded operation needs a person unless the policy allows it by name.
func TestPipelinePolicyGuarded(t *testing.T) {
	p, conn, _ := pipelineOn(t, registry.Policy{Allow: []string{"files"}}, nil)
	for op, want := range map[string]gates.Verdict{"delete": gates.NeedsApproval, "files": gates.Allow} {
		if v, err := p.Policy(gates.Call{Conn: conn, Op: op, Guarded: true}); err != nil || v != want {
			t.Errorf("Policy(%s) = %v, %v; want %v", op, v, err, want)
		}
	}
}

type oneSecret struct{}

func (oneSecret) Resolve(_ context.Context, name string) (string, error) {
	if name == "api.token" {
		return "s3cret-value", nil
	}
	return "", secrets.ErrSecretNotFound
}

// Gate 6 fills secret placeholders last and refuses one it cannot resolve.
func TestPipelineFillSecrets(t *testing.T) {
	p, _, _ := pipelineOn(t, registry.Policy{}, oneSecret{})
	filled, err := p.FillSecrets(t.Context(), map[string]any{"auth": []any{document.SecretArg{Name: "api.token"}}})
	if err != nil || !strings.Contains(mustJSON(t, filled), "s3cret-value") {
		t.Fatalf("FillSecrets = %v, %v", filled, err)
	}
	if _, err := p.FillSecrets(t.Context(), document.SecretArg{Name: "other"}); gateOf(err) != fault.GateSecrets {
		t.Fatalf("an unknown secret: %v, want a refusal at gate 6", err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
