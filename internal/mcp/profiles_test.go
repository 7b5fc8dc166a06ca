package mcp

import (
	"strings"
	"testing"
)

func TestDeclaredProfiles(t *testing.T) {
	cases := []struct {
		name string
		exp  map[string]any
		want map[string]string
		err  string
	}{
		{"none", nil, nil, ""},
		{"other capabilities only", map[string]any{"x.y/z": true}, nil, ""},
		{"chat", map[string]any{"io.patchbay/profiles": map[string]any{"chat": "1.0.0"}}, map[string]string{"chat": "1.0.0"}, ""},
		{"not a map", map[string]any{"io.patchbay/profiles": []any{"chat"}}, nil, "must map profile names to versions"},
		{"version not a string", map[string]any{"io.patchbay/profiles": map[string]any{"chat": 1}}, nil, "profile chat must have a version string"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := declaredProfiles(tc.exp)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) || got["chat"] != tc.want["chat"] {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
