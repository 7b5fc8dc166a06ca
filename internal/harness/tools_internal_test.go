package harness

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBuildToolSet(t *testing.T) {
	t.Parallel()
	op := func(name string) Operation {
		return Operation{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)}
	}
	turn := []toolSource{
		{Name: "ui", Ops: []Operation{op("tap")}},
		{Name: "x", Ops: []Operation{op("ui.tap"), op("home")}},
		{Name: "y", Ops: []Operation{op("ui.tap")}},
		{Name: "a", Ops: []Operation{op("b_c")}},
		{Name: "a_b", Ops: []Operation{op("c")}},
		{Name: "step", Ops: []Operation{op("find")}, Step: true},
	}
	tests := []struct {
		name     string
		picks    []toolPick
		hasPicks bool
		want     string // name:targets, in order
	}{
		{"default skips step servers", nil, false, "ui_tap:ui,ui_tap_2:x|y,x_home:x,a_b_c:a,a_b_c_2:a_b"},
		{"picks narrow and keep names", []toolPick{{Connection: "y"}, {Connection: "step"}}, true, "ui_tap_2:y,step_find:step"},
		{"ops globs", []toolPick{{Connection: "x", Ops: []string{"ho*"}}}, true, "x_home:x"},
		{"empty tools offer nothing", nil, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := buildToolSet(turn, tt.picks, tt.hasPicks)
			var got []string
			for _, tool := range ts.tools {
				got = append(got, tool.Name+":"+strings.Join(tool.Targets, "|"))
			}
			if strings.Join(got, ",") != tt.want {
				t.Fatalf("tools = %s\nwant    %s", strings.Join(got, ","), tt.want)
			}
		})
	}
}
