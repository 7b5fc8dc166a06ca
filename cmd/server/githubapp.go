package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/githubapp"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/sandbox"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// appConns are the connections whose calls carry GitHub App installation
// tokens (auth: {githubApp: …}), by name; nil when there are none.
type appConns map[string]*appConn

// appConn is one such connection: its App's source and how a call's
// principal becomes a scope.
type appConn struct {
	name string
	src  *lazySource
	// owner, repo and perms are nil where the config gave a literal,
	// which literal holds.
	owner, repo, perms *sandbox.Program
	literal            githubapp.Scope
	discovery          githubapp.Scope
}

// gitHubAppSet is what the config's githubApp entries became: the MCP
// and OpenAPI connections, whose calls the harness gives a token for the
// configured scope, and the provider connections, whose code asks the
// App's source for the tokens it needs (see providerKind.gitHubApp).
type gitHubAppSet struct {
	conns  appConns
	tokens map[string]*lazySource
}

// gitHubApps builds one githubapp.Source per App (app id and API base
// URL) of the githubApp entries, sharing the store, so every connection
// of one App shares its token cache and its exchanges. Tokens are sealed
// under PATCHBAY_SECRET_KEY, which a shared Redis requires (see sealKey).
func gitHubApps(cfg *config.Config, st *store.Store, secrets secrets.SecretStore, redactor secrets.Redactor, logger *slog.Logger) (gitHubAppSet, error) {
	if !slices.ContainsFunc(slices.Collect(maps.Values(cfg.File.Connections)), usesGitHubApp) {
		return gitHubAppSet{}, nil
	}
	keyID, key, err := sealKey(cfg, st, logger, "auth: githubApp", "GitHub App tokens")
	if err != nil {
		return gitHubAppSet{}, err
	}
	set := gitHubAppSet{conns: appConns{}, tokens: map[string]*lazySource{}}
	sources := map[[2]string]*lazySource{}
	for _, name := range sortedNames(cfg.File.Connections) {
		spec := cfg.File.Connections[name]
		if !usesGitHubApp(spec) {
			continue
		}
		g := spec.Auth.GitHubApp
		path := "connections." + name + ".auth.githubApp"
		id := [2]string{g.AppID, apiBaseURL(g.APIBaseURL)}
		src, ok := sources[id]
		switch {
		case !ok:
			if _, isRef := config.SecretRef(g.PrivateKey); !isRef {
				redactor.Add(g.PrivateKey) // a key written into the file
			}
			src = &lazySource{secrets: secrets, keyRef: g.PrivateKey, opts: githubapp.Options{
				AppID: g.AppID, APIBaseURL: g.APIBaseURL, Store: st, Redactor: redactor, Key: key, KeyID: keyID,
			}}
			sources[id] = src
		case src.keyRef != g.PrivateKey:
			return gitHubAppSet{}, &config.ValidationError{Problems: []config.Problem{{Path: path + ".privateKey",
				Message: "differs from another connection's for the same appId and apiBaseUrl: one App has one key"}}}
		}
		if spec.MCP == nil && spec.OpenAPI == nil {
			// A provider entry: config refuses githubApp on the kinds
			// it knows take no tokens (drive), newProvider on any kind
			// that does not declare it takes them.
			if err := g.CheckSource(path); err != nil {
				return gitHubAppSet{}, err
			}
			set.tokens[name] = src
			continue
		}
		c, err := newAppConn(name, g, src)
		if err != nil {
			return gitHubAppSet{}, err
		}
		set.conns[name] = c
	}
	return set, nil
}

func usesGitHubApp(spec config.Connection) bool {
	return spec.Auth != nil && spec.Auth.GitHubApp != nil
}

// gitHubAppAuth is how the entry authenticates with a GitHub App, for its
// status, or nil: the App and the scope as configured, never the key.
func gitHubAppAuth(spec config.Connection) *registry.GitHubAppAuth {
	if !usesGitHubApp(spec) {
		return nil
	}
	g := spec.Auth.GitHubApp
	a := &registry.GitHubAppAuth{AppID: g.AppID, APIBaseURL: apiBaseURL(g.APIBaseURL)}
	if spec.MCP == nil && spec.OpenAPI == nil {
		return a // a provider's code names each token's scope
	}
	a.Owner, a.OwnerExpr = g.Owner.Literal, g.Owner.Expr
	a.Repo, a.RepoExpr = g.Repo.Literal, g.Repo.Expr
	if a.PermissionsExpr = g.Permissions.Expr(); a.PermissionsExpr == "" {
		a.Permissions = g.Permissions
	}
	d := g.DiscoveryScope()
	a.Discovery = &registry.GitHubAppScope{Owner: d.Owner, Repo: d.Repo, Permissions: d.Permissions}
	return a
}

