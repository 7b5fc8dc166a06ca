package mcp

import (
	"reflect"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

func TestToolIDs(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 200)
	tests := []struct {
		name  string
		tools []string
		want  map[string]string
	}{
		{"valid names keep their ids", []string{"echo", "get-sum"}, map[string]string{"echo": "gh_echo", "get-sum": "gh_get-sum"}},
		{"dots become underscores", []string{"admin.tools.list"}, map[string]string{"admin.tools.list": "gh_admin_tools_list"}},
		{"a reduced id colliding with a valid one is suffixed, the valid one stays",
			[]string{"a.b", "a_b"}, map[string]string{"a_b": "gh_a_b", "a.b": "gh_a_b_2"}},
		{"reduced ids colliding with each other", []string{"a.b", "a b", "a_b"},
			map[string]string{"a_b": "gh_a_b", "a b": "gh_a_b_2", "a.b": "gh_a_b_3"}},
		{"cut to 128", []string{long}, map[string]string{long: "gh_" + long[:125]}},
		{"cut ids that collide keep 128", []string{long, long + "b"}, map[string]string{long: "gh_" + long[:125], long + "b": "gh_" + long[:123] + "_2"}},
		{"non-ascii", []string{"héllo"}, map[string]string{"héllo": "gh_h_llo"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := ToolIDs("gh", tt.tools)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ToolIDs = %v, want %v", got, tt.want)
			}
			for _, id := range got {
				if len(id) > MaxToolIDLen {
					t.Errorf("id %q is %d long", id, len(id))
				}
			}
		})
	}
	// Adding a dotted tool never moves an existing one.
	before := ToolIDs("gh", []string{"a_b", "c"})
	after := ToolIDs("gh", []string{"a_b", "c", "a.b"})
	for k, v := range before {
		if after[k] != v {
			t.Errorf("adding a.b moved %s: %s → %s", k, v, after[k])
		}
	}
}

func TestModelTools(t *testing.T) {
	t.Parallel()
	ro := true
	m := connect.Manifest{Operations: []connect.Operation{
		{Name: "a.b", Description: "does b", Annotations: connect.Annotations{Title: "B", ReadOnlyHint: &ro}},
		{Name: "c"},
	}}
	got := ModelTools("gh", m)
	if len(got) != 2 || got[0].ID != "gh_a_b" || got[0].Operation != "a.b" || got[0].Description != "[gh] does b" ||
		got[0].Annotations.Title != "B" || got[0].Annotations.ReadOnlyHint == nil || got[1].Description != "[gh]" {
		t.Errorf("ModelTools = %+v", got)
	}
}

func TestSecrets(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec config.MCP
		want []string
	}{
		{"headers, userinfo and query", config.MCP{
			URL:     "https://bob:pa55word@mcp.example.com/mcp?token=tok123&x=1",
			Headers: map[string]string{"Authorization": "Bearer abc", "X-Org": "acme"},
		}, []string{"1", "Bearer abc", "acme", "bob", "pa55word", "tok123"}},
		{"stdio env skips short values and absolute paths", config.MCP{
			Command: "srv",
			Env:     map[string]string{"API_KEY": "sk-0123456789", "DEBUG": "true", "HOME_DIR": "/var/lib/srv/data", "REL": "relative/path/x"},
		}, []string{"relative/path/x", "sk-0123456789"}},
		{"nothing", config.MCP{Command: "srv"}, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Secrets(tt.spec)
			if len(got) == 0 && len(tt.want) == 0 {
				return
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Secrets = %q, want %q", got, tt.want)
			}
		})
	}
}
