package config_test

import (
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
)

func TestLoadMCPOAuth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		env   env
		file  string
		wants []want
		check func(t *testing.T, c *config.Config)
	}{
		{
			name: "JWTs with principals and a default",
			env:  env{"PATCHBAY_PUBLIC_URL": "https://patchbay.example.com/"},
			file: `mcp:
  oauth:
    issuer: https://auth.example.com
    scopes: [mcp:tools]
    principals:
      "248289761001": {name: alice, allowlist: ops, roles: [run, read]}
      "auth0|42": {allowlist: dev}
    default: {allowlist: guests}
`,
			check: func(t *testing.T, c *config.Config) {
				o := c.File.MCP.OAuth
				if o == nil || o.Issuer != "https://auth.example.com" || o.Principals["248289761001"].Name != "alice" || o.Principals["auth0|42"].Allowlist != "dev" || o.Default.Allowlist != "guests" {
					t.Fatalf("mcp.oauth = %+v", o)
				}
				if got := c.MCPResource(); got != "https://patchbay.example.com/mcp" {
					t.Errorf("MCPResource = %s", got)
				}
			},
		},
		{
			name: "introspection with credentials from the environment, on loopback",
			env:  env{"INTROSPECT_SECRET": "s3cret"},
			file: `mcp:
  oauth:
    issuer: "http://localhost:3001/"
    introspectionUrl: http://localhost:3001/introspect
    clientId: patchbay
    clientSecret: "${env:INTROSPECT_SECRET}"
    claim: client_id
    audience: api://patchbay
    principals: {"3f6c…": {allowlist: default}}
`,
			check: func(t *testing.T, c *config.Config) {
				o := c.File.MCP.OAuth
				if o.ClientSecret != "s3cret" || o.Claim != "client_id" || o.Audience != "api://patchbay" {
					t.Fatalf("mcp.oauth = %+v", o)
				}
				if got := c.MCPResource(); got != "http://127.0.0.1:8080/mcp" {
					t.Errorf("MCPResource without PATCHBAY_PUBLIC_URL = %s", got)
				}
			},
		},
		{
			name: "no mcp section",
			file: `name: x`,
			check: func(t *testing.T, c *config.Config) {
				if c.File.MCP.OAuth != nil {
					t.Errorf("mcp.oauth = %+v", c.File.MCP.OAuth)
				}
			},
		},
		{
			name: "bad entries",
			file: `mcp:
  oauth:
    issuer: http://auth.example.com
    jwksUrl: ftp://auth.example.com/jwks
    clientSecret: x
    claim: aud
    scopes: ["two words"]
    principals:
      alice: {name: admin, allowlist: "9ops", roles: [Boss]}
      bob: {}
    default: {name: everyone, allowlist: guests}
`,
			wants: []want{
				{"mcp.oauth.claim", "says nothing about who the caller is"},
				{"mcp.oauth.clientSecret", "introspectionUrl, which is not set"},
				{"mcp.oauth.default.name", "is not allowed"},
				{"mcp.oauth.issuer", "https URL"},
				{"mcp.oauth.jwksUrl", "https URL"},
				{"mcp.oauth.principals.alice.allowlist", "allowlist name"},
				{"mcp.oauth.principals.alice.name", "reserved"},
				{"mcp.oauth.principals.alice.roles[0]", "not a role name"},
				{"mcp.oauth.principals.bob.allowlist", "is required"},
				{"mcp.oauth.scopes[0]", "scope name"},
			},
		},
		{
			name: "no issuer, no principal",
			file: `mcp: {oauth: {introspectionUrl: "https://auth.example.com/i?x=1", clientSecret: x}}`,
			wants: []want{
				{"mcp.oauth.clientSecret", "needs clientId"},
				{"mcp.oauth.introspectionUrl", "https URL"},
				{"mcp.oauth.issuer", "is required"},
				{"mcp.oauth.principals", "no token could be used"},
			},
		},
		{
			name:  "unknown field",
			file:  `mcp: {oauth: {issuer: "https://a.example", principals: {a: {allowlist: x}}, audiences: [x]}}`,
			wants: []want{{"mcp.oauth.audiences", "unknown field"}},
		},
		{
			name:  "an audience needs a reachable public URL",
			env:   env{"PATCHBAY_ADDR": ":8080"},
			file:  `mcp: {oauth: {issuer: "https://a.example", principals: {a: {allowlist: x}}}}`,
			wants: []want{{"PATCHBAY_PUBLIC_URL", "is required with mcp.oauth"}},
		},
		{
			name:  "an unset environment variable",
			file:  `mcp: {oauth: {issuer: "${env:ISSUER}", principals: {a: {allowlist: x}}}}`,
			wants: []want{{"mcp.oauth.issuer", "${env:ISSUER}"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := env{"PATCHBAY_CONFIG": "p.yaml"}
			for k, v := range tt.env {
				e[k] = v
			}
			c, err := load(e, files{"p.yaml": tt.file})
			checkProblems(t, err, tt.wants...)
			if err != nil && strings.Contains(err.Error(), "s3cret") {
				t.Errorf("a problem quotes the client secret: %v", err)
			}
			if tt.check != nil && err == nil {
				tt.check(t, c)
			}
		})
	}
}
