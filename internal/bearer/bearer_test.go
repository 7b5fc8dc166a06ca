package bearer_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/bearer"
)

const resource = "https://patchbay.example.com/mcp"

// clock is a settable time, so tests can step past the refresh interval.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// issuer is a loopback authorization server: its metadata (RFC 8414) and
// its key set, which a test may change, counting the fetches of each.
type issuer struct {
	srv        *httptest.Server
	url        string
	rsa, rsa2  *rsa.PrivateKey
	ec         *ecdsa.PrivateKey
	ed         ed25519.PrivateKey
	keyFetches atomic.Int32
	mdFetches  atomic.Int32

	mu   sync.Mutex
	keys []map[string]any
	md   map[string]any // nil: 404
	oidc bool           // serve the metadata at openid-configuration only
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	is := &issuer{rsa: rsaKey(t), rsa2: rsaKey(t)}
	var err error
	if is.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if _, is.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
		t.Fatal(err)
	}
	is.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		is.mu.Lock()
		defer is.mu.Unlock()
		var body any
		switch r.URL.Path {
		case "/jwks":
			is.keyFetches.Add(1)
			body = map[string]any{"keys": is.keys}
		case "/.well-known/oauth-authorization-server", "/.well-known/openid-configuration":
			is.mdFetches.Add(1)
			if is.md == nil || is.oidc != strings.HasSuffix(r.URL.Path, "openid-configuration") {
				http.NotFound(w, r)
				return
			}
			body = is.md
		default:
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(is.srv.Close)
	is.url = is.srv.URL
	is.md = map[string]any{"issuer": is.url, "jwks_uri": is.url + "/jwks"}
	is.keys = []map[string]any{rsaJWK("rsa-1", &is.rsa.PublicKey), ecJWK("ec-1", &is.ec.PublicKey), edJWK("ed-1", is.ed.Public().(ed25519.PublicKey))}
	return is
}

func (is *issuer) setKeys(keys ...map[string]any) {
	is.mu.Lock()
	is.keys = keys
	is.mu.Unlock()
}

var (
	rsaOnce sync.Once
	rsaPool []*rsa.PrivateKey
	rsaNext atomic.Int32
)

