package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

func browserProfile(t testing.TB) *profiles.Profile {
	t.Helper()
	p, ok := registry.BuiltinProfiles().Match("browser", nil)
	if !ok {
		t.Fatal("browser@1 is not built in")
	}
	return p
}

// toolNames lists a tool set as name:targets, in order.
func toolNames(ts *ToolSet) string {
	var got []string
	for _, tool := range ts.Tools {
		targets := tool.Targets
		if tool.Pair != nil {
			targets = tool.Pair.Targets
		}
		got = append(got, tool.Name+":"+strings.Join(targets, "|"))
	}
	return strings.Join(got, ",")
}

func TestBuildToolSetExposure(t *testing.T) {
	t.Parallel()
	op := func(name, schema string) connect.Operation {
		return connect.Operation{Name: name, InputSchema: json.RawMessage(schema)}
	}
	obj := `{"type":"object"}`
	browser := browserProfile(t)
	click := string(browser.Operations["ui.click"].Input)
	// A declaring server may take more than the profile does: its schema
	// differs, yet it is the same profile operation.
	clickMore := `{"type":"object","required":["element"],"properties":{"element":{"type":"string"},"button":{"type":"string"}}}`
	web := func(name, clickSchema string) ToolSource {
		return ToolSource{Name: name, Expose: document.ExposeProfile, Profile: browser, Ops: []connect.Operation{
			op("navigate", string(browser.Operations["navigate"].Input)), op("ui.click", clickSchema),
			op("ui.hover", string(browser.Operations["ui.hover"].Input)), op("snapshot", obj)}}
	}
	tests := []struct {
		name     string
		turn     []ToolSource
		picks    []document.ToolPick
		hasPicks bool
		want     string
	}{
		{"call connection gets a pair of its own",
			[]ToolSource{{Name: "big", Expose: document.ExposeCall, Ops: []connect.Operation{op("a", obj), op("b", obj)}}, {Name: "small", Ops: []connect.Operation{op("x", obj)}}},
			nil, false, "small_x:small,big_ops:big,big_call:big"},
		{"eager is as without expose",
			[]ToolSource{{Name: "big", Expose: document.ExposeEager, Ops: []connect.Operation{op("a", obj), op("b", obj)}}},
			nil, false, "big_a:big,big_b:big"},
		{"call connections share one pair",
			[]ToolSource{{Name: "a", Expose: document.ExposeCall, Ops: []connect.Operation{op("x", obj)}}, {Name: "b", Expose: document.ExposeCall, Ops: []connect.Operation{op("x", obj), op("y", obj)}}},
			nil, false, "connection_ops:a|b,connection_call:a|b"},
		{"a pick keeps the shared names and cuts the targets",
			[]ToolSource{{Name: "a", Expose: document.ExposeCall, Ops: []connect.Operation{op("x", obj)}}, {Name: "b", Expose: document.ExposeCall, Ops: []connect.Operation{op("y", obj)}}},
			[]document.ToolPick{{Connection: "b"}}, true, "connection_ops:b,connection_call:b"},
		{"ops globs that pick nothing called leave no pair",
			[]ToolSource{{Name: "a", Expose: document.ExposeCall, Ops: []connect.Operation{op("x", obj)}}},
			[]document.ToolPick{{Connection: "a", Ops: []string{"z*"}}}, true, ""},
		{"nothing granted, no pair",
			[]ToolSource{{Name: "a", Expose: document.ExposeCall}},
			nil, false, ""},
		{"profile: the eager set as tools, the rest through the pair",
			[]ToolSource{web("app", click)},
			nil, false, "app_navigate:app,app_ui_click:app,app_ops:app,app_call:app"},
		{"one profile on two connections: merged tools and a shared pair",
			[]ToolSource{web("a", click), web("b", clickMore)},
			nil, false, "navigate:a|b,ui_click:a|b,connection_ops:a|b,connection_call:a|b"},
		{"the same schemas without a profile merge as before",
			[]ToolSource{{Name: "a", Ops: []connect.Operation{op("ui.click", click)}}, {Name: "b", Ops: []connect.Operation{op("ui.click", click)}}},
			nil, false, "ui_click:a|b"},
		{"other schemas without a profile do not merge",
			[]ToolSource{{Name: "a", Ops: []connect.Operation{op("ui.click", click)}}, {Name: "b", Ops: []connect.Operation{op("ui.click", clickMore)}}},
			nil, false, "a_ui_click:a,b_ui_click:b"},
		{"a profile connection and a call connection share the pair",
			[]ToolSource{web("a", click), {Name: "big", Expose: document.ExposeCall, Ops: []connect.Operation{op("navigate", obj)}}},
			nil, false, "a_navigate:a,a_ui_click:a,connection_ops:a|big,connection_call:a|big"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts, err := BuildToolSet(tt.turn, tt.picks, tt.hasPicks)
			if err != nil {
				t.Fatal(err)
			}
			if got := toolNames(ts); got != tt.want {
				t.Fatalf("tools = %s\nwant    %s", got, tt.want)
			}
		})
	}

	// The merged profile tool takes the profile's schema plus target.
	ts, err := BuildToolSet([]ToolSource{web("a", click), web("b", clickMore)}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]any `json:"properties"`
		Required   []string       `json:"required"`
	}
	if err := json.Unmarshal(ts.ByName["ui_click"].InputSchema, &schema); err != nil {
		t.Fatal(err)
	}
	if _, extra := schema.Properties["button"]; extra || schema.Properties["target"] == nil || strings.Join(schema.Required, ",") != "element,target" {
		t.Fatalf("merged ui_click schema = %s", ts.ByName["ui_click"].InputSchema)
	}
}

