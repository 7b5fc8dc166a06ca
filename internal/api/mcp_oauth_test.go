package api_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/authz"
	pbbearer "github.com/patchbay-dev/patchbay/internal/bearer"
	"github.com/patchbay-dev/patchbay/internal/throttle"
)

// echoFace is an MCP face that answers with who called: a POST as JSON,
// a GET as one event of a stream; a DELETE ends nothing and says nothing.
type echoFace struct{}

func (echoFace) ServeMCP(w http.ResponseWriter, r *http.Request, caller authz.Principal) {
	who, _ := json.Marshal(map[string]any{"name": caller.Name, "allowlist": caller.Allowlist, "roles": caller.RoleNames()})
	switch r.Method {
	case http.MethodPost:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(who)
	case http.MethodGet:
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("event: message\ndata: " + string(who) + "\n\n"))
	}
}

const (
	mcpResource = "https://patchbay.example.com/mcp"
	mcpMetadata = "https://patchbay.example.com/.well-known/oauth-protected-resource/mcp"
	mcpIssuer   = "https://issuer.example.com"
	mcpMetaPath = "/.well-known/oauth-protected-resource/mcp"
)

// oauthIssuer signs access tokens and serves its key set on loopback.
type oauthIssuer struct {
	key  *ecdsa.PrivateKey
	jwks string
}

func newOAuthIssuer(t testing.TB) *oauthIssuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := key.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	set, _ := json.Marshal(map[string]any{"keys": []any{map[string]any{"kty": "EC", "kid": "k1", "crv": "P-256", "x": b64(pub[1:33]), "y": b64(pub[33:])}}})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(set)
	}))
	t.Cleanup(srv.Close)
	return &oauthIssuer{key: key, jwks: srv.URL}
}

