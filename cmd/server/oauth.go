package main

import (
	"crypto/rand"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/oauth"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// signIns builds the OAuth sign-in service when some connection has
// `auth: oauth`, and nil otherwise. Tokens are encrypted under
// PATCHBAY_SECRET_KEY; without one, the embedded store gets a key for this
// run only (nothing it holds survives a restart anyway), while a real
// Redis is refused: every replica must read what another stored.
func signIns(cfg *config.Config, st *store.Store, redactor secrets.Redactor, logger *slog.Logger) (*oauth.Service, error) {
	if !slices.ContainsFunc(slices.Collect(maps.Values(cfg.File.Connections)), usesOAuth) {
		return nil, nil
	}
	keyID, key, err := sealKey(cfg, st, logger, "auth: oauth", "OAuth tokens")
	if err != nil {
		return nil, err
	}
	public := cfg.PublicURL
	if public == "" {
		public = "http://" + cfg.Addr
	}
	svc, err := oauth.New(oauth.Options{Store: st, Key: key, KeyID: keyID, PublicURL: public, Redactor: redactor, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("oauth: %w", err)
	}
	for _, name := range sortedNames(cfg.File.Connections) {
		spec := cfg.File.Connections[name]
		if !usesOAuth(spec) {
			continue
		}
		c := oauth.Connection{Name: name, ResourceURL: resourceURL(spec), PerUser: spec.Auth.PerUser}
		if o := spec.Auth.OAuth; o != nil {
			c.ClientID, c.ClientSecret, c.Scopes, c.Issuer = o.ClientID, o.ClientSecret, o.Scopes, o.Issuer
			redactor.Add(o.ClientSecret)
		}
		if spec.Drive != nil {
			driveSignIn(&c, spec)
		}
		svc.Register(c)
	}
	return svc, nil
}

func usesOAuth(spec config.Connection) bool {
	return (spec.MCP != nil || spec.OpenAPI != nil || spec.Drive != nil) && spec.Auth != nil && spec.Auth.OAuth != nil
}

// resourceURL is what an OAuth connection's token is for: the MCP
// server, the API an OpenAPI document describes (its baseUrl, else the
// document's URL, whose origin serves the API when no baseUrl says
// otherwise; config refuses a file document without baseUrl), or a
// Drive's API base.
func resourceURL(spec config.Connection) string {
	switch {
	case spec.MCP != nil:
		return spec.MCP.URL
	case spec.Drive != nil:
		return driveAPI(*spec.Drive)
	case spec.OpenAPI.BaseURL != "":
		return spec.OpenAPI.BaseURL
	default:
		return spec.OpenAPI.URL
	}
}

// sealKey is the key tokens of feature (what, as configured) are sealed
// under in the store: PATCHBAY_SECRET_KEY's current one. Without one, the
// embedded store gets a key for this run only (nothing it holds survives
// a restart anyway), while a real Redis is refused: every replica must
// read what another stored.
func sealKey(cfg *config.Config, st *store.Store, logger *slog.Logger, what, tokens string) (keyID string, key []byte, err error) {
	switch {
	case cfg.SecretKey != "":
		if keyID, key, err = oauth.KeyFromSecretKey(cfg.SecretKey); err != nil {
			return "", nil, &config.ValidationError{Problems: []config.Problem{{Path: "PATCHBAY_SECRET_KEY", Message: err.Error()}}}
		}
		return keyID, key, nil
	case st.Embedded():
		key = make([]byte, 32)
		_, _ = rand.Read(key)
		logger.Warn("no PATCHBAY_SECRET_KEY: " + tokens + " are encrypted under a key of this run only")
		return "", key, nil
	default:
		return "", nil, &config.ValidationError{Problems: []config.Problem{{Path: "PATCHBAY_SECRET_KEY",
			Message: "is required with " + what + " on a shared Redis: " + tokens + " are stored encrypted under it"}}}
	}
}

// credentials is the service as the harness's Credentials, or nil (not a
// typed nil) without one.
func credentials(svc *oauth.Service) connect.Credentials {
	if svc == nil {
		return nil
	}
	return svc
}

// access is whom a configured connection acts for.
func access(spec config.Connection) registry.Access {
	a := registry.Access{RequiresPrincipal: spec.RequiresPrincipal, GitHubApp: gitHubAppAuth(spec)}
	if usesOAuth(spec) {
		a.SignIn = registry.SignInShared
		if spec.Auth.PerUser {
			a.SignIn = registry.SignInPerUser
			// A per-user Drive is the caller's own: it must never be
			// reached without a caller.
			a.RequiresPrincipal = a.RequiresPrincipal || spec.Drive != nil
		}
	}
	return a
}

// oauthClient is the HTTP client of an OAuth connection's own session:
// the sign-in service adds the shared (or operator's) token on the way
// out, to the server's origin only.
func oauthClient(svc *oauth.Service, name string) *http.Client {
	return &http.Client{Transport: svc.Transport(name, http.DefaultTransport)}
}

// uiUsers are the API keys that may sign in to the admin UI as
// themselves, to connect their own accounts to per-user connections.
func uiUsers(cfg *config.Config) []web.User {
	users := make([]web.User, 0, len(cfg.APIKeys))
	for _, k := range cfg.APIKeys {
		users = append(users, web.User{SHA256: k.SHA256, Principal: principalOf(k)})
	}
	return users
}
