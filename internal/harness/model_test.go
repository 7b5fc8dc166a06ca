package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// scriptModels is a fake model provider: round n of a turn (one more than
// the assistant messages in its transcript) answers with rounds[n-1]. It
// records every request and streams the text in small pieces.
type scriptModels struct {
	rounds []agent.ModelResponse
	mu     sync.Mutex
	reqs   []agent.ModelRequest
}

func (s *scriptModels) Check(model string) error {
	if !strings.HasPrefix(model, "fake/") {
		return fmt.Errorf("no model provider %q is configured", strings.Split(model, "/")[0])
	}
	return nil
}

func (s *scriptModels) Turn(_ context.Context, req agent.ModelRequest, onDelta func(agent.ModelDelta)) (*agent.ModelResponse, error) {
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	round := 1
	for _, m := range req.Messages {
		if m.Role == agent.RoleAssistant {
			round++
		}
	}
	if round > len(s.rounds) {
		return nil, errors.New("script exhausted")
	}
	resp := s.rounds[round-1]
	for _, word := range strings.SplitAfter(resp.Text, " ") {
		onDelta(agent.ModelDelta{Text: word})
	}
	return &resp, nil
}

func (s *scriptModels) requests() []agent.ModelRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]agent.ModelRequest(nil), s.reqs...)
}

func toolCall(id, name, args string) agent.ModelToolCall {
	return agent.ModelToolCall{ID: id, Name: name, Args: json.RawMessage(args)}
}

func step(ex *harness.Execution, key string) *harness.StepRecord {
	for i := range ex.Steps {
		if ex.Steps[i].Key == key {
			return &ex.Steps[i]
		}
	}
	return nil
}

const leaked = "sk-leaked-0123456789abcdef"

