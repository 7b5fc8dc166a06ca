package harness_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/profiles"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// bigServer is a connection of 50 operations, op00…op49, each taking a
// required id and answering with its name and the id.
func bigServer() *connecttest.Memory {
	ops := make([]connecttest.MemoryOp, 50)
	for i := range ops {
		name := fmt.Sprintf("op%02d", i)
		ops[i] = connecttest.MemoryOp{
			Operation: connect.Operation{Name: name, Description: fmt.Sprintf("Does thing number %d.", i),
				InputSchema: json.RawMessage(`{"type":"object","required":["id"],"properties":{"id":{"type":"string"}}}`)},
			Fn: func(_ context.Context, a map[string]any) (any, error) {
				return map[string]any{"ran": name, "id": a["id"]}, nil
			},
		}
	}
	return connecttest.NewMemory(ops...)
}

func toolList(req agent.ModelRequest) string {
	names := make([]string, len(req.Tools))
	for i, tool := range req.Tools {
		names[i] = tool.Name
	}
	return strings.Join(names, ",")
}

// TestExposeCallPassesTheSameGates runs the same five calls of a 50-tool
// server's operations once through tools of their own (expose eager) and
// once through big_call (expose call): a granted call, one the allowlist
// does not grant, one whose arguments miss a field, one the policy denies
// and one that needs approval. Each ends alike both ways — the same
// ledger status, code and gate, the same calls reaching the server, the
// same approval — while the call model is given two tools, not twenty.
func TestExposeCallPassesTheSameGates(t *testing.T) {
	t.Parallel()
	calls := []struct{ op, args string }{
		{"op07", `{"id":"r7"}`},
		{"op42", `{"id":"r42"}`}, // not granted
		{"op07", `{}`},           // no id
		{"op08", `{"id":"r8"}`},  // denied by policy
		{"op09", `{"id":"r9"}`},  // needs approval
	}
	type outcome struct {
		status string
		code   string
		gate   int
	}
	run := func(t *testing.T, expose string) ([]outcome, []string, *scriptModels) {
		mem := bigServer()
		reg := registry.NewRegistry(nil)
		must(t, reg.Add("big", mem))
		must(t, reg.SetPolicy("big", registry.Policy{Deny: []string{"op08"}, Approve: []string{"op09"}}))
		must(t, reg.Start(context.Background()))
		var round []agent.ModelToolCall
		if expose == document.ExposeCall {
			round = append(round, toolCall("list", "big_ops", `{}`), toolCall("find", "big_ops", `{"query":"op42"}`))
		}
		for i, c := range calls {
			id := fmt.Sprintf("c%d", i)
			if expose == document.ExposeCall {
				round = append(round, toolCall(id, "big_call", `{"op":"`+c.op+`","args":`+c.args+`}`))
			} else {
				round = append(round, toolCall(id, "big_"+c.op, c.args))
			}
		}
		models := &scriptModels{rounds: []agent.ModelResponse{{ToolCalls: round}, {Text: "done"}}}
		execs := startWorkers(t, storetest.New(t), reg, 1, "agents", `{"connections":{"big":{"ops":["op0*","op1*"]}}}`, harness.ExecutionsOptions{Models: models})
		doc := `{"version":1,"connections":{"big":{"expose":"` + expose + `"}},"root":{"kind":"model","id":"turn","model":"fake/m"}}`
		ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Allowlist: "agents"})
		must(t, err)
		ap := waitApproval(t, execs, ex.ID)
		if ap.Connection != "big" || ap.Op != "op09" || ap.Args["id"] != "r9" {
			t.Fatalf("approval = %+v", ap)
		}
		_, err = execs.Approvals().Decide(context.Background(), ap.ID, gates.ApprovalApproved, "bob", "")
		must(t, err)
		ex, err = execs.Wait(context.Background(), ex.ID, 10*time.Second)
		must(t, err)
		if ex.Status != harness.ExecSucceeded || ex.Output != "done" {
			t.Fatalf("execution %s %+v", ex.Status, ex.Error)
		}
		var got []outcome
		for i := range calls {
			e := step(ex, fmt.Sprintf("turn/round:1/tool:c%d", i))
			if e == nil {
				t.Fatalf("no ledger entry for call c%d", i)
			}
			o := outcome{status: e.Status}
			if e.Error != nil {
				o.code, o.gate = e.Error.Code, e.Error.Gate
			}
			got = append(got, o)
		}
		var sent []string
		for _, c := range mem.Calls() {
			sent = append(sent, c.Op+":"+fmt.Sprint(c.Args["id"]))
		}
		return got, sent, models
	}
	eager, eagerSent, eagerModels := run(t, document.ExposeEager)
	called, calledSent, callModels := run(t, document.ExposeCall)

	want := []outcome{{harness.StepDone, "", 0}, {harness.StepFailed, "steering_denied", 1}, {harness.StepFailed, "steering_denied", 2},
		{harness.StepFailed, "steering_denied", 4}, {harness.StepDone, "", 0}}
	if fmt.Sprint(eager) != fmt.Sprint(want) || fmt.Sprint(called) != fmt.Sprint(want) {
		t.Fatalf("outcomes:\neager %v\ncall  %v\nwant  %v", eager, called, want)
	}
	if strings.Join(eagerSent, ",") != "op07:r7,op09:r9" || strings.Join(calledSent, ",") != "op07:r7,op09:r9" {
		t.Fatalf("sent eager %v, call %v", eagerSent, calledSent)
	}

	eagerReq, callReq := eagerModels.requests()[0], callModels.requests()[0]
	if n := len(eagerReq.Tools); n != 20 {
		t.Fatalf("eager: %d tools, want the 20 granted", n)
	}
	if got := toolList(callReq); got != "big_ops,big_call" {
		t.Fatalf("call: tools %s, want big_ops,big_call", got)
	}
	eagerBytes, _ := json.Marshal(eagerReq.Tools)
	callBytes, _ := json.Marshal(callReq.Tools)
	t.Logf("tool list: eager %d bytes, call %d bytes", len(eagerBytes), len(callBytes))

	// The listing names the granted operations only, with their schemas.
	results := callModels.requests()[1].Messages[2].ToolResults
	var page struct {
		Operations []struct {
			Name        string          `json:"name"`
			InputSchema json.RawMessage `json:"inputSchema"`
		} `json:"operations"`
		Total int  `json:"total"`
		Next  *int `json:"next"`
	}
	must(t, json.Unmarshal([]byte(results[0].Content), &page))
	if page.Total != 20 || len(page.Operations) != 20 || page.Next != nil || page.Operations[19].Name != "op19" || !strings.Contains(string(page.Operations[0].InputSchema), `"id"`) {
		t.Fatalf("listing = %s", results[0].Content)
	}
	if !strings.Contains(results[1].Content, `"total":0`) {
		t.Fatalf("a search for a non-granted operation found %s", results[1].Content)
	}
	refused := results[3]
	if !refused.IsError || !strings.Contains(refused.Content, "steering_denied") || !strings.Contains(refused.Content, "op42") {
		t.Fatalf("the non-granted call was answered %+v", refused)
	}
}

