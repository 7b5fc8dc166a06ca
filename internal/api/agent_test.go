package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// agentModels answers round 1 with a call of mem_add and round 2 with the
// sum it was given.
type agentModels struct{}

func (agentModels) Check(model string) error {
	if !strings.HasPrefix(model, "fake/") {
		return errors.New("no model provider is configured under that name")
	}
	return nil
}

func (agentModels) Turn(_ context.Context, req agent.ModelRequest, onDelta func(agent.ModelDelta)) (*agent.ModelResponse, error) {
	if len(req.Messages) == 1 {
		return &agent.ModelResponse{ToolCalls: []agent.ModelToolCall{{ID: "c1", Name: "mem_add", Args: json.RawMessage(`{"a":2,"b":3}`)}},
			Usage: agent.ModelUsage{InputTokens: 12, OutputTokens: 4}}, nil
	}
	result := req.Messages[2].ToolResults[0].Content
	onDelta(agent.ModelDelta{Text: "The sum is " + result})
	return &agent.ModelResponse{Text: "The sum is " + result, Usage: agent.ModelUsage{InputTokens: 20, OutputTokens: 6}}, nil
}

func setupAgents(t *testing.T) *bundle {
	t.Helper()
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "add", InputSchema: json.RawMessage(`{"type":"object"}`)},
		Fn: func(_ context.Context, a map[string]any) (any, error) {
			return map[string]any{"sum": a["a"].(float64) + a["b"].(float64)}, nil
		}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("mem", mem))
	must(t, reg.Start(context.Background()))
	st := storetest.New(t)
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("test", []byte(`{"connections":{"mem":{"ops":["*"]}}}`))
	must(t, err)
	_, err = als.Put(context.Background(), al, "setup")
	must(t, err)
	metrics := api.NewMetrics()
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Observer: metrics, Allowlists: als, Models: agentModels{}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 1); close(done) }()
	srv := httptest.NewServer(api.New(api.Options{
		Executions: execs, Registry: reg, Allowlists: als, MaxBodyBytes: 64 << 10, Metrics: metrics,
		APIKeys: []api.Key{{SHA256: sha256.Sum256([]byte(testKey)), Principal: authz.Principal{Name: "tester", Allowlist: "test", Roles: []authz.Role{authz.Admin}}}},
	}))
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	router, err := gorillamux.NewRouter(loadSpec(t))
	must(t, err)
	return &bundle{url: srv.URL, router: router, spec: loadSpec(t), seen: map[string]bool{}}
}

func TestAgentShorthand(t *testing.T) {
	t.Parallel()
	b := setupAgents(t)
	const jsonCT = "application/json"
	r := b.do(t, "POST", "/v1/executions", jsonCT, `{"agent":{"model":"fake/m","instructions":"Add with the tools."},"input":"What is 2 + 3?","wait":"10s"}`)
	if r.status != 200 {
		t.Fatalf("POST agent = %d %s", r.status, r.body)
	}
	ex := r.json(t)
	if ex["status"] != "succeeded" || ex["output"] != `The sum is {"sum":5}` {
		t.Fatalf("execution = %s", r.body)
	}
	var keys []string
	for _, s := range ex["steps"].([]any) {
		keys = append(keys, s.(map[string]any)["key"].(string))
	}
	if got := strings.Join(keys, ","); got != "agent,agent/round:1,agent/round:1/tool:c1,agent/round:2" {
		t.Fatalf("ledger keys = %s", got)
	}
	r = b.do(t, "GET", "/metrics", "", "")
	for _, want := range []string{`patchbay_model_tokens_total{direction="input",model="m",provider="fake"} 32`, `patchbay_model_tokens_total{direction="output",model="m",provider="fake"} 10`} {
		if !bytes.Contains(r.body, []byte(want)) {
			t.Errorf("metrics lack %s", want)
		}
	}

	bad := []struct{ name, body, path, code string }{
		{"both", `{"workflow":{"version":1,"root":{"kind":"sequence","id":"s","steps":[]}},"agent":{"model":"fake/m"}}`, "/agent", "VALIDATION_FAILED"},
		{"not an object", `{"agent":"fake/m"}`, "/agent", "VALIDATION_FAILED"},
		{"unknown provider", `{"agent":{"model":"nope/m"}}`, "/agent/model", "VALIDATION_FAILED"},
		{"unknown tool choice", `{"agent":{"model":"fake/m","toolChoice":"mem_sub"}}`, "/agent/toolChoice", "UNKNOWN_TOOL_CHOICE"},
		{"unknown connection", `{"agent":{"model":"fake/m","tools":[{"connection":"ghost"}]}}`, "/agent/tools/0/connection", "CONNECTION_UNKNOWN"},
		{"unknown field", `{"agent":{"model":"fake/m","temperature":2}}`, "/agent/temperature", "VALIDATION_FAILED"},
		{"bad output schema", `{"agent":{"model":"fake/m","output":{"schema":{"type":"object","properties":{"n":{"type":"numbr"}}}}}}`, "/agent/output/schema/properties/n/type", "VALIDATION_FAILED"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			r := b.do(t, "POST", "/v1/executions", jsonCT, tt.body)
			if r.status != 422 {
				t.Fatalf("status %d %s", r.status, r.body)
			}
			p := r.json(t)
			for _, e := range p["errors"].([]any) {
				fe := e.(map[string]any)
				if fe["path"] == tt.path && fe["code"] == tt.code {
					return
				}
			}
			t.Fatalf("problem = %s, want %s at %s", r.body, tt.code, tt.path)
		})
	}
}
