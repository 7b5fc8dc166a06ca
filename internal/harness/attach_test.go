package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// fakeAttacher attaches a memory server and records what it was given.
type fakeAttacher struct {
	mu      sync.Mutex
	specs   []document.AttachSpec
	secrets []map[string]string
	closed  int
}

func (f *fakeAttacher) Attach(_ context.Context, spec document.AttachSpec, secrets map[string]string) (connect.Conn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.specs, f.secrets = append(f.specs, spec), append(f.secrets, secrets)
	return &closeCounter{Memory: connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "issues.list"}, Fn: func(context.Context, map[string]any) (any, error) {
		return map[string]any{"issues": []any{"PB-1"}}, nil
	}}), f: f}, nil
}

type closeCounter struct {
	*connecttest.Memory
	f *fakeAttacher
}

func (c *closeCounter) Close() error { c.f.mu.Lock(); c.f.closed++; c.f.mu.Unlock(); return nil }

const attachingDoc = `{"version":1,"connections":{"linear":{"mcp":{"name":"linear","type":"http","url":"https://mcp.linear.test/mcp","headers":{"Authorization":{"$secret":"linear.token"}}}}},
	"root":{"kind":"call","id":"list","connection":"linear","op":"issues.list"}}`

func TestDocumentBringsItsOwnServer(t *testing.T) {
	t.Parallel()
	reg := registry.NewRegistry(nil)
	must(t, reg.Start(context.Background()))
	att := &fakeAttacher{}
	secrets := &fakeSecrets{values: map[string]string{"linear.token": "Bearer lin-secret-123456"}}
	execs := startWorkers(t, storetest.New(t), reg, 1, "docs", `{"mcp":[{"name":"linear","url":"https://mcp.linear.test/mcp","secrets":["linear.token"],"ops":["issues.*"]}]}`,
		harness.ExecutionsOptions{Attacher: att, Secrets: secrets})

	ex := runDocAs(t, execs, attachingDoc, "docs")
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("status %s %+v", ex.Status, ex.Error)
	}
	att.mu.Lock()
	specs, secretsSeen, closed := len(att.specs), att.secrets[0]["linear.token"], att.closed
	att.mu.Unlock()
	if specs != 1 || secretsSeen != "Bearer lin-secret-123456" || closed != 1 {
		t.Fatalf("attached %d with %q, closed %d", specs, secretsSeen, closed)
	}

	refused := []struct{ name, allowlist, doc, path string }{
		{"no grant", "none", attachingDoc, "/workflow/connections/linear/mcp"},
		{"another url", "docs", `{"version":1,"connections":{"linear":{"mcp":{"name":"linear","url":"https://evil.test/mcp"}}},"root":{"kind":"call","id":"l","connection":"linear","op":"issues.list"}}`, "/workflow/connections/linear/mcp"},
		{"a secret not granted", "docs", `{"version":1,"connections":{"linear":{"mcp":{"name":"linear","url":"https://mcp.linear.test/mcp","headers":{"X-Key":{"$secret":"other"}}}}},"root":{"kind":"call","id":"l","connection":"linear","op":"issues.list"}}`, "/workflow/connections/linear/mcp"},
		{"an op not granted", "docs", `{"version":1,"connections":{"linear":{"mcp":{"name":"linear","url":"https://mcp.linear.test/mcp"}}},"root":{"kind":"call","id":"l","connection":"linear","op":"admin.drop"}}`, "/workflow/root/op"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			_, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(tt.doc), Allowlist: tt.allowlist})
			var ve *fault.ValidationError
			if !errors.As(err, &ve) || ve.Code() != gates.CodeConnectionNotAllowed || ve.Problems[0].Path != tt.path {
				t.Fatalf("Submit = %v, want CONNECTION_NOT_ALLOWED at %s", err, tt.path)
			}
		})
	}
	t.Run("an operation the server lacks fails at gate 1", func(t *testing.T) {
		ex := runDocAs(t, execs, `{"version":1,"connections":{"linear":{"mcp":{"name":"linear","url":"https://mcp.linear.test/mcp"}}},"root":{"kind":"call","id":"l","connection":"linear","op":"issues.nope"}}`, "docs")
		if ex.Status != harness.ExecFailed || ex.Error.Code != "steering_denied" || ex.Error.Gate != 1 {
			t.Fatalf("got %s %+v", ex.Status, ex.Error)
		}
	})
}
