package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestAgentNodeValidation: an acp-agent node names an agent of the config
// file that its allowlist grants, brings no command of its own, and picks
// only granted tools; each problem is a 422 naming the field.
func TestAgentNodeValidation(t *testing.T) {
	t.Parallel()
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("svc", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "read"}}, connecttest.MemoryOp{Operation: connect.Operation{Name: "write"}})))
	must(t, reg.Start(context.Background()))
	agents := map[string]harness.AgentEntry{"codex": {Command: "codex-acp"}, "other": {Command: "other-acp"}}
	execs := startWorkers(t, storetest.New(t), reg, 1, "coders",
		`{"connections":{"svc":{"ops":["read"]}},"agents":["codex"]}`, harness.ExecutionsOptions{Agents: agents})
	tests := []struct {
		name, root, path string
		code             fault.Code
	}{
		{"a command", `{"kind":"acp-agent","id":"a","agent":"codex","command":"/bin/sh"}`, "/workflow/root/command", fault.CodeValidationFailed},
		{"args", `{"kind":"acp-agent","id":"a","agent":"codex","args":["-c","rm -rf /"]}`, "/workflow/root/args", fault.CodeValidationFailed},
		{"env", `{"kind":"acp-agent","id":"a","agent":"codex","env":{"X":"1"}}`, "/workflow/root/env", fault.CodeValidationFailed},
		{"permissions", `{"kind":"acp-agent","id":"a","agent":"codex","permissions":{"allow":["*"]}}`, "/workflow/root/permissions", fault.CodeValidationFailed},
		{"no agent", `{"kind":"acp-agent","id":"a"}`, "/workflow/root/agent", fault.CodeValidationFailed},
		{"unknown agent", `{"kind":"acp-agent","id":"a","agent":"gemini"}`, "/workflow/root/agent", fault.CodeValidationFailed},
		{"agent not granted", `{"kind":"acp-agent","id":"a","agent":"other"}`, "/workflow/root/agent", gates.CodeAgentNotAllowed},
		{"pick beyond the grant", `{"kind":"acp-agent","id":"a","agent":"codex","tools":[{"connection":"svc","ops":["write"]}]}`, "/workflow/root/tools/0/ops/0", gates.CodeConnectionNotAllowed},
		{"secret in the prompt", `{"kind":"acp-agent","id":"a","agent":"codex","prompt":{"$secret":"tok"}}`, "/workflow/root/prompt/$secret", fault.CodeValidationFailed},
		{"bad until", `{"kind":"acp-agent","id":"a","agent":"codex","until":{"maxRounds":0}}`, "/workflow/root/until", fault.CodeValidationFailed},
		{"unknown field", `{"kind":"acp-agent","id":"a","agent":"codex","model":"x/y"}`, "/workflow/root/model", fault.CodeValidationFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := `{"version":1,"connections":{"svc":{}},"root":` + tt.root + `}`
			_, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Allowlist: "coders"})
			var ve *fault.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("err = %v, want a validation error", err)
			}
			for _, p := range ve.Problems {
				if p.Path == tt.path && p.Code == tt.code {
					return
				}
			}
			t.Fatalf("problems = %+v, want %s at %s", ve.Problems, tt.code, tt.path)
		})
	}
}