// rsaKey hands out one of a few keys made once: 2048-bit generation is
// slow, and each test needs only that its keys differ.
func rsaKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	rsaOnce.Do(func() {
		for range 4 {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				panic(err)
			}
			rsaPool = append(rsaPool, k)
		}
	})
	return rsaPool[int(rsaNext.Add(1))%len(rsaPool)]
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func rsaJWK(kid string, pub *rsa.PublicKey) map[string]any {
	return map[string]any{"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes())}
}

func ecJWK(kid string, pub *ecdsa.PublicKey) map[string]any {
	b, err := pub.Bytes()
	if err != nil {
		panic(err)
	}
	return map[string]any{"kty": "EC", "kid": kid, "crv": "P-256", "x": b64(b[1:33]), "y": b64(b[33:])}
}

func edJWK(kid string, pub ed25519.PublicKey) map[string]any {
	return map[string]any{"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64(pub)}
}

// sign makes a token of method with key; kid "" leaves it out.
func sign(t *testing.T, method jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// bundle is a verifier over a loopback issuer, on a clock of its own.
type bundle struct {
	is    *issuer
	clock *clock
	v     *bearer.Verifier
}

var principals = map[string]bearer.Principal{
	"user-1": {Name: "alice", Allowlist: "ops", Roles: []authz.Role{authz.Run, authz.Read}},
	"user-2": {Allowlist: "dev"},
}

func setup(t *testing.T, opts ...func(*bearer.Options)) *bundle {
	t.Helper()
	b := &bundle{is: newIssuer(t), clock: &clock{now: time.Now().Truncate(time.Second)}}
	o := bearer.Options{
		Issuer:      b.is.url,
		Resource:    resource,
		MetadataURL: "https://patchbay.example.com/.well-known/oauth-protected-resource/mcp",
		JWKSURL:     b.is.url + "/jwks",
		Principals:  principals,
		Now:         b.clock.Now,
	}
	for _, opt := range opts {
		opt(&o)
	}
	v, err := bearer.New(o)
	if err != nil {
		t.Fatal(err)
	}
	b.v = v
	return b
}

// claims are a valid token's claims for sub, at the bundle's time.
func (b *bundle) claims(sub string) jwt.MapClaims {
	now := b.clock.Now()
	return jwt.MapClaims{"iss": b.is.url, "aud": resource, "sub": sub, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
}

func with(c jwt.MapClaims, kv ...any) jwt.MapClaims {
	out := jwt.MapClaims{}
	for k, v := range c {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
		} else {
			out[kv[i].(string)] = kv[i+1]
		}
	}
	return out
}

func TestVerify(t *testing.T) {
	t.Parallel()
	b := setup(t)
	is := b.is
	now := b.clock.Now()
	valid := b.claims("user-1")
	pubDER, err := x509.MarshalPKIXPublicKey(&is.rsa.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	unsigned, err := jwt.NewWithClaims(jwt.SigningMethodNone, valid).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	crit := jwt.NewWithClaims(jwt.SigningMethodRS256, valid)
	crit.Header["kid"], crit.Header["crit"] = "rsa-1", []string{"exp"}
	critTok, err := crit.SignedString(is.rsa)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		token string
		want  string // the principal's name; "" means refused
	}{
		{"RS256", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", valid), "alice"},
		{"PS256 with the RSA key", sign(t, jwt.SigningMethodPS256, is.rsa, "rsa-1", valid), ""}, // the key says alg RS256
		{"ES256", sign(t, jwt.SigningMethodES256, is.ec, "ec-1", valid), "alice"},
		{"EdDSA", sign(t, jwt.SigningMethodEdDSA, is.ed, "ed-1", valid), "alice"},
		{"no kid, one key fits", sign(t, jwt.SigningMethodES256, is.ec, "", valid), "alice"},
		{"entry without a name", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", b.claims("user-2")), "oauth:user-2"},
		{"audience among several", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "aud", []string{"https://other.example", resource})), "alice"},
		{"expired within the leeway", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "exp", now.Add(-10*time.Second).Unix())), "alice"},
		{"not yet valid within the leeway", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "nbf", now.Add(10*time.Second).Unix())), "alice"},

		{"another audience", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "aud", "https://other.example/mcp")), ""},
		{"the resource's origin only", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "aud", "https://patchbay.example.com")), ""},
		{"no audience", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "aud", nil)), ""},
		{"expired", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "exp", now.Add(-time.Minute).Unix())), ""},
		{"no exp", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "exp", nil)), ""},
		{"not yet valid", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "nbf", now.Add(time.Hour).Unix())), ""},
		{"issued in the future", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "iat", now.Add(time.Hour).Unix())), ""},
		{"forged: another key under the issuer's kid", sign(t, jwt.SigningMethodRS256, is.rsa2, "rsa-1", valid), ""},
		{"forged: another key, no kid", sign(t, jwt.SigningMethodRS256, is.rsa2, "", valid), ""},
		{"wrong issuer", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "iss", "https://evil.example")), ""},
		{"no issuer", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "iss", nil)), ""},
		{"alg none", unsigned, ""},
		{"HS256 keyed with the public key (PEM)", sign(t, jwt.SigningMethodHS256, pubPEM, "rsa-1", valid), ""},
		{"HS256 keyed with the public key (DER)", sign(t, jwt.SigningMethodHS256, pubDER, "rsa-1", valid), ""},
		{"ES256 under the RSA key's kid", sign(t, jwt.SigningMethodES256, is.ec, "rsa-1", valid), ""},
		{"crit header", critTok, ""},
		{"unknown subject", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", b.claims("mallory")), ""},
		{"no subject", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "sub", nil)), ""},
		{"subject not a string", sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", with(valid, "sub", 7)), ""},
		{"malformed", "abc.def.ghi", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := b.v.Verify(t.Context(), tt.token)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("accepted as %+v", p)
				}
				if !errors.Is(err, bearer.ErrRefused) {
					t.Errorf("err = %v, want ErrRefused", err)
				}
				checkNoToken(t, err, tt.token)
				t.Logf("refused: %v", err)
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if p.Name != tt.want {
				t.Errorf("principal = %+v, want %s", p, tt.want)
			}
		})
	}
	p, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", valid))
	if err != nil || p.Allowlist != "ops" || !slices.Equal(p.Roles, []authz.Role{authz.Run, authz.Read}) {
		t.Errorf("alice = %+v, %v", p, err)
	}
	if n := is.keyFetches.Load(); n != 1 {
		t.Errorf("the key set was fetched %d times, want once", n)
	}
}

// checkNoToken: an error never holds the token, nor its signature.
func checkNoToken(t *testing.T, err error, token string) {
	t.Helper()
	parts := strings.Split(token, ".")
	for _, s := range append(parts, token) {
		if len(s) > 8 && strings.Contains(err.Error(), s) {
			t.Errorf("the error quotes the token: %v", err)
		}
	}
}

func TestAudienceAndClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *bearer.Options) {
		o.Audience = "api://patchbay"
		o.Claim = "client_id"
		o.Principals = map[string]bearer.Principal{"ci-bot": {Name: "ci", Allowlist: "ci"}}
	})
	c := with(b.claims("user-1"), "aud", "api://patchbay", "client_id", "ci-bot")
	p, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, b.is.rsa, "rsa-1", c))
	if err != nil || p.Name != "ci" {
		t.Fatalf("Verify = %+v, %v", p, err)
	}
	if _, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, b.is.rsa, "rsa-1", with(c, "aud", resource))); !errors.Is(err, bearer.ErrRefused) {
		t.Errorf("the resource as audience when another is configured: %v", err)
	}
	if _, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, b.is.rsa, "rsa-1", with(c, "client_id", nil))); !errors.Is(err, bearer.ErrRefused) {
		t.Errorf("no client_id: %v", err)
	}
}

