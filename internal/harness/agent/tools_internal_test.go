package agent

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

func TestBuildToolSet(t *testing.T) {
	t.Parallel()
	op := func(name string) connect.Operation {
		return connect.Operation{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)}
	}
	turn := []ToolSource{
		{Name: "ui", Ops: []connect.Operation{op("tap"), op("tap.x"), op("tap_x")}},
		{Name: "x", Ops: []connect.Operation{op("ui.press"), op("home")}},
		{Name: "y", Ops: []connect.Operation{op("ui.press")}},
		{Name: "step", Ops: []connect.Operation{op("find")}, Step: true},
	}
	tests := []struct {
		name     string
		picks    []document.ToolPick
		hasPicks bool
		want     string // name:targets, in order
	}{
		{"default skips step servers", nil, false, "ui_tap:ui,ui_tap_x_2:ui,ui_tap_x:ui,ui_press:x|y,x_home:x"},
		{"picks narrow and keep names", []document.ToolPick{{Connection: "y"}, {Connection: "step"}}, true, "ui_press:y,step_find:step"},
		{"ops globs", []document.ToolPick{{Connection: "x", Ops: []string{"ho*"}}}, true, "x_home:x"},
		{"empty tools offer nothing", nil, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, err := BuildToolSet(turn, tt.picks, tt.hasPicks)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, tool := range ts.Tools {
				got = append(got, tool.Name+":"+strings.Join(tool.Targets, "|"))
			}
			if strings.Join(got, ",") != tt.want {
				t.Fatalf("tools = %s\nwant    %s", strings.Join(got, ","), tt.want)
			}
		})
	}
}

// Two connections whose operations come out under one tool id fail the
// tool set with an error naming both, whatever the picks: neither is
// suffixed nor overwritten.
func TestBuildToolSetRefusesCollisions(t *testing.T) {
	t.Parallel()
	op := func(name string, schema string) connect.Operation {
		return connect.Operation{Name: name, InputSchema: json.RawMessage(schema)}
	}
	obj := `{"type":"object"}`
	tests := []struct {
		name string
		turn []ToolSource
		want []string
	}{
		{
			name: "prefix meets name",
			turn: []ToolSource{{Name: "a", Ops: []connect.Operation{op("b_c", obj)}}, {Name: "a_b", Ops: []connect.Operation{op("c", obj)}}},
			want: []string{`"a_b_c"`, "connection a operation b_c", "connection a_b operation c"},
		},
		{
			name: "reduced ids meet",
			turn: []ToolSource{{Name: "gh", Ops: []connect.Operation{op("issues/list", obj)}}, {Name: "gh_issues", Ops: []connect.Operation{op("list", obj)}}},
			want: []string{`"gh_issues_list"`, "connection gh operation issues/list", "connection gh_issues operation list"},
		},
		{
			name: "merged tool meets a connection's",
			turn: []ToolSource{
				{Name: "ui", Ops: []connect.Operation{op("tap", obj)}},
				{Name: "x", Ops: []connect.Operation{op("ui.tap", obj)}},
				{Name: "y", Ops: []connect.Operation{op("ui.tap", obj)}},
			},
			want: []string{`"ui_tap"`, "connection ui operation tap", "operation ui.tap merged across connections x, y"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for _, picks := range [][]document.ToolPick{nil, {{Connection: tt.turn[0].Name}}} {
				_, err := BuildToolSet(tt.turn, picks, picks != nil)
				var he *fault.Error
				if !errors.As(err, &he) || he.Code != document.CodeToolIDCollision {
					t.Fatalf("picks %v: err = %v, want %s", picks, err, document.CodeToolIDCollision)
				}
				for _, w := range tt.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("picks %v: %q does not say %q", picks, err, w)
					}
				}
			}
		})
	}
}
