package openapi

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// githubOpenAPI pins GitHub's own OpenAPI description (npm
// @octokit/openapi), a real document of 1,000+ operations nobody here
// wrote.
const githubOpenAPI = "@octokit/openapi@23.0.2"

// TestGitHubDocument loads GitHub's description whole and with include,
// and logs the load time and heap growth of each.
func TestGitHubDocument(t *testing.T) {
	dir := npmtest.Require(t, "octokit-openapi", githubOpenAPI)
	path := filepath.Join(dir, "generated", "api.github.com.json")
	tests := []struct {
		name    string
		include []string
		check   func(t *testing.T, c connect.Conn)
	}{
		{
			name: "whole",
			check: func(t *testing.T, c connect.Conn) {
				if n := len(c.Manifest().Operations); n < 1000 {
					t.Fatalf("%d operations", n)
				}
				if _, ok := c.Info()["warning"]; !ok {
					t.Fatal("no warning for 1,000+ operations without include")
				}
				// The default budgets admit the whole description: no
				// operation's refs are inlined less deep than 3 levels.
				if r, ok := c.Info()["schemasReduced"]; ok {
					t.Fatalf("the default budget reduced schemas: %v", r)
				}
				var maxNodes, maxBytes, manifest int64
				for _, op := range c.Manifest().Operations {
					var v any
					if err := json.Unmarshal(op.InputSchema, &v); err != nil {
						t.Fatal(err)
					}
					maxNodes, maxBytes = max(maxNodes, measure(v)), max(maxBytes, int64(len(op.InputSchema)))
					manifest += int64(len(op.Name) + len(op.HTTP.Path) + len(op.Description) + len(op.Annotations.Title) + len(op.InputSchema))
				}
				t.Logf("largest input schema %d values (maxSchemaNodes %d), %d bytes (maxSchemaBytes %d); all operations %d bytes (maxManifestBytes %d)",
					maxNodes, DefaultMaxSchemaNodes, maxBytes, DefaultMaxSchemaBytes, manifest, DefaultMaxManifestBytes)
				// Gate 2 compiles an operation's schema at its first call:
				// every one of a real document's must compile.
				for _, op := range c.Manifest().Operations {
					doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(op.InputSchema))
					if err != nil {
						t.Fatalf("%s: %v", op.Name, err)
					}
					comp := jsonschema.NewCompiler()
					if err := comp.AddResource("mem://"+op.Name, doc); err != nil {
						t.Fatalf("%s: %v", op.Name, err)
					}
					if _, err := comp.Compile("mem://" + op.Name); err != nil {
						t.Errorf("the schema of %s does not compile: %v", op.Name, err)
					}
				}
			},
		},
		{
			name:    "include",
			include: []string{"issues", "pulls/get"},
			check: func(t *testing.T, c connect.Conn) {
				m := c.Manifest()
				var names []string
				for _, op := range m.Operations {
					names = append(names, op.Name)
				}
				ids := connect.ToolIDs("github", names)
				if ids["issues/list-for-repo"] != "github_issues_list-for-repo" || ids["pulls/get"] != "github_pulls_get" {
					t.Fatalf("ids = %v", ids)
				}
				if _, ok := c.Info()["warning"]; ok || len(names) < 20 || len(names) > 100 {
					t.Fatalf("%d operations, info %v", len(names), c.Info())
				}
				op, _ := m.Operation("issues/create")
				var schema struct {
					Properties map[string]any `json:"properties"`
					Required   []string       `json:"required"`
				}
				if err := json.Unmarshal(op.InputSchema, &schema); err != nil {
					t.Fatal(err)
				}
				for _, p := range []string{"owner", "repo", "title", "labels"} {
					if _, ok := schema.Properties[p]; !ok {
						t.Fatalf("issues/create has no %s: %s", p, op.InputSchema)
					}
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			// Under -race on a busy machine the load takes minutes; what
			// this test checks is what loads, not how fast (see
			// BenchmarkGitHubLoad), so the load timeout is out of the way.
			spec := config.OpenAPI{URL: path, Include: config.IncludeNames(tt.include...), TimeoutMs: int((30 * time.Minute).Milliseconds())}
			c, err := New("github", spec, nil).Connect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			t.Logf("%s: %d operations in %s, %.0f MiB allocated, heap %.0f MiB after", tt.name,
				len(c.Manifest().Operations), took, float64(after.TotalAlloc-before.TotalAlloc)/(1<<20), float64(after.HeapAlloc)/(1<<20))
			tt.check(t, c)
		})
	}
}