func TestDefaultPrincipal(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *bearer.Options) {
		o.Default = &bearer.Principal{Name: "shared", Allowlist: "guests", Roles: []authz.Role{authz.Run}}
	})
	p, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, b.is.rsa, "rsa-1", b.claims("someone")))
	if err != nil || p.Name != "oauth:someone" || p.Allowlist != "guests" {
		t.Fatalf("a caller without an entry = %+v, %v; want its own name and the default's allowlist", p, err)
	}
	if p, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, b.is.rsa, "rsa-1", b.claims("user-1"))); err != nil || p.Name != "alice" {
		t.Fatalf("a caller with an entry = %+v, %v", p, err)
	}
}

func TestUnknownKeyRefreshesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	is := b.is
	if _, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", b.claims("user-1"))); err != nil {
		t.Fatal(err)
	}
	if n := is.keyFetches.Load(); n != 1 {
		t.Fatalf("fetches = %d", n)
	}
	// The issuer rotates to a new key; within the refresh interval a
	// token naming it is refused without a fetch.
	is.setKeys(rsaJWK("rsa-1", &is.rsa.PublicKey), rsaJWK("rsa-2", &is.rsa2.PublicKey))
	rotated := sign(t, jwt.SigningMethodRS256, is.rsa2, "rsa-2", b.claims("user-1"))
	if _, err := b.v.Verify(t.Context(), rotated); !errors.Is(err, bearer.ErrRefused) {
		t.Fatalf("unknown kid within the interval: %v", err)
	}
	if n := is.keyFetches.Load(); n != 1 {
		t.Fatalf("fetches = %d, want no new one within 30 s", n)
	}
	b.clock.advance(31 * time.Second)
	rotated = sign(t, jwt.SigningMethodRS256, is.rsa2, "rsa-2", b.claims("user-1"))
	if p, err := b.v.Verify(t.Context(), rotated); err != nil || p.Name != "alice" {
		t.Fatalf("the rotated key after the interval: %+v, %v", p, err)
	}
	if n := is.keyFetches.Load(); n != 2 {
		t.Fatalf("fetches = %d, want 2", n)
	}
	// Made-up kids, many at once: no fetch until the interval has passed.
	var wg sync.WaitGroup
	for i := range 20 {
		tok := sign(t, jwt.SigningMethodRS256, is.rsa, fmt.Sprintf("made-up-%d", i), b.claims("user-1"))
		wg.Go(func() {
			if _, err := b.v.Verify(context.Background(), tok); !errors.Is(err, bearer.ErrRefused) {
				t.Errorf("made-up kid: %v", err)
			}
		})
	}
	wg.Wait()
	if n := is.keyFetches.Load(); n != 2 {
		t.Fatalf("fetches = %d after made-up kids, want still 2", n)
	}
	b.clock.advance(31 * time.Second)
	for range 5 {
		tok := sign(t, jwt.SigningMethodRS256, is.rsa, "made-up", b.claims("user-1"))
		if _, err := b.v.Verify(t.Context(), tok); !errors.Is(err, bearer.ErrRefused) {
			t.Errorf("made-up kid: %v", err)
		}
	}
	if n := is.keyFetches.Load(); n != 3 {
		t.Fatalf("fetches = %d, want one more after the interval", n)
	}
	// After an hour the set is fetched again: a withdrawn key is no
	// longer accepted.
	is.setKeys(rsaJWK("rsa-2", &is.rsa2.PublicKey))
	b.clock.advance(time.Hour)
	if _, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, is.rsa, "rsa-1", b.claims("user-1"))); !errors.Is(err, bearer.ErrRefused) {
		t.Fatalf("a withdrawn key after an hour: %v", err)
	}
}

