package openapi

import (
	"context"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
)

// BenchmarkSelectorMatch: what an include entry costs per operation of
// the document at load (GitHub's has 1,000+), a name against an
// expression run in the sandbox.
func BenchmarkSelectorMatch(b *testing.B) {
	tags := []string{"issues"}
	for _, tt := range []struct {
		name    string
		include []config.Include
	}{
		{"name", config.IncludeNames("issues/list-for-repo")},
		{"expression", []config.Include{config.IncludeExpr(`method == 'GET' && 'issues' in tags && path startsWith '/repos/'`)}},
	} {
		b.Run(tt.name, func(b *testing.B) {
			sel, err := newSelector(tt.include)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			for b.Loop() {
				if ok, err := sel.match(ctx, "issues/list-for-repo", "GET", "/repos/{owner}/{repo}/issues", tags); err != nil || !ok {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