// apiBaseURL is the REST API root a configured apiBaseUrl names.
func apiBaseURL(v string) string {
	if v == "" {
		return githubapp.DefaultAPIBaseURL
	}
	return strings.TrimRight(v, "/")
}

func newAppConn(name string, g *config.GitHubApp, src *lazySource) (*appConn, error) {
	d := g.DiscoveryScope()
	c := &appConn{
		name: name, src: src,
		literal:   githubapp.Scope{Owner: g.Owner.Literal, Repo: g.Repo.Literal, Permissions: g.Permissions},
		discovery: githubapp.Scope{Owner: d.Owner, Repo: d.Repo, Permissions: d.Permissions},
	}
	var err error
	compile := func(src string, f func(string) (*sandbox.Program, error)) *sandbox.Program {
		if src == "" || err != nil {
			return nil
		}
		var p *sandbox.Program
		p, err = f(src)
		return p
	}
	c.owner = compile(g.Owner.Expr, config.CompileScopeString)
	c.repo = compile(g.Repo.Expr, config.CompileScopeString)
	c.perms = compile(g.Permissions.Expr(), config.CompilePermissions)
	if err != nil {
		// config.Load compiled the same expressions already.
		return nil, fmt.Errorf("connections.%s.auth.githubApp: %w", name, err)
	}
	return c, nil
}

// scope is the scope of a call made for principal: the literal parts as
// configured, the expressions evaluated with principal. An expression
// never runs for no one: the discovery scope is not a fallback.
func (c *appConn) scope(ctx context.Context, principal string) (githubapp.Scope, error) {
	s := c.literal
	if c.owner == nil && c.repo == nil && c.perms == nil {
		return s, nil
	}
	if principal == "" || principal == harness.HostPrincipal {
		// requiresPrincipal hides the connection from such runs first.
		return s, errors.New("the token's scope depends on the caller, and this execution runs for no one")
	}
	env := map[string]any{"principal": principal}
	str := func(p *sandbox.Program, what string, into *string) error {
		if p == nil {
			return nil
		}
		v, err := p.Run(ctx, env)
		if err != nil {
			return fmt.Errorf("%s expression: %w", what, err)
		}
		*into, _ = v.(string)
		return nil
	}
	if err := str(c.owner, "owner", &s.Owner); err != nil {
		return s, err
	}
	if err := str(c.repo, "repo", &s.Repo); err != nil {
		return s, err
	}
	if c.perms != nil {
		v, err := c.perms.Run(ctx, env)
		if err != nil {
			return s, fmt.Errorf("permissions expression: %w", err)
		}
		if s.Permissions, err = permissionsOf(v); err != nil {
			return s, err
		}
	}
	return s, nil
}

// permissionsOf reads what a permissions expression returned: a map of
// names to levels (githubapp checks the names and levels).
func permissionsOf(v any) (map[string]string, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("permissions expression returned %T, not a map of permission names to read, write or admin", v)
	}
	out := make(map[string]string, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		level, ok := m[k].(string)
		if !ok {
			return nil, fmt.Errorf("permissions expression: %s is %T, not read, write or admin", k, m[k])
		}
		out[k] = level
	}
	return out, nil
}

// forCall is the source and scope of a call made for principal.
func (c *appConn) forCall(ctx context.Context, principal string) (*githubapp.Source, githubapp.Scope, error) {
	scope, err := c.scope(ctx, principal)
	if err != nil {
		return nil, scope, fmt.Errorf("github app: %w", err)
	}
	src, err := c.src.get(ctx)
	return src, scope, err
}

// headers are the Authorization header of a call for principal.
func (c *appConn) headers(ctx context.Context, principal string) (map[string]string, error) {
	src, scope, err := c.forCall(ctx, principal)
	if err != nil {
		return nil, err
	}
	h, err := src.Headers(ctx, scope)
	if err != nil {
		return nil, appError(scope, err)
	}
	return h, nil
}

// appError says which repository a githubapp error is about. It never
// wraps connect.ErrNeedsSignIn: one caller's org without the App
// installed says nothing about the connection, which stays ready.
func appError(s githubapp.Scope, err error) error {
	return fmt.Errorf("token for %s/%s: %w", s.Owner, s.Repo, err)
}

// lazySource is a githubapp.Source made on first use: its private key is
// read from the secret chain then, so a key set through the API after
// start is used, and a key that is missing fails calls, not the start.
type lazySource struct {
	opts    githubapp.Options // without PrivateKey
	keyRef  string            // ${secret:NAME}, or the key itself
	secrets secrets.SecretStore

	mu  sync.Mutex
	src *githubapp.Source
}