// A pair's name that another tool already has is a collision, as two
// connections' tool ids are: here an operation "a_call" merged across b
// and c.
func TestPairNameCollides(t *testing.T) {
	t.Parallel()
	turn := []ToolSource{
		{Name: "a", Expose: document.ExposeCall, Ops: []connect.Operation{{Name: "x"}}},
		{Name: "b", Ops: []connect.Operation{{Name: "a_call"}}},
		{Name: "c", Ops: []connect.Operation{{Name: "a_call"}}},
	}
	_, err := BuildToolSet(turn, nil, false)
	var he *fault.Error
	if !errors.As(err, &he) || he.Code != document.CodeToolIDCollision || !strings.Contains(err.Error(), `"a_call"`) || !strings.Contains(err.Error(), "call tool of connection a") {
		t.Fatalf("err = %v, want a collision on a_call", err)
	}
}

// fiftyOps is a server's worth of operations: op00…op49, each with a
// description and a schema of a few fields, as real servers have.
func fiftyOps() []connect.Operation {
	ops := make([]connect.Operation, 50)
	for i := range ops {
		ops[i] = connect.Operation{Name: fmt.Sprintf("op%02d", i), Description: fmt.Sprintf("Does thing number %d to a record of the service.", i),
			InputSchema: json.RawMessage(`{"type":"object","required":["id"],"properties":{"id":{"type":"string","description":"The record."},"n":{"type":"integer","minimum":0},"note":{"type":"string"}}}`)}
	}
	return ops
}

func TestOpsListing(t *testing.T) {
	t.Parallel()
	ops := fiftyOps()
	ts, err := BuildToolSet([]ToolSource{{Name: "big", Expose: document.ExposeCall, Ops: ops}, {Name: "two", Expose: document.ExposeCall, Ops: ops[:2]}}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	pair := ts.ByName["connection_ops"].Pair
	tests := []struct {
		name  string
		args  string
		names string
		total int
		next  int // -1: no next page
	}{
		{"first page", `{}`, "big.op00,big.op01,big.op02,big.op03,big.op04,big.op05,big.op06,big.op07,big.op08,big.op09,big.op10,big.op11,big.op12,big.op13,big.op14,big.op15,big.op16,big.op17,big.op18,big.op19,big.op20,big.op21,big.op22,big.op23,big.op24", 52, 25},
		{"last page", `{"offset":50}`, "two.op00,two.op01", 52, -1},
		{"one target", `{"target":"two"}`, "two.op00,two.op01", 2, -1},
		{"query words", `{"query":"NUMBER 4"}`, "big.op04,big.op14,big.op24,big.op34,big.op40,big.op41,big.op42,big.op43,big.op44,big.op45,big.op46,big.op47,big.op48,big.op49", 14, -1},
		{"query by name", `{"query":"op01","target":"big"}`, "big.op01", 1, -1},
		{"past the end", `{"offset":99}`, "", 52, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var args map[string]any
			if err := json.Unmarshal([]byte(tt.args), &args); err != nil {
				t.Fatal(err)
			}
			page, err := pair.List(args)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range page.Operations {
				names = append(names, e.Target+"."+e.Name)
				if len(e.InputSchema) == 0 || !strings.Contains(e.Description, "Does thing") {
					t.Fatalf("entry %+v lacks its schema or description", e)
				}
			}
			next := -1
			if page.Next != nil {
				next = *page.Next
			}
			if strings.Join(names, ",") != tt.names || page.Total != tt.total || next != tt.next {
				t.Fatalf("page = %s total %d next %d\nwant   %s total %d next %d", strings.Join(names, ","), page.Total, next, tt.names, tt.total, tt.next)
			}
		})
	}
	for _, bad := range []string{`{"target":"nope"}`, `{"offset":-1}`, `{"offset":1.5}`, `{"query":3}`, `{"page":2}`} {
		var args map[string]any
		if err := json.Unmarshal([]byte(bad), &args); err != nil {
			t.Fatal(err)
		}
		var d *fault.Denied
		if _, err := pair.List(args); !errors.As(err, &d) {
			t.Errorf("list(%s) = %v, want a refusal", bad, err)
		}
	}
}

