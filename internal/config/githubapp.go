package config

import (
	"fmt"
	"maps"
	"net/url"
	"reflect"
	"slices"
	"strings"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/types"
	"gopkg.in/yaml.v3"

	"github.com/patchbay-dev/patchbay/internal/githubapp"
	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// GitHubApp is `auth: {githubApp: …}`: every call carries an installation
// token of a GitHub App, minted for one repository and the permissions
// given (see package githubapp). Owner, Repo and Permissions may be
// expressions over the call's principal, so each caller gets a token for
// its own org's installation; Discovery is the scope used with no
// principal (the document request, an MCP server's tools/list).
type GitHubApp struct {
	// AppID is the App's id (or client id).
	AppID string `yaml:"appId"`
	// PrivateKey is the App's key: ${secret:NAME}, resolved from the
	// secret chain on first use, or the PEM itself (parsed at load).
	PrivateKey string `yaml:"privateKey" json:"-"`
	// APIBaseURL is the REST API root, https://<host>/api/v3 for GitHub
	// Enterprise Server; default https://api.github.com.
	APIBaseURL string `yaml:"apiBaseUrl"`
	// Owner is the account (user or organization) whose repository the
	// token is minted for: a name, or {$expr: "…"}; required.
	Owner ScopeString `yaml:"owner"`
	// Repo is that repository's name, or {$expr: "…"}; required.
	Repo ScopeString `yaml:"repo"`
	// Permissions maps GitHub permission names to read, write or admin
	// (metadata: read is added unless named), or is {$expr: "…"}, an
	// expression over principal returning such a map; required, since a
	// token without it would carry every permission the installation has.
	Permissions Permissions `yaml:"permissions"`
	// Discovery is the scope of requests made for no one; required when
	// any of the above is an expression, else the same repository with
	// metadata: read.
	Discovery *GitHubAppScope `yaml:"discovery"`
}

// GitHubAppScope is a literal scope: one repository, the permissions.
type GitHubAppScope struct {
	// Owner is the account whose repository the discovery token is
	// minted for: a literal name; required.
	Owner string `yaml:"owner"`
	// Repo is that repository's name, a literal; required.
	Repo string `yaml:"repo"`
	// Permissions are the discovery token's: a literal map of GitHub
	// permission names to read, write or admin, such as {metadata: read};
	// required.
	Permissions map[string]string `yaml:"permissions"`
}

// ScopeString is an owner or repo: a literal name, or {$expr: "…"}, a
// string expression over principal (the call's principal's name).
type ScopeString struct {
	Literal string `yaml:"-"`
	// Expr is a string expression over principal (the call's principal's
	// name), evaluated at each call for the name to use. It needs
	// requiresPrincipal: true on the connection, and a discovery scope.
	Expr string `yaml:"$expr"`

	mapping bool
}

// UnmarshalYAML reads both forms.
func (s *ScopeString) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*s = ScopeString{Literal: n.Value}
		return nil
	}
	type plain ScopeString // without this method
	var p plain
	err := n.Decode(&p)
	*s = ScopeString(p)
	s.mapping = true
	return err
}

// acceptsScalar tells the shape check that a name may stand in for the
// mapping.
func (*ScopeString) acceptsScalar() {}

// Permissions maps GitHub permission names to read, write or admin; the
// single key $expr instead holds an expression over principal returning
// such a map.
type Permissions map[string]string

// Expr is the expression form's source, "" for a literal map.
func (p Permissions) Expr() string { return p["$expr"] }

// ScopeEnv is the type of what githubApp scope expressions see.
func ScopeEnv() types.Map { return types.Map{"principal": types.String} }

// CompileScopeString compiles an owner or repo expression; it must
// return a string.
func CompileScopeString(src string) (*sandbox.Program, error) {
	return sandbox.Compile(src, ScopeEnv(), expr.AsKind(reflect.String))
}

// CompilePermissions compiles a permissions expression; what it returns
// (a map of names to levels) is checked at each call.
func CompilePermissions(src string) (*sandbox.Program, error) {
	return sandbox.Compile(src, ScopeEnv())
}