// TestModelLoopWaitsForApproval runs three rounds through a connection:
// a read, a guarded send that waits for a person, then the final answer.
// After the approval the run resumes from the ledger: rounds already paid
// for are not sent again and the read is not repeated.
func TestModelLoopWaitsForApproval(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		mem := connecttest.NewMemory(
			connecttest.MemoryOp{Operation: connect.Operation{Name: "lookup", Description: "Looks a thing up.",
				InputSchema: json.RawMessage(`{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}`),
				Annotations: connect.Annotations{ReadOnlyHint: ptr(true)}},
				Fn: func(_ context.Context, a map[string]any) (any, error) {
					return map[string]any{"found": a["q"], "token": leaked}, nil
				}},
			connecttest.MemoryOp{Operation: connect.Operation{Name: "send", InputSchema: json.RawMessage(`{"type":"object","properties":{"to":{"type":"string"}},"required":["to"]}`)}},
		)
		reg := registry.NewRegistry(nil)
		must(t, reg.Add("svc", mem))
		must(t, reg.SetPolicy("svc", registry.Policy{Approve: []string{"send"}}))
		must(t, reg.Start(ctx))
		models := &scriptModels{rounds: []agent.ModelResponse{
			{Text: "Looking it up.", ToolCalls: []agent.ModelToolCall{toolCall("c1", "svc_lookup", `{"q":"pb"}`)}, Usage: agent.ModelUsage{InputTokens: 10, OutputTokens: 5}},
			{ToolCalls: []agent.ModelToolCall{toolCall("c2", "svc_send", `{"to":"ops"}`)}, Usage: agent.ModelUsage{InputTokens: 20, OutputTokens: 6}},
			{Text: "Sent it to ops, all done.", Usage: agent.ModelUsage{InputTokens: 30, OutputTokens: 7}},
		}}
		red := secrets.NewSecretRedactor()
		red.Add(leaked)
		execs := startWorkers(t, st, reg, 2, "agents", `{"connections":{"svc":{"ops":["*"]}}}`, harness.ExecutionsOptions{Models: models, Redactor: red})

		doc := `{"version":1,"connections":{"svc":{}},"root":{"kind":"model","id":"turn","model":"fake/m1","instructions":"Use the tools."}}`
		ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Input: "Find pb and tell ops.", Principal: "alice", Allowlist: "agents"})
		must(t, err)
		ap := waitApproval(t, execs, ex.ID)
		if ap.Op != "send" || ap.Connection != "svc" || ap.Args["to"] != "ops" {
			t.Fatalf("approval = %+v", ap)
		}
		waitStatus(t, execs, ex.ID, harness.ExecWaiting)
		if n := len(models.requests()); n != 2 {
			t.Fatalf("%d rounds sent before the approval, want 2", n)
		}
		_, err = execs.Approvals().Decide(ctx, ap.ID, gates.ApprovalApproved, "bob", "")
		must(t, err)
		ex, err = execs.Wait(ctx, ex.ID, 10*time.Second)
		must(t, err)
		if ex.Status != harness.ExecSucceeded || ex.Output != "Sent it to ops, all done." {
			t.Fatalf("execution %s %+v output %v", ex.Status, ex.Error, ex.Output)
		}

		reqs := models.requests()
		if len(reqs) != 3 {
			t.Fatalf("%d rounds sent in all, want 3 (no round paid for twice)", len(reqs))
		}
		var calls []string
		for _, c := range mem.Calls() {
			calls = append(calls, c.Op)
		}
		if strings.Join(calls, ",") != "lookup,send" {
			t.Fatalf("connection calls = %v, want lookup then send, once each", calls)
		}
		first := reqs[0]
		if first.Model != "fake/m1" || first.Instructions != "Use the tools." || first.Messages[0].Text != "Find pb and tell ops." {
			t.Fatalf("first request = %+v", first)
		}
		if len(first.Tools) != 2 || first.Tools[0].Name != "svc_lookup" || first.Tools[1].Name != "svc_send" ||
			first.Tools[0].Description != "[svc] Looks a thing up. (read-only)" || !strings.Contains(string(first.Tools[0].InputSchema), `"q"`) {
			t.Fatalf("tools = %+v", first.Tools)
		}
		result := reqs[1].Messages[2]
		if result.Role != agent.RoleTool || result.ToolResults[0].CallID != "c1" || result.ToolResults[0].IsError ||
			!strings.Contains(result.ToolResults[0].Content, `"found":"pb"`) {
			t.Fatalf("tool result = %+v", result)
		}
		for _, r := range reqs {
			if raw, _ := json.Marshal(r); strings.Contains(string(raw), leaked) {
				t.Fatalf("a secret reached the model: %s", raw)
			}
		}

		round1 := step(ex, "turn/round:1")
		if round1 == nil || round1.Status != harness.StepDone || round1.Kind != "model.round" {
			t.Fatalf("round 1 entry = %+v", round1)
		}
		usage := round1.Output.(map[string]any)["usage"].(map[string]any)
		if usage["inputTokens"] != 10.0 || usage["outputTokens"] != 5.0 {
			t.Fatalf("round 1 usage = %v", usage)
		}
		send := step(ex, "turn/round:2/tool:c2")
		if send == nil || send.Status != harness.StepDone || send.Op != "send" || send.Connection != "svc" || send.ApprovalID != ap.ID ||
			send.IdempotencyKey != ex.ID+":turn/round:2/tool:c2" {
			t.Fatalf("send entry = %+v", send)
		}
		if e := step(ex, "turn"); e == nil || e.Output != "Sent it to ops, all done." {
			t.Fatalf("turn entry = %+v", e)
		}

		events, err := execs.Events(ctx, ex.ID, "", 0)
		must(t, err)
		var text strings.Builder
		rounds := 0
		for _, ev := range events {
			switch ev.Type {
			case agent.EventModelDelta:
				text.WriteString(ev.Data["text"].(string))
			case agent.EventModelRound:
				rounds++
			}
		}
		if text.String() != "Looking it up.Sent it to ops, all done." || rounds != 3 {
			t.Fatalf("streamed %q in %d rounds", text.String(), rounds)
		}
	})
}

func ptr[T any](v T) *T { return &v }

func waitStatus(t *testing.T, execs *harness.Executions, id string, want harness.ExecState) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ex, err := execs.Get(context.Background(), id); err == nil && ex.Status == want {
			return
		}
	}
	t.Fatalf("execution %s never became %s", id, want)
}