// token is an access token for sub and aud, valid for ttl from now (a
// negative ttl: expired).
func (is *oauthIssuer) token(t testing.TB, sub, aud string, ttl time.Duration) string {
	t.Helper()
	now := time.Now()
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": mcpIssuer, "aud": aud, "sub": sub, "iat": now.Add(-2 * time.Hour).Unix(), "exp": now.Add(ttl).Unix()})
	tok.Header["kid"] = "k1"
	s, err := tok.SignedString(is.key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// withMCPTokens has /mcp take is's tokens, where sub user-1 is the
// principal oauth-alice, and serve their metadata.
func withMCPTokens(t testing.TB, is *oauthIssuer) func(*api.Options) {
	t.Helper()
	v, err := pbbearer.New(pbbearer.Options{
		Issuer: mcpIssuer, Resource: mcpResource, MetadataURL: mcpMetadata, JWKSURL: is.jwks,
		Scopes:     []string{"mcp:tools"},
		Principals: map[string]pbbearer.Principal{"user-1": {Name: "oauth-alice", Allowlist: "test", Roles: []authz.Role{authz.Run, authz.Read}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return func(o *api.Options) { o.MCPTokens = v }
}

// withEchoFace mounts /mcp with echoFace, which shows who called.
func withEchoFace(o *api.Options) { o.MCP = echoFace{} }

func TestMCPAcceptsOAuthTokens(t *testing.T) {
	t.Parallel()
	is := newOAuthIssuer(t)
	b := setup(t, withMCPTokens(t, is), withEchoFace)
	const challenge = `Bearer resource_metadata="` + mcpMetadata + `"`
	call := func(auth string) reply {
		t.Helper()
		return b.do(t, "POST", "/mcp", "application/json", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, "Authorization", auth)
	}
	unauthorized := func(name string, r reply) {
		t.Helper()
		if r.status != 401 || r.header.Get("WWW-Authenticate") != challenge || r.json(t)["code"] != "UNAUTHENTICATED" {
			t.Errorf("%s = %d %q %s, want 401 with the resource's challenge", name, r.status, r.header.Get("WWW-Authenticate"), r.body)
		}
	}

	unauthorized("no token", call(""))
	unauthorized("expired token", call("Bearer "+is.token(t, "user-1", mcpResource, -time.Hour)))
	unauthorized("token for another resource", call("Bearer "+is.token(t, "user-1", "https://other.example/mcp", time.Hour)))
	unauthorized("token of a subject with no principal", call("Bearer "+is.token(t, "mallory", mcpResource, time.Hour)))
	unauthorized("wrong API key", call("Bearer nope"))

	r := call("Bearer " + is.token(t, "user-1", mcpResource, time.Hour))
	if got := r.json(t); r.status != 200 || got["name"] != "oauth-alice" || got["allowlist"] != "test" || strings.Join(toStrings(got["roles"]), ",") != "run,read" {
		t.Fatalf("valid token = %d %s, want 200 as oauth-alice", r.status, r.body)
	}
	if r := call("Bearer " + testKey); r.status != 200 || r.json(t)["name"] != "tester" {
		t.Fatalf("API key = %d %s, want 200 as tester", r.status, r.body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		if r := b.do(t, m, "/mcp", "", "", "Authorization", "Bearer "+is.token(t, "user-1", mcpResource, time.Hour)); r.status != 200 {
			t.Errorf("%s /mcp with a token = %d", m, r.status)
		}
	}

	// The metadata is public, and names the issuer.
	r = b.do(t, "GET", mcpMetaPath, "", "", "Authorization", "")
	if r.status != 200 {
		t.Fatalf("metadata = %d %s", r.status, r.body)
	}
	md := r.json(t)
	if md["resource"] != mcpResource || strings.Join(toStrings(md["authorization_servers"]), " ") != mcpIssuer ||
		strings.Join(toStrings(md["bearer_methods_supported"]), " ") != "header" || strings.Join(toStrings(md["scopes_supported"]), " ") != "mcp:tools" {
		t.Errorf("metadata = %s", r.body)
	}

	// A token is for /mcp only: the JSON API takes API keys.
	r = b.do(t, "GET", "/v1/executions", "", "", "Authorization", "Bearer "+is.token(t, "user-1", mcpResource, time.Hour))
	if r.status != 401 || r.header.Get("WWW-Authenticate") != `Bearer realm="patchbay"` {
		t.Errorf("token at /v1 = %d %q", r.status, r.header.Get("WWW-Authenticate"))
	}
}

// toStrings reads a JSON list of strings; anything else is nil.
func toStrings(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, e := range list {
		s, _ := e.(string)
		out = append(out, s)
	}
	return out
}

// Wrong tokens count against the address as wrong keys do; a token that
// cannot be checked (the issuer's keys cannot be had) is 503 and is not
// counted.
func TestMCPTokensAndTheThrottle(t *testing.T) {
	t.Parallel()
	is := newOAuthIssuer(t)
	clock := &fakeClock{t: time.Now()}
	lim := throttle.New(&throttle.Options{Free: 3, Backoff: time.Minute, MaxBackoff: time.Hour, Now: clock.now})
	b := setup(t, withMCPTokens(t, is), withEchoFace, func(o *api.Options) { o.Throttle, o.TrustedProxies = lim, loopback })
	as := func(addr, auth string) reply {
		t.Helper()
		return b.do(t, "POST", "/mcp", "application/json", `{}`, "Authorization", auth, "X-Forwarded-For", addr)
	}
	const guesser = "203.0.113.7"
	for i := range 4 {
		if r := as(guesser, "Bearer "+is.token(t, "user-"+strconv.Itoa(i+2), mcpResource, time.Hour)); r.status != 401 {
			t.Fatalf("wrong token %d = %d", i+1, r.status)
		}
	}
	if r := as(guesser, "Bearer "+is.token(t, "user-1", mcpResource, time.Hour)); r.status != 429 || r.json(t)["code"] != "RATE_LIMITED" {
		t.Fatalf("right token while blocked = %d %s, want 429", r.status, r.body)
	}

	// An issuer whose keys cannot be fetched.
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	v, err := pbbearer.New(pbbearer.Options{Issuer: mcpIssuer, Resource: mcpResource, MetadataURL: mcpMetadata, JWKSURL: down.URL,
		Principals: map[string]pbbearer.Principal{"user-1": {Allowlist: "test"}}})
	if err != nil {
		t.Fatal(err)
	}
	lim2 := throttle.New(&throttle.Options{Free: 1, Backoff: time.Minute, MaxBackoff: time.Hour})
	b = setup(t, func(o *api.Options) { o.MCP, o.MCPTokens, o.Throttle, o.TrustedProxies = echoFace{}, v, lim2, loopback })
	for range 5 {
		r := as(guesser, "Bearer "+is.token(t, "user-1", mcpResource, time.Hour))
		if r.status != 503 || r.json(t)["code"] != "TOKEN_UNVERIFIABLE" || r.header.Get("Retry-After") == "" {
			t.Fatalf("token while the issuer is down = %d %v %s, want 503 TOKEN_UNVERIFIABLE", r.status, r.header, r.body)
		}
	}
	if r := as(guesser, "Bearer "+testKey); r.status != 200 {
		t.Fatalf("API key after unverifiable tokens = %d %s: they were counted as wrong", r.status, r.body)
	}
}