// HasExpr says whether any part of the scope depends on the principal.
func (g *GitHubApp) HasExpr() bool {
	return g.Owner.Expr != "" || g.Repo.Expr != "" || g.Permissions.Expr() != ""
}

// DiscoveryScope is the scope of requests made for no one: Discovery, or
// (all literal) the configured repository with metadata: read.
func (g *GitHubApp) DiscoveryScope() GitHubAppScope {
	if g.Discovery != nil {
		return *g.Discovery
	}
	return GitHubAppScope{Owner: g.Owner.Literal, Repo: g.Repo.Literal, Permissions: map[string]string{"metadata": "read"}}
}

// usesGitHubApp says whether the entry authenticates as a GitHub App.
func (c Connection) usesGitHubApp() bool { return c.Auth != nil && c.Auth.GitHubApp != nil }

// substitute replaces ${env:NAME} in the App's fields; a private key that
// is exactly ${secret:NAME} is kept for the server to resolve.
func (g *GitHubApp) substitute(path string, getenv func(string) string, ps *problems) {
	g.AppID = substituteString(g.AppID, path+".appId", getenv, ps)
	g.APIBaseURL = substituteString(g.APIBaseURL, path+".apiBaseUrl", getenv, ps)
	if _, ok := SecretRef(g.PrivateKey); !ok {
		g.PrivateKey = substituteString(g.PrivateKey, path+".privateKey", getenv, ps)
	}
}

// validate checks the App's fields; c is the entry it belongs to.
func (g *GitHubApp) validate(ps *problems, path string, c Connection) {
	g.validateApp(ps, path)
	g.validateScope(ps, path, c)
}

// CheckSource checks the App of a provider entry (one of a kind whose Go
// code asks for tokens itself): the App as on any entry, and no owner,
// repo, permissions or discovery — the provider's code names the scope of
// each token it asks for, so a scope here would say nothing. path is the
// App's own, connections.<name>.auth.githubApp.
func (g *GitHubApp) CheckSource(path string) error {
	var ps problems
	g.validateApp(&ps, path)
	for field, set := range map[string]bool{
		"owner": g.Owner != (ScopeString{}), "repo": g.Repo != (ScopeString{}),
		"permissions": len(g.Permissions) > 0, "discovery": g.Discovery != nil,
	} {
		if set {
			ps.add(path+"."+field, "is not taken on a provider connection: its code names the repository and permissions of each token it asks for")
		}
	}
	return ps.err()
}

// validateApp checks which App on which GitHub: appId, privateKey and
// apiBaseUrl.
func (g *GitHubApp) validateApp(ps *problems, path string) {
	if strings.TrimSpace(g.AppID) == "" {
		ps.add(path+".appId", "is required: the App's id (or client id)")
	}
	switch _, isRef := SecretRef(g.PrivateKey); {
	case isRef:
	case strings.TrimSpace(g.PrivateKey) == "":
		ps.add(path+".privateKey", "is required: ${secret:NAME} naming the App's private key")
	default:
		if _, err := githubapp.ParsePrivateKey(g.PrivateKey); err != nil {
			ps.add(path+".privateKey", "%s: give the PEM GitHub issued (PKCS#1 or PKCS#8), or ${secret:NAME}", githubapp.CodeOf(err))
		}
	}
	if g.APIBaseURL != "" {
		u, err := url.Parse(g.APIBaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			ps.add(path+".apiBaseUrl", "must be an http or https URL without credentials, such as https://github.example.com/api/v3")
		}
	}
}