// Token is an installation token for owner/repo narrowed to
// permissions: what a provider's code asks for, at each call, naming the
// scope that call needs. The token is registered with the redactor, and
// goes only to APIBaseURL, from patchbay's own process.
func (l *lazySource) Token(ctx context.Context, owner, repo string, permissions map[string]string) (string, error) {
	src, err := l.get(ctx)
	if err != nil {
		return "", err
	}
	scope := githubapp.Scope{Owner: owner, Repo: repo, Permissions: permissions}
	tok, err := src.Token(ctx, scope)
	if err != nil {
		return "", appError(scope, err)
	}
	return tok, nil
}

// Invalidate drops rejected, a token for the scope GitHub answered 401 to
// before its expiry, so the next Token mints a fresh one.
func (l *lazySource) Invalidate(ctx context.Context, owner, repo string, permissions map[string]string, rejected string) error {
	src, err := l.get(ctx)
	if err != nil {
		return err
	}
	scope := githubapp.Scope{Owner: owner, Repo: repo, Permissions: permissions}
	if err := src.Invalidate(ctx, scope, rejected); err != nil {
		return appError(scope, err)
	}
	return nil
}

// APIBaseURL is the REST API root of the App's GitHub: the only place
// its tokens may go.
func (l *lazySource) APIBaseURL() string { return apiBaseURL(l.opts.APIBaseURL) }

func (l *lazySource) get(ctx context.Context) (*githubapp.Source, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.src != nil {
		return l.src, nil
	}
	o := l.opts
	o.PrivateKey = l.keyRef
	if name, ok := config.SecretRef(l.keyRef); ok {
		if l.secrets == nil {
			return nil, fmt.Errorf("github app %s: no secret store to resolve its private key ${secret:%s}", o.AppID, name)
		}
		v, err := l.secrets.Resolve(ctx, name)
		if err != nil {
			// The store's errors never quote a value.
			return nil, fmt.Errorf("github app %s: private key ${secret:%s}: %w", o.AppID, name, err)
		}
		o.PrivateKey = v
	}
	src, err := githubapp.New(o)
	if err != nil {
		return nil, fmt.Errorf("github app %s: %w", o.AppID, err)
	}
	l.src = src
	return src, nil
}

// credentials are the harness's per-call credentials: a githubApp
// connection's token for the call's principal, an OAuth connection's
// sign-in (when there is one), nothing for the others.
type credentialMux struct {
	apps  appConns
	oauth connect.Credentials // nil without OAuth connections
}

func (m credentialMux) Headers(ctx context.Context, connection, principal string) (map[string]string, bool, error) {
	if c, ok := m.apps[connection]; ok {
		h, err := c.headers(ctx, principal)
		return h, true, err
	}
	if m.oauth == nil {
		return nil, false, nil
	}
	return m.oauth.Headers(ctx, connection, principal)
}

// Refresh replaces a token GitHub answered 401 to (revoked before its
// expiry): invalidated, and a fresh one minted once.
func (m credentialMux) Refresh(ctx context.Context, connection, principal string, rejected map[string]string) (map[string]string, error) {
	if c, ok := m.apps[connection]; ok {
		src, scope, err := c.forCall(ctx, principal)
		if err != nil {
			return nil, err
		}
		h, err := src.Refresh(ctx, scope, rejected)
		if err != nil {
			return nil, appError(scope, err)
		}
		return h, nil
	}
	if r, ok := m.oauth.(connect.CredentialRefresher); ok {
		return r.Refresh(ctx, connection, principal, rejected)
	}
	return nil, fmt.Errorf("connection %s has no credentials to refresh", connection)
}

// callCredentials is the harness's Credentials: nil (not a typed nil)
// when no connection has per-call credentials.
func callCredentials(apps appConns, oauth connect.Credentials) connect.Credentials {
	if len(apps) == 0 {
		return oauth
	}
	return credentialMux{apps: apps, oauth: oauth}
}

// SharedHeaders are the discovery scope's token, for an openapi entry's
// document request (sent only as docAuth allows); the scope of no
// principal.
func (c *appConn) SharedHeaders(ctx context.Context, _ string) (map[string]string, bool, error) {
	src, err := c.src.get(ctx)
	if err != nil {
		return nil, true, err
	}
	h, err := src.Headers(ctx, c.discovery)
	if err != nil {
		return nil, true, appError(c.discovery, err)
	}
	return h, true, nil
}

// client is the HTTP client of an MCP connection's own session (its
// tools/list): the discovery scope's token goes to the server's origin
// only. A request that already carries an Authorization header (a
// caller's session, with the token resolved for its principal) goes as
// it is.
func (c *appConn) client(serverURL string) *http.Client {
	return &http.Client{Transport: &appTransport{c: c, to: serverURL, base: http.DefaultTransport}}
}

type appTransport struct {
	c    *appConn
	to   string
	base http.RoundTripper
}

func (t *appTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Authorization") != "" {
		return t.base.RoundTrip(req)
	}
	src, err := t.c.src.get(req.Context())
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	return src.Transport(t.c.discovery, t.to, t.base).RoundTrip(req)
}