// devices has two connections offering the same ui.tap (merged into one
// tool with a target) and a web connection whose ui.tap differs.
func devices(t *testing.T, models agent.Models) (*harness.Executions, map[string]*connecttest.Memory) {
	t.Helper()
	tap := connect.Operation{Name: "ui.tap", InputSchema: json.RawMessage(`{"type":"object","properties":{"element":{"type":"string"}},"required":["element"]}`)}
	mems := map[string]*connecttest.Memory{
		"ios":     connecttest.NewMemory(connecttest.MemoryOp{Operation: tap}, connecttest.MemoryOp{Operation: connect.Operation{Name: "ui.home"}}),
		"android": connecttest.NewMemory(connecttest.MemoryOp{Operation: tap}, connecttest.MemoryOp{Operation: connect.Operation{Name: "apps.list"}}),
		"web":     connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "ui.tap", InputSchema: json.RawMessage(`{"type":"object"}`)}}),
	}
	reg := registry.NewRegistry(nil)
	for name, m := range mems {
		must(t, reg.Add(name, m))
	}
	must(t, reg.Start(context.Background()))
	execs := startWorkers(t, storetest.New(t), reg, 1, "devices",
		`{"connections":{"ios":{"ops":["*"]},"android":{"ops":["ui.*"]},"web":{"ops":["*"]}}}`, harness.ExecutionsOptions{Models: models})
	return execs, mems
}

func TestMergedToolRefusesOtherTargets(t *testing.T) {
	t.Parallel()
	models := &scriptModels{rounds: []agent.ModelResponse{
		{ToolCalls: []agent.ModelToolCall{toolCall("t1", "ui_tap", `{"target":"android","element":"Settings"}`)}},
		{ToolCalls: []agent.ModelToolCall{toolCall("t2", "ui_tap", `{"target":"ios","element":"Settings"}`)}},
		{Text: "Opened settings."},
	}}
	execs, mems := devices(t, models)
	doc := `{"version":1,"connections":{"ios":{},"android":{},"web":{}},"root":{"kind":"model","id":"turn","model":"fake/m",
		"instructions":"Find the settings screen.","tools":[{"connection":"ios","ops":["ui.*"]}]}}`
	ex := runDocAs(t, execs, doc, "devices")
	if ex.Status != harness.ExecSucceeded || ex.Output != "Opened settings." {
		t.Fatalf("execution %s %+v", ex.Status, ex.Error)
	}
	reqs := models.requests()
	var names []string
	for _, tool := range reqs[0].Tools {
		names = append(names, tool.Name)
	}
	if strings.Join(names, ",") != "ui_tap,ios_ui_home" {
		t.Fatalf("tools = %v, want the merged ui_tap and ios_ui_home", names)
	}
	var schema struct {
		Properties map[string]struct{ Enum []string } `json:"properties"`
		Required   []string                           `json:"required"`
	}
	must(t, json.Unmarshal(reqs[0].Tools[0].InputSchema, &schema))
	if enum := schema.Properties["target"].Enum; len(enum) != 1 || enum[0] != "ios" || !strings.Contains(strings.Join(schema.Required, ","), "target") {
		t.Fatalf("target enum = %v required %v, want [ios]", enum, schema.Required)
	}
	refused := reqs[1].Messages[2].ToolResults[0]
	if !refused.IsError || !strings.Contains(refused.Content, "steering_denied") || !strings.Contains(refused.Content, "android") {
		t.Fatalf("refused call answered %+v", refused)
	}
	if n := len(mems["android"].Calls()); n != 0 {
		t.Fatalf("android was called %d times", n)
	}
	calls := mems["ios"].Calls()
	if len(calls) != 1 || calls[0].Op != "ui.tap" || calls[0].Args["element"] != "Settings" || calls[0].Args["target"] != nil {
		t.Fatalf("ios calls = %+v", calls)
	}
	entry := step(ex, "turn/round:1/tool:t1")
	if entry == nil || entry.Status != harness.StepFailed || entry.Error.Code != "steering_denied" || entry.Error.Gate != 1 {
		t.Fatalf("refused entry = %+v", entry)
	}
}