// validateScope checks the scope of an MCP or OpenAPI entry's calls and of
// its discovery.
func (g *GitHubApp) validateScope(ps *problems, path string, c Connection) {
	validateScopeString(ps, path+".owner", g.Owner, true)
	validateScopeString(ps, path+".repo", g.Repo, false)
	if src := g.Permissions.Expr(); src != "" {
		if len(g.Permissions) > 1 {
			ps.add(path+".permissions", "is either a map of permissions or {$expr: …}, not both")
		} else if _, err := CompilePermissions(src); err != nil {
			ps.add(path+".permissions.$expr", "is not a valid expression over principal: %v", err)
		}
	} else {
		validatePermissions(ps, path+".permissions", g.Permissions)
	}
	if g.HasExpr() {
		if !c.RequiresPrincipal {
			ps.add(path, "uses an expression over principal, which needs requiresPrincipal: true on the connection: an anonymous call has no principal to evaluate it for")
		}
		if g.Discovery == nil {
			ps.add(path+".discovery", "is required when owner, repo or permissions is an expression: the literal {owner, repo, permissions} used with no principal (to list tools)")
		}
	}
	if d := g.Discovery; d != nil {
		validateName(ps, path+".discovery.owner", d.Owner, true)
		validateName(ps, path+".discovery.repo", d.Repo, false)
		validatePermissions(ps, path+".discovery.permissions", d.Permissions)
	}
}

func validateScopeString(ps *problems, path string, s ScopeString, owner bool) {
	switch {
	case s.mapping && strings.TrimSpace(s.Expr) == "":
		ps.add(path+".$expr", "is required in a mapping: a string expression over principal")
	case s.Expr != "":
		if _, err := CompileScopeString(s.Expr); err != nil {
			ps.add(path+".$expr", "is not a valid string expression over principal: %v", err)
		}
	default:
		validateName(ps, path, s.Literal, owner)
	}
}

// validateName checks a literal owner or repo: required, and a GitHub
// name (it goes into URL paths).
func validateName(ps *problems, path, name string, owner bool) {
	if name == "" {
		ps.add(path, "is required")
		return
	}
	// A placeholder stands for the other half: only name is checked.
	scope := githubapp.Scope{Owner: "o", Repo: name, Permissions: map[string]string{"metadata": "read"}}
	if owner {
		scope.Owner, scope.Repo = name, "r"
	}
	if err := scope.Check(); err != nil {
		ps.add(path, "must be a GitHub account or repository name (letters, digits, '-', '_', '.'), not %q", name)
	}
}

func validatePermissions(ps *problems, path string, perms map[string]string) {
	if len(perms) == 0 {
		ps.add(path, "is required (such as {issues: write}): a token without it would carry every permission the installation has")
		return
	}
	for _, name := range slices.Sorted(maps.Keys(perms)) {
		scope := githubapp.Scope{Owner: "o", Repo: "r", Permissions: map[string]string{name: perms[name]}}
		if err := scope.Check(); err != nil {
			ps.add(path+"."+name, "must be a GitHub permission name with level read, write or admin, not %q", perms[name])
		}
	}
}

// validateGitHubApp checks where a githubApp auth may stand: beside no
// other auth and no Authorization header.
func (c Connection) validateGitHubApp(ps *problems, path string) {
	a := c.Auth
	if a.OAuth != nil {
		ps.add(path, "has both oauth and githubApp: keep one of the two")
	}
	if a.PerUser {
		ps.add(path+".perUser", "applies to oauth only: a githubApp token's scope follows the principal through owner, repo and permissions expressions")
	}
	switch {
	case c.OpenAPI != nil:
		noAuthorizationHeader(ps, path, "openapi", c.OpenAPI.Headers)
	case c.MCP == nil:
		ps.add(path, "is only supported on an mcp connection of type http or sse, or an openapi connection")
	case c.MCP.Transport() == "stdio":
		ps.add(path, "is not allowed for a stdio server: the token goes only to a remote server from patchbay's own process, never into a process the model drives")
	default:
		noAuthorizationHeader(ps, path, "mcp", c.MCP.Headers)
	}
	a.GitHubApp.validate(ps, path+".githubApp", c)
}

// String names the value as written, for messages.
func (s ScopeString) String() string {
	if s.Expr != "" {
		return fmt.Sprintf("{$expr: %q}", s.Expr)
	}
	return s.Literal
}
