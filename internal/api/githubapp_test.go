package api_test

import (
	"testing"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// A connection's status names the GitHub App its calls carry tokens of,
// as openapi.yaml describes it: an OpenAPI-like one with its configured
// scope, a provider one with the App alone.
func TestConnectionStatusGitHubApp(t *testing.T) {
	t.Parallel()
	for name, app := range map[string]*registry.GitHubAppAuth{
		"scoped": {AppID: "4242", APIBaseURL: "https://api.github.com", OwnerExpr: "principal + '-org'", Repo: "widgets",
			Permissions: map[string]string{"issues": "write"},
			Discovery:   &registry.GitHubAppScope{Owner: "acme", Repo: "widgets", Permissions: map[string]string{"metadata": "read"}}},
		"provider": {AppID: "4242", APIBaseURL: "https://ghe.example.com/api/v3"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(o *api.Options) { must(t, o.Registry.SetAccess("mem", registry.Access{GitHubApp: app})) })
			r := b.do(t, "GET", "/v1/connections/mem", "", "")
			got, _ := r.json(t)["githubApp"].(map[string]any)
			if r.status != 200 || got["appId"] != "4242" || got["apiBaseUrl"] != app.APIBaseURL || (got["discovery"] != nil) != (app.Discovery != nil) {
				t.Fatalf("GET = %d %s", r.status, r.body)
			}
		})
	}
}