func TestDefaultToolsAreTheGrantedOnes(t *testing.T) {
	t.Parallel()
	models := &scriptModels{rounds: []agent.ModelResponse{{Text: "ok"}}}
	execs, _ := devices(t, models)
	doc := `{"version":1,"connections":{"ios":{},"android":{},"web":{}},"root":{"kind":"model","id":"turn","model":"fake/m"}}`
	ex := runDocAs(t, execs, doc, "devices")
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("execution %s %+v", ex.Status, ex.Error)
	}
	var names []string
	for _, tool := range models.requests()[0].Tools {
		names = append(names, tool.Name+":"+strings.SplitN(tool.Description, "]", 2)[0]+"]")
	}
	// android's apps.list is not granted; web's ui.tap differs in schema,
	// so it keeps a tool of its own.
	want := "ui_tap:[android, ios],ios_ui_home:[ios],web_ui_tap:[web]"
	if got := strings.Join(names, ","); got != want {
		t.Fatalf("tools = %s\nwant     %s", got, want)
	}
}

func TestModelNodeValidation(t *testing.T) {
	t.Parallel()
	models := &scriptModels{}
	execs, _ := devices(t, models)
	tests := []struct {
		name, root, path string
		code             fault.Code
	}{
		{"unknown tool choice", `{"kind":"model","id":"m","model":"fake/x","toolChoice":"ios_ui_swipe"}`, "/workflow/root/toolChoice", document.CodeUnknownToolChoice},
		{"tool choice outside the picks", `{"kind":"model","id":"m","model":"fake/x","tools":[{"connection":"web"}],"toolChoice":"ios_ui_home"}`, "/workflow/root/toolChoice", document.CodeUnknownToolChoice},
		{"unknown provider", `{"kind":"model","id":"m","model":"other/x"}`, "/workflow/root/model", fault.CodeValidationFailed},
		{"model without provider", `{"kind":"model","id":"m","model":"claude"}`, "/workflow/root/model", fault.CodeValidationFailed},
		{"unknown connection", `{"kind":"model","id":"m","model":"fake/x","tools":[{"connection":"tv"}]}`, "/workflow/root/tools/0/connection", fault.CodeConnectionUnknown},
		{"invalid connection name", `{"kind":"model","id":"m","model":"fake/x","tools":[{"connection":"9x"}]}`, "/workflow/root/tools/0/connection", fault.CodeConnectionInvalid},
		{"pick beyond the grant", `{"kind":"model","id":"m","model":"fake/x","tools":[{"connection":"android","ops":["*"]}]}`, "/workflow/root/tools/0/ops/0", gates.CodeConnectionNotAllowed},
		{"bad until", `{"kind":"model","id":"m","model":"fake/x","until":{"maxRounds":0}}`, "/workflow/root/until", fault.CodeValidationFailed},
		{"secret in input", `{"kind":"model","id":"m","model":"fake/x","input":{"$secret":"tok"}}`, "/workflow/root/input/$secret", fault.CodeValidationFailed},
		{"step server shadows a connection", `{"kind":"model","id":"m","model":"fake/x","tools":[{"mcp":{"name":"ios","url":"https://x.test/mcp"}}]}`, "/workflow/root/tools/0/mcp/name", fault.CodeConnectionNameTaken},
		{"step server not granted", `{"kind":"model","id":"m","model":"fake/x","tools":[{"mcp":{"name":"linear","url":"https://x.test/mcp"}}]}`, "/workflow/root/tools/0", gates.CodeConnectionNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := `{"version":1,"connections":{"ios":{},"android":{},"web":{}},"root":` + tt.root + `}`
			_, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Allowlist: "devices"})
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

// TestToolChoiceCheckedWhenAttached: a node whose tools need a server
// attached first builds its tool set at run time, and fails there.
func TestToolChoiceCheckedWhenAttached(t *testing.T) {
	t.Parallel()
	reg := registry.NewRegistry(nil)
	must(t, reg.Start(context.Background()))
	models := &scriptModels{rounds: []agent.ModelResponse{{Text: "never"}}}
	execs := startWorkers(t, storetest.New(t), reg, 1, "docs", `{"mcp":[{"name":"linear","url":"https://mcp.linear.test/mcp","ops":["issues.*"]}]}`,
		harness.ExecutionsOptions{Attacher: &fakeAttacher{}, Models: models})
	doc := `{"version":1,"root":{"kind":"model","id":"m","model":"fake/x","tools":[{"mcp":{"name":"linear","type":"http","url":"https://mcp.linear.test/mcp"}}],"toolChoice":"linear_issues_close"}}`
	ex := runDocAs(t, execs, doc, "docs")
	if ex.Status != harness.ExecFailed || ex.Error.Code != string(document.CodeUnknownToolChoice) {
		t.Fatalf("execution %s %+v, want failed with UNKNOWN_TOOL_CHOICE", ex.Status, ex.Error)
	}
	if n := len(models.requests()); n != 0 {
		t.Fatalf("the model was asked %d times", n)
	}

	// The same server with a choice it offers runs. The next node has no
	// tools, so it is not offered the step's server: the script makes it
	// call linear_issues_list anyway, which is refused, then answer.
	models.rounds = []agent.ModelResponse{{ToolCalls: []agent.ModelToolCall{toolCall("1", "linear_issues_list", `{}`)}}, {Text: "PB-1"}}
	doc = `{"version":1,"root":{"kind":"sequence","id":"s","steps":[
		{"kind":"model","id":"m","model":"fake/x","tools":[{"mcp":{"name":"linear","type":"http","url":"https://mcp.linear.test/mcp"}}],"toolChoice":"linear_issues_list"},
		{"kind":"model","id":"plain","model":"fake/x","input":{"$expr":"$steps.m"}}]}}`
	models.rounds = append(models.rounds, agent.ModelResponse{Text: "done"})
	ex = runDocAs(t, execs, doc, "docs")
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("execution %s %+v", ex.Status, ex.Error)
	}
	reqs := models.requests()
	if len(reqs[0].Tools) != 1 || reqs[0].ToolChoice != "linear_issues_list" || !strings.Contains(reqs[1].Messages[2].ToolResults[0].Content, "PB-1") {
		t.Fatalf("first node's requests = %+v", reqs[:2])
	}
	// The forced call is the first round's; the next may answer.
	if reqs[1].ToolChoice != "auto" {
		t.Fatalf("second round's tool choice = %q, want auto", reqs[1].ToolChoice)
	}
	if last := reqs[len(reqs)-1]; len(last.Tools) != 0 || !last.Messages[2].ToolResults[0].IsError {
		t.Fatalf("a node without tools was offered the step's server: %+v", last)
	}
}

