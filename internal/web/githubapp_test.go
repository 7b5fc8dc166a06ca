package web_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// The connection page of a connection authenticated by a GitHub App names
// the App, its GitHub and the scope as configured (for a provider, that
// its code names each token's scope), and nothing of a key or a token;
// other connections have no GitHub App panel.
func TestGitHubAppConnectionPage(t *testing.T) {
	t.Parallel()
	b := setupConns(t, nil, func(reg *registry.Registry) {
		must(t, reg.Add("gh", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "issues/create"}})))
		must(t, reg.SetKind("gh", "openapi", "https://api.github.com/openapi.json"))
		must(t, reg.SetAccess("gh", registry.Access{RequiresPrincipal: true, GitHubApp: &registry.GitHubAppAuth{
			AppID: "4242", APIBaseURL: "https://ghe.example.com/api/v3",
			OwnerExpr: "principal + '-org'", Repo: "widgets", Permissions: map[string]string{"issues": "write", "contents": "read"},
			Discovery: &registry.GitHubAppScope{Owner: "acme", Repo: "widgets", Permissions: map[string]string{"metadata": "read"}},
		}}))
		must(t, reg.Add("repos", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "brief"}})))
		must(t, reg.SetAccess("repos", registry.Access{GitHubApp: &registry.GitHubAppAuth{AppID: "4242", APIBaseURL: "https://api.github.com"}}))
	})
	c := signIn(t, b)
	tests := []struct {
		conn  string
		wants map[string]string
	}{
		{"gh", map[string]string{
			"#githubapp-id":          "4242",
			"#githubapp-api":         "https://ghe.example.com/api/v3",
			"#githubapp-owner":       "$expr: principal + '-org'",
			"#githubapp-repo":        "widgets",
			"#githubapp-permissions": "contents: read, issues: write",
			"#githubapp-discovery":   "acme/widgets · metadata: read",
			"#githubapp-scope":       "",
		}},
		{"repos", map[string]string{
			"#githubapp-id":    "4242",
			"#githubapp-api":   "https://api.github.com",
			"#githubapp-scope": "named by the provider's code for each token it asks for",
			"#githubapp-owner": "",
		}},
	}
	for _, tt := range tests {
		p := c.get("/admin/connections/" + tt.conn)
		if p.status != http.StatusOK {
			t.Fatalf("%s: %d", tt.conn, p.status)
		}
		for sel, want := range tt.wants {
			if got := text(p.doc.Find(sel)); got != want {
				t.Errorf("%s: %s = %q, want %q", tt.conn, sel, got, want)
			}
		}
		if panel := text(p.doc.Find("#githubapp")); strings.Contains(panel, "PRIVATE KEY") || strings.Contains(panel, "ghs_") {
			t.Errorf("%s: the panel shows a secret: %s", tt.conn, panel)
		}
	}
	if p := c.get("/admin/connections/mem"); p.doc.Find("#githubapp").Length() != 0 {
		t.Error("the memory connection shows a GitHub App panel")
	}
}
