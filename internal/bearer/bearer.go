// Package bearer owns checking the access tokens patchbay accepts as an
// OAuth 2.0 protected resource: /mcp callers may present a token from the
// configured authorization server instead of an API key.
//
// A JWT access token is checked locally against the issuer's JSON Web Key
// Set: its signature (RSA, RSA-PSS, ECDSA or EdDSA; never none, never an
// HMAC keyed with a public key), its iss (the configured issuer), its aud
// (must contain the resource, <PATCHBAY_PUBLIC_URL>/mcp, or the configured
// audience), exp (required), nbf and iat, with 30 s of leeway. The key set
// comes from the configured URL or the issuer's metadata (RFC 8414, then
// OpenID discovery); it is cached, fetched again when a token names a key
// it does not hold (at most once per 30 s) and when it is an hour old.
//
// A token that is not a JWT (an opaque one, as the MCP TypeScript SDK's
// demo authorization server issues) is checked by RFC 7662 introspection,
// when an introspection endpoint is configured: the answer must say
// active, name the audience (aud, or resource) and an exp in the future,
// and, when it names one, the issuer. A positive answer is cached for at
// most 30 s (never past the token's exp), so a revoked token may be
// accepted for that long.
//
// The caller is the token's sub (or the configured claim, client_id for
// servers whose tokens name only the client). It becomes a principal only
// through the config file: an entry for that value gives its name
// (default oauth:<value>), allowlist and roles. A valid token whose value
// has no entry is refused — a token is no anonymous right — unless a
// default entry is configured, which gives such callers its allowlist and
// roles, each under its own name oauth:<value>.
//
// Every fetch (metadata, keys, introspection) is bounded to 1 MiB and
// 10 s, and follows redirects only within its origin (and never for the
// introspection POST). Tokens never appear in errors or logs: errors say
// why a token was refused, not what it was.
package bearer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// Options configure a Verifier. Issuer, Resource and MetadataURL are
// required, and at least one of Principals and Default.
type Options struct {
	// Issuer is the authorization server whose tokens are accepted,
	// exactly as its tokens' iss and its metadata name it.
	Issuer string
	// Resource is the protected resource's URL (<PATCHBAY_PUBLIC_URL>/mcp):
	// the resource of its metadata, and the audience unless Audience is
	// set.
	Resource string
	// MetadataURL is where the Protected Resource Metadata is served; the
	// challenge of a 401 points there.
	MetadataURL string
	// Audience is what a token's aud must contain; "" is Resource.
	Audience string
	// JWKSURL is where the issuer's signing keys are; "" discovers it
	// from the issuer's metadata.
	JWKSURL string
	// IntrospectionURL is the issuer's RFC 7662 endpoint; "" accepts
	// JWTs only. ClientID and ClientSecret, when set, authenticate
	// patchbay there (HTTP Basic).
	IntrospectionURL       string
	ClientID, ClientSecret string
	// Claim names the caller; "" is sub.
	Claim string
	// Scopes are advertised in the metadata (scopes_supported).
	Scopes []string
	// Principals map a claim value to its principal.
	Principals map[string]Principal
	// Default is the principal of a claim value without an entry; nil
	// refuses such tokens.
	Default *Principal
	// HTTPClient makes the fetches; nil: a client with a 10 s timeout.
	// Its redirects are bounded to the first request's origin either way.
	HTTPClient *http.Client
	Logger     *slog.Logger
	// Now is the clock (tests); nil: time.Now.
	Now func() time.Time
}

// Principal is who a token stands for.
type Principal struct {
	// Name is the principal's name; "" is oauth:<claim value>. A Default
	// principal's is always that.
	Name      string
	Allowlist string
	Roles     []authz.Role
}

// NamePrefix starts the name of a caller's principal whose entry names
// none.
const NamePrefix = "oauth:"

// Bounds of the fetches and of the tokens' times.
const (
	maxDocument  = 1 << 20
	fetchTimeout = 10 * time.Second
	leeway       = 30 * time.Second
	// refreshEvery is the least time between two fetches of the key set
	// (a token naming a key the set lacks asks for one), so that made-up
	// key ids cannot make patchbay hammer the issuer.
	refreshEvery = 30 * time.Second
	// keysMaxAge is how long a key set is used before it is fetched
	// again, so a key the issuer withdrew stops being accepted.
	keysMaxAge = time.Hour
	// introspectionTTL bounds how long an active answer is reused.
	introspectionTTL = 30 * time.Second
	maxClaimValue    = 256
)