func TestDiscovery(t *testing.T) {
	t.Parallel()
	for _, oidc := range []bool{false, true} {
		b := setup(t, func(o *bearer.Options) { o.JWKSURL = "" })
		b.is.mu.Lock()
		b.is.oidc = oidc
		b.is.mu.Unlock()
		if p, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, b.is.rsa, "rsa-1", b.claims("user-1"))); err != nil || p.Name != "alice" {
			t.Fatalf("oidc %v: %+v, %v", oidc, p, err)
		}
		if _, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodES256, b.is.ec, "ec-1", b.claims("user-1"))); err != nil {
			t.Fatal(err)
		}
		if n := b.is.keyFetches.Load(); n != 1 {
			t.Errorf("oidc %v: key fetches = %d", oidc, n)
		}
	}

	// Metadata naming another issuer is not used (RFC 8414 §3.3), and
	// without keys the token cannot be checked: unavailable, not refused.
	b := setup(t, func(o *bearer.Options) { o.JWKSURL = "" })
	b.is.mu.Lock()
	b.is.md["issuer"] = "https://evil.example"
	b.is.mu.Unlock()
	_, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, b.is.rsa, "rsa-1", b.claims("user-1")))
	checkUnavailable(t, err)
	if b.is.keyFetches.Load() != 0 {
		t.Error("keys fetched from metadata naming another issuer")
	}
}

func checkUnavailable(t *testing.T, err error) {
	t.Helper()
	var u interface{ Unavailable() bool }
	if !errors.Is(err, bearer.ErrUnavailable) || errors.Is(err, bearer.ErrRefused) || !errors.As(err, &u) || !u.Unavailable() {
		t.Fatalf("err = %v, want ErrUnavailable with Unavailable() true", err)
	}
}

func TestFetchBounds(t *testing.T) {
	t.Parallel()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a redirect to another origin was followed: %s", r.URL)
	}))
	t.Cleanup(other.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/huge":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"keys":[`+strings.Repeat(" ", 1<<20)+`]}`)
		case "/away":
			http.Redirect(w, r, other.URL+"/jwks", http.StatusFound)
		case "/broken":
			http.Error(w, "no", http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)
	for _, path := range []string{"/huge", "/away", "/broken"} {
		b := setup(t, func(o *bearer.Options) { o.JWKSURL = srv.URL + path })
		_, err := b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, b.is.rsa, "rsa-1", b.claims("user-1")))
		checkUnavailable(t, err)
		// The next try waits for the refresh interval: no fetch storm.
		_, err = b.v.Verify(t.Context(), sign(t, jwt.SigningMethodRS256, b.is.rsa, "rsa-1", b.claims("user-1")))
		checkUnavailable(t, err)
	}
}

func TestMetadataAndChallenge(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *bearer.Options) { o.Scopes = []string{"mcp:tools"} })
	if got, want := b.v.Challenge(), `Bearer resource_metadata="https://patchbay.example.com/.well-known/oauth-protected-resource/mcp"`; got != want {
		t.Errorf("Challenge = %s, want %s", got, want)
	}
	rec := httptest.NewRecorder()
	b.v.MetadataHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/.well-known/oauth-protected-resource/mcp", nil))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("metadata = %d %v", rec.Code, rec.Header())
	}
	var doc map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"resource":                 resource,
		"authorization_servers":    []any{b.is.url},
		"bearer_methods_supported": []any{"header"},
		"scopes_supported":         []any{"mcp:tools"},
	}
	if got, _ := json.Marshal(doc); string(got) != string(must(json.Marshal(want))) {
		t.Errorf("metadata = %s, want %s", got, must(json.Marshal(want)))
	}
	// Without scopes the member is left out.
	b = setup(t)
	rec = httptest.NewRecorder()
	b.v.MetadataHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if strings.Contains(rec.Body.String(), "scopes_supported") {
		t.Errorf("metadata without scopes = %s", rec.Body)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestAccepts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if !b.v.Accepts("a.b.c") || b.v.Accepts("an-api-key") || b.v.Accepts("a.b") {
		t.Error("without introspection only JWT-shaped tokens are the verifier's")
	}
	if _, err := b.v.Verify(t.Context(), "opaque-token"); !errors.Is(err, bearer.ErrRefused) {
		t.Errorf("an opaque token without introspection: %v", err)
	}
	b = setup(t, func(o *bearer.Options) { o.IntrospectionURL = "http://127.0.0.1:1/introspect" })
	if !b.v.Accepts("opaque-token") {
		t.Error("with introspection every token is the verifier's")
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	good := bearer.Options{Issuer: "https://issuer.example", Resource: resource, MetadataURL: resource, Principals: principals}
	for name, change := range map[string]func(*bearer.Options){
		"http issuer elsewhere":  func(o *bearer.Options) { o.Issuer = "http://issuer.example" },
		"no issuer":              func(o *bearer.Options) { o.Issuer = "" },
		"no resource":            func(o *bearer.Options) { o.Resource = "" },
		"no principals":          func(o *bearer.Options) { o.Principals = nil },
		"http jwks elsewhere":    func(o *bearer.Options) { o.JWKSURL = "http://issuer.example/jwks" },
		"introspection over ftp": func(o *bearer.Options) { o.IntrospectionURL = "ftp://issuer.example/i" },
	} {
		o := good
		change(&o)
		if _, err := bearer.New(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := bearer.New(good); err != nil {
		t.Errorf("good options: %v", err)
	}
}