// TestToolIDCollisionAcrossConnections: two connections whose operations
// come out under one tool id (an OpenAPI operationId issues/list on gh,
// and list on gh_issues) refuse the model node at submission, naming both
// connections; a trusted (host) run that builds its tool set at run time
// fails the step the same way. Neither tool is renamed or dropped.
func TestToolIDCollisionAcrossConnections(t *testing.T) {
	t.Parallel()
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("gh", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "issues/list"}})))
	must(t, reg.Add("gh_issues", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "list"}})))
	must(t, reg.Start(context.Background()))
	models := &scriptModels{rounds: []agent.ModelResponse{{Text: "never"}}}
	execs := startWorkers(t, storetest.New(t), reg, 1, "both", `{"connections":{"gh":{"ops":["*"]},"gh_issues":{"ops":["*"]}}}`,
		harness.ExecutionsOptions{Models: models})
	doc := `{"version":1,"connections":{"gh":{},"gh_issues":{}},"root":{"kind":"model","id":"m","model":"fake/x"}}`
	_, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Allowlist: "both"})
	var ve *fault.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Code != document.CodeToolIDCollision || ve.Problems[0].Path != "/workflow/root/tools" {
		t.Fatalf("err = %v, want %s at /workflow/root/tools", err, document.CodeToolIDCollision)
	}
	for _, w := range []string{`"gh_issues_list"`, "connection gh operation issues/list", "connection gh_issues operation list"} {
		if !strings.Contains(ve.Problems[0].Message, w) {
			t.Errorf("%q does not say %q", ve.Problems[0].Message, w)
		}
	}

	ex, _, err := execs.SubmitOnce(context.Background(), "collide", json.RawMessage(doc), nil)
	must(t, err)
	ex, err = execs.Wait(context.Background(), ex.ID, 10*time.Second)
	must(t, err)
	if ex.Status != harness.ExecFailed || ex.Error.Code != string(document.CodeToolIDCollision) || !strings.Contains(ex.Error.Message, "gh_issues") {
		t.Fatalf("host run: %s %+v, want failed with %s", ex.Status, ex.Error, document.CodeToolIDCollision)
	}
	if n := len(models.requests()); n != 0 {
		t.Fatalf("the model was asked %d times", n)
	}
}