// ErrRefused: the token is not one patchbay accepts (not signed by the
// issuer, for another audience or issuer, expired, inactive, or naming a
// caller with no principal).
var ErrRefused = errors.New("access token refused")

// ErrUnavailable: the token could not be checked, because the issuer's
// keys or its introspection endpoint could not be had. Such an error also
// has an Unavailable method reporting true, which the API asks for.
var ErrUnavailable = errors.New("access token could not be checked")

// refused is an ErrRefused saying why.
func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

// unavailableError is an ErrUnavailable with its cause.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string     { return ErrUnavailable.Error() + ": " + e.err.Error() }
func (e *unavailableError) Unwrap() []error   { return []error{ErrUnavailable, e.err} }
func (e *unavailableError) Unavailable() bool { return true }
func unavailable(format string, args ...any) error {
	return &unavailableError{err: fmt.Errorf(format, args...)}
}

// Verifier checks access tokens and names the principal each stands for.
// It is safe for concurrent use.
type Verifier struct {
	o          Options
	audience   string
	claim      string
	challenge  string
	metadata   []byte
	keys       *keySet
	introspect *introspector
	logger     *slog.Logger
	now        func() time.Time
}

// New checks o and returns its Verifier. It fetches nothing: the keys
// are fetched when the first token needs them.
func New(o Options) (*Verifier, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !secureURL(o.Issuer, false) {
		bad("Issuer must be an https URL (http only on a loopback host) without credentials, query or fragment")
	}
	for _, u := range []struct{ name, v string }{{"Resource", o.Resource}, {"MetadataURL", o.MetadataURL}} {
		if p, err := url.Parse(u.v); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" || p.Fragment != "" {
			bad("%s must be an absolute http or https URL", u.name)
		}
	}
	if o.JWKSURL != "" && !secureURL(o.JWKSURL, true) {
		bad("JWKSURL must be an https URL (http only on a loopback host)")
	}
	if o.IntrospectionURL != "" && !secureURL(o.IntrospectionURL, true) {
		bad("IntrospectionURL must be an https URL (http only on a loopback host)")
	}
	if len(o.Principals) == 0 && o.Default == nil {
		bad("no Principals and no Default: no token could be used")
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("bearer: %w", err)
	}
	v := &Verifier{o: o, audience: o.Audience, claim: o.Claim, logger: o.Logger, now: o.Now}
	if v.audience == "" {
		v.audience = o.Resource
	}
	if v.claim == "" {
		v.claim = "sub"
	}
	if v.logger == nil {
		v.logger = slog.New(slog.DiscardHandler)
	}
	if v.now == nil {
		v.now = time.Now
	}
	v.challenge = `Bearer resource_metadata="` + quoteEscape(o.MetadataURL) + `"`
	doc := struct {
		Resource               string   `json:"resource"`
		AuthorizationServers   []string `json:"authorization_servers"`
		BearerMethodsSupported []string `json:"bearer_methods_supported"`
		ScopesSupported        []string `json:"scopes_supported,omitempty"`
	}{o.Resource, []string{o.Issuer}, []string{"header"}, o.Scopes}
	var err error
	if v.metadata, err = json.Marshal(doc); err != nil {
		return nil, fmt.Errorf("bearer: metadata: %w", err)
	}
	f := newFetcher(o.HTTPClient)
	v.keys = &keySet{url: o.JWKSURL, issuer: o.Issuer, fetch: f, logger: v.logger, now: v.now}
	if o.IntrospectionURL != "" {
		v.introspect = &introspector{url: o.IntrospectionURL, clientID: o.ClientID, clientSecret: o.ClientSecret,
			fetch: f, now: v.now, cache: map[[32]byte]cached{}}
	}
	return v, nil
}

// Accepts reports whether token has a form this verifier checks: a JWT
// (three dot-separated parts), or any token when introspection is
// configured. Others are not its to judge (an API key, say).
func (v *Verifier) Accepts(token string) bool {
	return looksJWT(token) || v.introspect != nil
}