// fullBrowserServer declares browser@1 and implements all of it, plus a tool
// of its own, snapshot.
func fullBrowserServer(t *testing.T) *declaring {
	t.Helper()
	prof, ok := profiles.Builtin().Match("browser", nil)
	if !ok {
		t.Fatal("browser@1 is not built in")
	}
	var ops []connecttest.MemoryOp
	for _, name := range prof.OperationNames() {
		ops = append(ops, connecttest.MemoryOp{Operation: connect.Operation{Name: name, InputSchema: prof.Operations[name].Input}})
	}
	ops = append(ops, connecttest.MemoryOp{Operation: connect.Operation{Name: "snapshot", InputSchema: json.RawMessage(`{"type":"object"}`)}})
	return &declaring{Memory: connecttest.NewMemory(ops...), profiles: map[string]string{"browser": "1.0.0"}}
}

// TestExposeProfile: an entry naming a profile offers its eager set as
// tools and the rest through _call; two connections under one profile
// share merged tools with a target, and one _ops/_call pair.
func TestExposeProfile(t *testing.T) {
	t.Parallel()
	a, b := fullBrowserServer(t), fullBrowserServer(t)
	plain := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "x"}})
	reg := startRegistry(t, map[string]connect.Provider{"a": a, "b": b, "plain": plain}, nil)
	models := &scriptModels{}
	execs := startWorkers(t, storetest.New(t), reg, 1, "web", `{"connections":{"a":{"ops":["*"]},"b":{"ops":["*"]},"plain":{"ops":["*"]}}}`,
		harness.ExecutionsOptions{Models: models})
	model := `"root":{"kind":"model","id":"turn","model":"fake/m"}}`

	// One connection under the profile, one without.
	models.rounds = []agent.ModelResponse{{ToolCalls: []agent.ModelToolCall{
		toolCall("1", "a_ui_click", `{"element":"OK"}`),
		toolCall("2", "a_call", `{"op":"ui.hover","args":{"element":"Menu"}}`),
		toolCall("3", "a_call", `{"op":"snapshot"}`),
	}}, {Text: "done"}}
	ex := runDocAs(t, execs, `{"version":1,"connections":{"a":{"profile":"browser@^1"},"plain":{}},`+model, "web")
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("execution %s %+v", ex.Status, ex.Error)
	}
	if got := toolList(models.requests()[0]); got != "a_navigate,a_ui_click,a_ui_fill,a_ui_press,plain_x,a_ops,a_call" {
		t.Fatalf("tools = %s", got)
	}
	var sent []string
	for _, c := range a.Calls() {
		sent = append(sent, c.Op+fmt.Sprint(c.Args))
	}
	if strings.Join(sent, ",") != "ui.click"+fmt.Sprint(map[string]any{"element": "OK"})+",ui.hover"+fmt.Sprint(map[string]any{"element": "Menu"})+",snapshot"+fmt.Sprint(map[string]any{}) {
		t.Fatalf("a was sent %v", sent)
	}

	// expose eager on a profile entry: every operation a tool of its own.
	before := len(models.requests())
	models.rounds = []agent.ModelResponse{{Text: "done"}}
	ex = runDocAs(t, execs, `{"version":1,"connections":{"a":{"profile":"browser@^1","expose":"eager"}},`+model, "web")
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("execution %s %+v", ex.Status, ex.Error)
	}
	if got := toolList(models.requests()[before]); got != "a_navigate,a_navigate_back,a_ui_click,a_ui_fill,a_ui_hover,a_ui_press,a_ui_select,a_snapshot" {
		t.Fatalf("eager tools = %s", got)
	}

	// Two connections under one profile.
	before = len(models.requests())
	models.rounds = []agent.ModelResponse{{ToolCalls: []agent.ModelToolCall{
		toolCall("1", "ui_click", `{"target":"b","element":"OK"}`),
		toolCall("2", "connection_call", `{"target":"a","op":"ui.hover","args":{"element":"Menu"}}`),
		toolCall("3", "connection_call", `{"target":"plain","op":"x"}`),
		toolCall("4", "connection_ops", `{"target":"b","query":"snapshot"}`),
	}}, {Text: "done"}}
	ex = runDocAs(t, execs, `{"version":1,"connections":{"a":{"profile":"browser@^1"},"b":{"profile":"browser@^1.0"},"plain":{}},`+model, "web")
	if ex.Status != harness.ExecSucceeded {
		t.Fatalf("execution %s %+v", ex.Status, ex.Error)
	}
	req := models.requests()[before]
	if got := toolList(req); got != "navigate,ui_click,ui_fill,ui_press,plain_x,connection_ops,connection_call" {
		t.Fatalf("tools = %s", got)
	}
	var schema struct {
		Properties map[string]struct{ Enum []string } `json:"properties"`
	}
	must(t, json.Unmarshal(req.Tools[1].InputSchema, &schema))
	must(t, json.Unmarshal(req.Tools[6].InputSchema, &schema))
	if fmt.Sprint(schema.Properties["target"].Enum) != "[a b]" {
		t.Fatalf("connection_call targets = %v", schema.Properties["target"].Enum)
	}
	if calls := b.Calls(); len(calls) != 1 || calls[0].Op != "ui.click" || calls[0].Args["target"] != nil {
		t.Fatalf("b was sent %+v", calls)
	}
	if calls := a.Calls(); calls[len(calls)-1].Op != "ui.hover" {
		t.Fatalf("a was sent %+v", calls)
	}
	results := models.requests()[before+1].Messages[2].ToolResults
	if !results[2].IsError || !strings.Contains(results[2].Content, "plain") {
		t.Fatalf("a call of an eager connection through connection_call was answered %+v", results[2])
	}
	if !strings.Contains(results[3].Content, `"target":"b","name":"snapshot"`) || !strings.Contains(results[3].Content, `"total":1`) {
		t.Fatalf("listing = %s", results[3].Content)
	}
}
