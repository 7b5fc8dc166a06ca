package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// agentPool registers pool "browsers" over fake browsers for model turns;
// the grant offers only whoami and click of the pool's operations.
func agentPool(t *testing.T, st *store.Store, models agent.Models) poolBundle {
	t.Helper()
	pool, err := pools.New(st, "browsers", 2, nil)
	must(t, err)
	f := &fakeBrowsers{release: make(chan struct{})}
	prov, err := pools.NewProvider(pool, pools.ProviderOptions{Wait: 5 * time.Second, Provision: f.provision, RefreshEvery: 50 * time.Millisecond})
	must(t, err)
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("browsers", prov))
	must(t, reg.Start(context.Background()))
	t.Cleanup(func() { _ = reg.Close() })
	execs := startWorkers(t, st, reg, 2, "test", `{"connections":{"browsers":{"ops":["whoami","click"]}}}`,
		harness.ExecutionsOptions{Models: models})
	return poolBundle{execs: execs, reg: reg, fake: f, pool: pool}
}

// TestModelDrivesAPooledHandle: a model node is offered a handle's tools
// (the pool's operations the grant allows, under the handle's name); its
// calls across two rounds lease once and land on the same connection, a
// tool the grant cuts is refused, and the lease goes back at the end.
func TestModelDrivesAPooledHandle(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		models := &scriptModels{rounds: []agent.ModelResponse{
			{Text: "Who am I?", ToolCalls: []agent.ModelToolCall{toolCall("c1", "app_whoami", `{}`)}},
			{ToolCalls: []agent.ModelToolCall{toolCall("c2", "app_whoami", `{}`), toolCall("c3", "app_flaky", `{}`)}},
			{Text: "Same browser twice."},
		}}
		b := agentPool(t, st, models)
		doc := `{"version":1,"connections":{"app":{"from":"browsers"}},
			"root":{"kind":"model","id":"turn","model":"fake/m","instructions":"Use the browser."}}`
		ex := b.run(t, doc)
		if ex.Status != harness.ExecSucceeded || ex.Output != "Same browser twice." {
			t.Fatalf("execution %s %+v output %v", ex.Status, ex.Error, ex.Output)
		}
		reqs := models.requests()
		var names []string
		for _, tool := range reqs[0].Tools {
			names = append(names, tool.Name+":"+strings.SplitN(tool.Description, "]", 2)[0]+"]")
		}
		if got := strings.Join(names, ","); got != "app_whoami:[app],app_click:[app]" {
			t.Fatalf("tools = %s, want the granted operations of the pool under the handle's name", got)
		}
		instance := func(key string) string {
			t.Helper()
			s := step(ex, key)
			if s == nil || s.Status != harness.StepDone || s.Connection != "app" || s.Op != "whoami" {
				t.Fatalf("entry %s = %+v", key, s)
			}
			return s.Output.(map[string]any)["instance"].(string)
		}
		first, second := instance("turn/round:1/tool:c1"), instance("turn/round:2/tool:c2")
		if first == "" || first != second {
			t.Fatalf("instances %q and %q: both calls must land on the one leased connection", first, second)
		}
		refused := reqs[2].Messages[4].ToolResults[1]
		if !refused.IsError || !strings.Contains(refused.Content, "steering_denied") || !strings.Contains(refused.Content, "app_flaky") {
			t.Fatalf("call of a tool the grant cuts answered %+v", refused)
		}
		if n := len(eventsOf(t, b.execs, ex.ID, harness.EventLeaseAcquired)); n != 1 {
			t.Errorf("%d lease.acquired events, want 1", n)
		}
		if n := len(eventsOf(t, b.execs, ex.ID, harness.EventLeaseReleased)); n != 1 {
			t.Errorf("%d lease.released events, want 1", n)
		}
		waitFor(t, "the leased browser to close", func() bool { return b.fake.open.Load() == 0 })
		u, err := b.pool.Status(context.Background())
		if err != nil || u.Leased != 0 {
			t.Errorf("usage after the run = %+v, %v", u, err)
		}
	})
}

// TestModelHandlePicks: a pick may name a handle; its ops are judged by the
// grant on the handle's pool.
func TestModelHandlePicks(t *testing.T) {
	t.Parallel()
	b := agentPool(t, storetest.New(t), &scriptModels{})
	doc := func(tools string) string {
		return `{"version":1,"connections":{"app":{"from":"browsers"}},"root":{"kind":"model","id":"m","model":"fake/x","tools":` + tools + `}}`
	}
	tests := []struct {
		name, doc, path string
		code            fault.Code
	}{
		{"handle pick", doc(`[{"connection":"app","ops":["whoami"]}]`), "", ""},
		{"handle pick beyond the pool's grant", doc(`[{"connection":"app","ops":["flaky"]}]`), "/workflow/root/tools/0/ops/0", gates.CodeConnectionNotAllowed},
		{"tool choice of a handle", `{"version":1,"connections":{"app":{"from":"browsers"}},"root":{"kind":"model","id":"m","model":"fake/x","toolChoice":"app_click"}}`, "", ""},
		{"tool choice the grant cuts", `{"version":1,"connections":{"app":{"from":"browsers"}},"root":{"kind":"model","id":"m","model":"fake/x","toolChoice":"app_flaky"}}`, "/workflow/root/toolChoice", document.CodeUnknownToolChoice},
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
				if p.Path == tt.path && p.Code == tt.code {
					return
				}
			}
			t.Fatalf("problems = %+v, want %s at %s", ve.Problems, tt.code, tt.path)
		})
	}
}

// TestAgentShorthandOnAPool is the reference's first example: the agent
// shorthand picking a pool gets a browser of its own, named after the pool.
func TestAgentShorthandOnAPool(t *testing.T) {
	t.Parallel()
	models := &scriptModels{rounds: []agent.ModelResponse{
		{ToolCalls: []agent.ModelToolCall{toolCall("c1", "browsers_click", `{}`)}},
		{Text: "Followed the link."},
	}}
	b := agentPool(t, storetest.New(t), models)
	ex, err := b.execs.SubmitAgent(context.Background(), harness.AgentRequest{
		Agent:     json.RawMessage(`{"model":"fake/m","instructions":"Use the browser.","tools":[{"connection":"browsers"}]}`),
		Input:     `Open example.com and follow the "More information" link`,
		Principal: "tester", Allowlist: "test"})
	must(t, err)
	ex, err = b.execs.Wait(context.Background(), ex.ID, 20*time.Second)
	must(t, err)
	if ex.Status != harness.ExecSucceeded || ex.Output != "Followed the link." {
		t.Fatalf("execution %s %+v output %v", ex.Status, ex.Error, ex.Output)
	}
	if s := step(ex, "agent/round:1/tool:c1"); s == nil || s.Status != harness.StepDone || s.Connection != "browsers" || s.Op != "click" {
		t.Fatalf("tool entry = %+v", s)
	}
	if n := len(eventsOf(t, b.execs, ex.ID, harness.EventLeaseReleased)); n != 1 {
		t.Errorf("%d lease.released events, want 1", n)
	}
}