// Challenge is the WWW-Authenticate of a 401 (RFC 9728 §5.1): where the
// Protected Resource Metadata is.
func (v *Verifier) Challenge() string { return v.challenge }

// MetadataHandler serves the Protected Resource Metadata (RFC 9728 §2):
// the resource, its one authorization server, that tokens go in the
// Authorization header, and the scopes, if configured. It is public.
func (v *Verifier) MetadataHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "public, max-age=300")
		// Browser-based MCP clients read it from another origin; it
		// holds nothing private.
		h.Set("Access-Control-Allow-Origin", "*")
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(v.metadata)
	})
}

// Verify checks token and returns the principal it stands for. The error
// wraps ErrRefused or ErrUnavailable and never holds the token.
func (v *Verifier) Verify(ctx context.Context, token string) (authz.Principal, error) {
	var (
		caller string
		err    error
	)
	switch {
	case looksJWT(token):
		caller, err = v.verifyJWT(ctx, token)
		var u *unavailableError
		if v.introspect != nil && v.o.JWKSURL == "" && errors.As(err, &u) {
			// The issuer publishes no keys (or cannot be asked for
			// them) and introspection is configured: ask it instead.
			caller, err = v.introspect.check(ctx, v, token)
		}
	case v.introspect != nil:
		caller, err = v.introspect.check(ctx, v, token)
	default:
		return authz.Principal{}, refused("not a JWT, and no introspection endpoint is configured")
	}
	if err != nil {
		return authz.Principal{}, err
	}
	return v.principal(caller)
}

// principal maps a caller's claim value to its principal.
func (v *Verifier) principal(value string) (authz.Principal, error) {
	p, ok := v.o.Principals[value]
	switch {
	case ok:
	case v.o.Default != nil:
		p = *v.o.Default
		p.Name = ""
	default:
		return authz.Principal{}, refused("no principal is configured for %s %q", v.claim, value)
	}
	if p.Name == "" {
		p.Name = NamePrefix + value
	}
	return authz.Principal{Name: p.Name, Allowlist: p.Allowlist, Roles: slices.Clone(p.Roles)}, nil
}

// callerOf reads the caller's claim from a token's claims.
func (v *Verifier) callerOf(claims map[string]any) (string, error) {
	s, ok := claims[v.claim].(string)
	switch {
	case !ok || s == "":
		return "", refused("the token names no %s", v.claim)
	case len(s) > maxClaimValue || strings.ContainsAny(s, "\r\n\x00"):
		return "", refused("the token's %s is not a usable name", v.claim)
	}
	return s, nil
}

// methods are the signature algorithms accepted: asymmetric ones only, so
// a public key can never serve as an HMAC secret, and never none.
var methods = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

func (v *Verifier) verifyJWT(ctx context.Context, token string) (string, error) {
	parser := jwt.NewParser(
		jwt.WithValidMethods(methods),
		jwt.WithIssuer(v.o.Issuer),
		jwt.WithAudience(v.audience),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(leeway),
		jwt.WithTimeFunc(v.now),
	)
	claims := jwt.MapClaims{}
	var keyErr error // the key function's own error, said as it is
	_, err := parser.ParseWithClaims(token, claims, func(t *jwt.Token) (any, error) {
		if _, ok := t.Header["crit"]; ok {
			// RFC 7515 §4.1.11: extensions this verifier does not
			// know must not be ignored.
			keyErr = refused("the token's header has crit")
			return nil, keyErr
		}
		kid, _ := t.Header["kid"].(string)
		var k any
		k, keyErr = v.keys.find(ctx, kid, t.Method.Alg())
		return k, keyErr
	})
	switch {
	case keyErr != nil:
		return "", keyErr
	case err != nil:
		return "", refused("%v", err)
	}
	return v.callerOf(claims)
}

// looksJWT: a JWS in compact form has three dot-separated parts.
func looksJWT(token string) bool { return strings.Count(token, ".") == 2 }

// secureURL accepts https, or http to a loopback host, without userinfo
// or fragment; a query only where query is true.
func secureURL(raw string, query bool) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil || u.Fragment != "" || (!query && u.RawQuery != "") {
		return false
	}
	return credhttp.Secure(u)
}

// quoteEscape escapes a value for a quoted-string of a challenge.
func quoteEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s)
}
