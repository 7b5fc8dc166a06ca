package harness

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// TestStatusReports: every connection reports its kind, URL and tool ids;
// one that failed to connect reports no tools and its error.
func TestStatusReports(t *testing.T) {
	t.Parallel()
	reg := registry.NewRegistry(nil)
	ok := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "issues/list"}}, connecttest.MemoryOp{Operation: connect.Operation{Name: "get"}})
	for name, p := range map[string]connect.Provider{"gh": ok, "down": failing{connectErr: errors.New("no document")}} {
		if err := reg.Add(name, p); err != nil {
			t.Fatal(err)
		}
		if err := reg.SetKind(name, "openapi", "https://example.com/"+name+".json"); err != nil {
			t.Fatal(err)
		}
	}
	_ = reg.Start(context.Background())
	t.Cleanup(func() { _ = reg.Close() })
	gh, _ := reg.Get("gh")
	if s := gh.Status(); s.Kind != "openapi" || s.URL != "https://example.com/gh.json" || !slices.Equal(s.Tools, []string{"gh_issues_list", "gh_get"}) {
		t.Fatalf("gh = %+v", s)
	}
	down, _ := reg.Get("down")
	if s := down.Status(); s.State != connect.StateUnavailable || s.Tools == nil || len(s.Tools) != 0 || s.LastError == "" {
		t.Fatalf("down = %+v", s)
	}
	if err := reg.SetKind("nope", "mcp", ""); codeOf(err) != fault.CodeConnectionUnknown {
		t.Fatalf("SetKind(nope) = %v", err)
	}
}
