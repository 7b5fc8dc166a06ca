package config_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
)

func TestLoadGitHubApp(t *testing.T) {
	t.Parallel()
	k, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}))
	const api = `openapi: { url: "https://api.github.com/openapi.json" }`
	const app = `appId: "${env:APP_ID}", privateKey: "${secret:gh-app-key}"`
	tests := []struct {
		name  string
		conn  string // the YAML of connections.r
		env   env
		check func(t *testing.T, g *config.GitHubApp)
		wants []want
	}{
		{
			name: "literal scope",
			conn: `{ ` + api + `, auth: { githubApp: { ` + app + `, owner: acme, repo: widgets, permissions: { issues: write } } } }`,
			check: func(t *testing.T, g *config.GitHubApp) {
				d := g.DiscoveryScope()
				if g.AppID != "123" || g.PrivateKey != "${secret:gh-app-key}" || g.HasExpr() || g.Owner.Literal != "acme" || g.Permissions["issues"] != "write" ||
					d.Owner != "acme" || d.Repo != "widgets" || len(d.Permissions) != 1 || d.Permissions["metadata"] != "read" {
					t.Errorf("githubApp = %+v discovery = %+v", g, d)
				}
			},
		},
		{
			name: "expressions",
			conn: `{ ` + api + `, requiresPrincipal: true, auth: { githubApp: { ` + app + `, apiBaseUrl: "https://ghe.example.com/api/v3",
				owner: { $expr: "principal + '-org'" }, repo: widgets, permissions: { $expr: "{issues: 'write'}" },
				discovery: { owner: acme, repo: widgets, permissions: { metadata: read } } } } }`,
			check: func(t *testing.T, g *config.GitHubApp) {
				if !g.HasExpr() || g.Owner.Expr != "principal + '-org'" || g.Permissions.Expr() == "" || g.DiscoveryScope().Owner != "acme" {
					t.Errorf("githubApp = %+v", g)
				}
			},
		},
		{name: "literal key", conn: `{ ` + api + `, auth: { githubApp: { appId: "1", privateKey: "${env:PEM}", owner: a, repo: b, permissions: { contents: read } } } }`, env: env{"PEM": pemKey}},
		{
			name:  "bad literal key",
			conn:  `{ ` + api + `, auth: { githubApp: { appId: "1", privateKey: "sekrit-1", owner: a, repo: b, permissions: { contents: read } } } }`,
			wants: []want{{"connections.r.auth.githubApp.privateKey", "invalid_key"}},
		},
		{
			name: "missing fields",
			conn: `{ ` + api + `, auth: { githubApp: { owner: "a/b", repo: "" } } }`,
			wants: []want{
				{"connections.r.auth.githubApp.appId", "is required"},
				{"connections.r.auth.githubApp.owner", "GitHub account or repository name"},
				{"connections.r.auth.githubApp.permissions", "every permission the installation has"},
				{"connections.r.auth.githubApp.privateKey", "is required"},
				{"connections.r.auth.githubApp.repo", "is required"},
			},
		},
		{
			name:  "bad level and base URL",
			conn:  `{ ` + api + `, auth: { githubApp: { ` + app + `, apiBaseUrl: "ftp://x", owner: a, repo: b, permissions: { issues: all } } } }`,
			wants: []want{{"connections.r.auth.githubApp.apiBaseUrl", "http or https URL"}, {"connections.r.auth.githubApp.permissions.issues", "read, write or admin"}},
		},
		{
			name: "expression without requiresPrincipal or discovery",
			conn: `{ ` + api + `, auth: { githubApp: { ` + app + `, owner: { $expr: principal }, repo: b, permissions: { issues: read } } } }`,
			wants: []want{
				{"connections.r.auth.githubApp", "requiresPrincipal: true"},
				{"connections.r.auth.githubApp.discovery", "is required"},
			},
		},
		{
			name: "bad expressions",
			conn: `{ ` + api + `, requiresPrincipal: true, auth: { githubApp: { ` + app + `, owner: { $expr: "1 +" }, repo: { $expr: "42" }, permissions: { $expr: "x", issues: read }, discovery: { owner: a, repo: b, permissions: { metadata: read } } } } }`,
			wants: []want{
				{"connections.r.auth.githubApp.owner.$expr", "not a valid string expression"},
				{"connections.r.auth.githubApp.permissions", "not both"},
				{"connections.r.auth.githubApp.repo.$expr", "not a valid string expression"},
			},
		},
		{
			name:  "discovery without permissions",
			conn:  `{ ` + api + `, auth: { githubApp: { ` + app + `, owner: a, repo: b, permissions: { issues: read }, discovery: { owner: a, repo: b } } } }`,
			wants: []want{{"connections.r.auth.githubApp.discovery.permissions", "is required"}},
		},
		{
			name:  "with oauth and perUser",
			conn:  `{ ` + api + `, auth: { oauth: {}, perUser: true, githubApp: { ` + app + `, owner: a, repo: b, permissions: { issues: read } } } }`,
			wants: []want{{"connections.r.auth", "both oauth and githubApp"}, {"connections.r.auth.perUser", "oauth only"}},
		},
		{
			name:  "stdio",
			conn:  `{ mcp: { command: x }, auth: { githubApp: { ` + app + `, owner: a, repo: b, permissions: { issues: read } } } }`,
			wants: []want{{"connections.r.auth", "not allowed for a stdio server"}},
		},
		{
			name:  "with an Authorization header",
			conn:  `{ mcp: { url: "https://h/mcp", headers: { Authorization: x } }, auth: { githubApp: { ` + app + `, owner: a, repo: b, permissions: { issues: read } } } }`,
			wants: []want{{"connections.r.auth", "cannot be combined with an Authorization header"}},
		},
		{
			name:  "on a drive",
			conn:  `{ drive: {}, auth: { githubApp: { ` + app + `, owner: a, repo: b, permissions: { issues: read } } } }`,
			wants: []want{{"connections.r.auth", "exactly one of oauth and serviceAccount"}, {"connections.r.auth.githubApp", "not supported on a drive"}},
		},
		{
			name:  "beside a service account",
			conn:  `{ ` + api + `, auth: { serviceAccount: { key: "${secret:k}" }, githubApp: { ` + app + `, owner: a, repo: b, permissions: { issues: read } } } }`,
			wants: []want{{"connections.r.auth.serviceAccount", "only supported on a drive"}},
		},
		{
			name:  "unknown field",
			conn:  `{ ` + api + `, auth: { githubApp: { ` + app + `, owner: a, repo: b, permissions: { issues: read }, installationId: 4 } } }`,
			wants: []want{{"connections.r.auth.githubApp.installationId", "unknown field"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := env{"PATCHBAY_CONFIG": "f", "APP_ID": "123"}
			for k, v := range tt.env {
				e[k] = v
			}
			c, err := load(e, files{"f": "connections:\n  r: " + tt.conn + "\n"})
			checkProblems(t, err, tt.wants...)
			if err != nil && (strings.Contains(err.Error(), "sekrit-1") || strings.Contains(err.Error(), "PRIVATE KEY")) {
				t.Errorf("error quotes a secret:\n%v", err)
			}
			if err == nil && tt.check != nil {
				tt.check(t, c.File.Connections["r"].Auth.GitHubApp)
			}
		})
	}
}