// A page stays under the byte budget even when the schemas are large.
func TestOpsPageBytes(t *testing.T) {
	t.Parallel()
	ops := fiftyOps()
	big := `{"type":"object","description":"` + strings.Repeat("x", 5000) + `"}`
	for i := range ops {
		ops[i].InputSchema = json.RawMessage(big)
	}
	ts, err := BuildToolSet([]ToolSource{{Name: "big", Expose: document.ExposeCall, Ops: ops}}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	page, err := ts.ByName["big_ops"].Pair.List(map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(MustJSON(page)); n > OpsPageBytes+1024 || len(page.Operations) < 2 || page.Next == nil || *page.Next != len(page.Operations) {
		t.Fatalf("page of %d operations is %d bytes, next %v", len(page.Operations), n, page.Next)
	}
}

func TestCallResolves(t *testing.T) {
	t.Parallel()
	browser := browserProfile(t)
	ops := fiftyOps()
	ts, err := BuildToolSet([]ToolSource{
		{Name: "big", Expose: document.ExposeCall, Ops: ops[:10]},
		{Name: "app", Expose: document.ExposeProfile, Profile: browser, Ops: []connect.Operation{{Name: "navigate", InputSchema: browser.Operations["navigate"].Input}, {Name: "snapshot"}}},
	}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args         string
		conn, op     string
		rest         string
		gate         int // 0: resolves
		errorMention string
	}{
		{`{"target":"big","op":"op03","args":{"id":"r1"}}`, "big", "op03", `{"id":"r1"}`, 0, ""},
		{`{"target":"app","op":"snapshot"}`, "app", "snapshot", `{}`, 0, ""},
		{`{"target":"big","op":"op42","args":{}}`, "", "", "", fault.GateDeclared, "connection_ops lists those it does"},
		{`{"target":"app","op":"navigate","args":{"url":"https://x.test"}}`, "", "", "", fault.GateDeclared, "a tool of its own, app_navigate"},
		{`{"target":"web","op":"op03"}`, "", "", "", fault.GateDeclared, "big, app"},
		{`{"op":"op03"}`, "", "", "", fault.GateDeclared, "(none)"},
		{`{"target":"big","op":"op03","args":"{\"id\":\"r1\"}"}`, "", "", "", fault.GateSchema, "args must be an object"},
		{`{"target":"big","op":"op03","id":"r1"}`, "", "", "", fault.GateSchema, "inside args"},
	}
	for _, tt := range tests {
		var args map[string]any
		if err := json.Unmarshal([]byte(tt.args), &args); err != nil {
			t.Fatal(err)
		}
		conn, op, rest, err := ts.Resolve("connection_call", args)
		if tt.gate == 0 {
			got, _ := json.Marshal(rest)
			if err != nil || conn != tt.conn || op != tt.op || string(got) != tt.rest {
				t.Errorf("%s: resolved %s %s %s, %v", tt.args, conn, op, got, err)
			}
			continue
		}
		var d *fault.Denied
		if !errors.As(err, &d) || d.Gate != tt.gate || !strings.Contains(d.Reason, tt.errorMention) {
			t.Errorf("%s: err = %v, want gate %d saying %q", tt.args, err, tt.gate, tt.errorMention)
		}
	}
	// _ops is answered by the harness, never resolved to a connection call.
	if _, _, _, err := ts.Resolve("connection_ops", map[string]any{}); err == nil {
		t.Fatal("connection_ops resolved to a call")
	}
}

// BenchmarkToolListBytes reports the size of the tool list a model is sent
// for a 50-operation server, eager and through _ops/_call.
func BenchmarkToolListBytes(b *testing.B) {
	ops := fiftyOps()
	for _, mode := range []string{document.ExposeEager, document.ExposeCall} {
		b.Run(mode, func(b *testing.B) {
			var size int
			for b.Loop() {
				ts, err := BuildToolSet([]ToolSource{{Name: "big", Expose: mode, Ops: ops}}, nil, false)
				if err != nil {
					b.Fatal(err)
				}
				size = len(MustJSON(ts.List()))
			}
			b.ReportMetric(float64(size), "list-bytes")
		})
	}
}
