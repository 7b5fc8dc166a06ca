package npmtest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

var localRef = regexp.MustCompile(`"#/components/([^/"]+)/([^/"]+)"`)

// TrimDocument writes a copy of the JSON OpenAPI document at src with only
// the given paths and the components they reach (through refs, to any
// depth), and returns its path. Prism takes about 15 s and 300 MB to start
// on GitHub's whole 13 MB description, a second or two on a trimmed copy.
func TrimDocument(t testing.TB, src string, paths ...string) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", src, err)
	}
	all, _ := doc["paths"].(map[string]any)
	kept := map[string]any{}
	for _, p := range paths {
		if all[p] == nil {
			t.Fatalf("%s has no path %s", src, p)
		}
		kept[p] = all[p]
	}
	components, _ := doc["components"].(map[string]any)
	trimmed := reachedComponents(t, kept, components)
	// Security schemes are named by operations, not reached through refs.
	if s, ok := components["securitySchemes"]; ok {
		trimmed["securitySchemes"] = s
	}
	// Webhooks and vendor extensions go: they reach what was left out.
	out, err := json.Marshal(map[string]any{
		"openapi": doc["openapi"], "info": doc["info"], "servers": doc["servers"],
		"paths": kept, "components": trimmed,
	})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "trimmed-"+filepath.Base(src))
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s trimmed to %d paths, %d KiB", filepath.Base(src), len(kept), len(out)>>10)
	return path
}

// reachedComponents returns the components (kind → name → definition)
// that from refers to, directly or through other components.
func reachedComponents(t testing.TB, from any, components map[string]any) map[string]any {
	reached := map[string]map[string]any{}
	queue := []any{from}
	for len(queue) > 0 {
		raw, err := json.Marshal(queue[0])
		if err != nil {
			t.Fatal(err)
		}
		queue = queue[1:]
		for _, m := range localRef.FindAllStringSubmatch(string(raw), -1) {
			kind, name := m[1], m[2]
			if reached[kind] == nil {
				reached[kind] = map[string]any{}
			}
			if _, ok := reached[kind][name]; ok {
				continue
			}
			of, _ := components[kind].(map[string]any)
			reached[kind][name] = of[name]
			queue = append(queue, of[name])
		}
	}
	out := map[string]any{}
	for kind, names := range reached {
		out[kind] = names
	}
	return out
}