// CheckSource: a provider entry's App names which App on which GitHub,
// and no scope, which the provider's code chooses per token.
func TestGitHubAppCheckSource(t *testing.T) {
	t.Parallel()
	const path = "connections.tool.auth.githubApp"
	tests := []struct {
		name string
		app  config.GitHubApp
		want []string // problem paths
	}{
		{name: "the App only", app: config.GitHubApp{AppID: "1", PrivateKey: "${secret:k}", APIBaseURL: "https://ghe.example.com/api/v3"}},
		{
			name: "a scope too",
			app: config.GitHubApp{AppID: "1", PrivateKey: "${secret:k}", Owner: config.ScopeString{Literal: "acme"},
				Repo: config.ScopeString{Expr: "'w'"}, Permissions: config.Permissions{"issues": "write"},
				Discovery: &config.GitHubAppScope{Owner: "acme", Repo: "w", Permissions: map[string]string{"metadata": "read"}}},
			want: []string{path + ".discovery", path + ".owner", path + ".permissions", path + ".repo"},
		},
		{
			name: "no App",
			app:  config.GitHubApp{PrivateKey: "", APIBaseURL: "ftp://x"},
			want: []string{path + ".apiBaseUrl", path + ".appId", path + ".privateKey"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.app.CheckSource(path)
			var got []string
			if ve, ok := err.(*config.ValidationError); ok {
				for _, p := range ve.Problems {
					got = append(got, p.Path)
				}
			} else if err != nil {
				t.Fatalf("err = %v", err)
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("problems at %v, want %v (%v)", got, tt.want, err)
			}
		})
	}
}
