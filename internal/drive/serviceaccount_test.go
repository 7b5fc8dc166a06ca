package drive_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jwtlib "github.com/golang-jwt/jwt/v5"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/drive"
	"github.com/patchbay-dev/patchbay/internal/harness"
)

// fakeTokenEndpoint is Google's OAuth 2.0 token endpoint for service
// accounts: it takes the JWT-bearer grant (RFC 7523) and checks the
// assertion as Google documents it (RS256 signed with the account's key,
// kid the key's id, iss the account, aud the token URI, scope, exp at
// most an hour after iat, sub only when delegating). Each exchange mints
// a new token, which it registers with the fake Drive.
type fakeTokenEndpoint struct {
	t       *testing.T
	srv     *httptest.Server
	drive   *fakeDrive
	pub     *rsa.PublicKey
	email   string
	kid     string
	scope   string
	subject string
	n       atomic.Int64
}

func (f *fakeTokenEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	fail := func(format string, args ...any) {
		f.t.Errorf("token request: "+format, args...)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(400)
		fmt.Fprint(w, `{"error":"invalid_grant","error_description":"Invalid JWT"}`)
	}
	if r.Method != "POST" || r.URL.Path != "/token" {
		fail("%s %s", r.Method, r.URL.Path)
		return
	}
	if err := r.ParseForm(); err != nil {
		fail("form: %v", err)
		return
	}
	if g := r.PostForm.Get("grant_type"); g != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		fail("grant_type %q", g)
		return
	}
	claims := jwtlib.MapClaims{}
	tok, err := jwtlib.ParseWithClaims(r.PostForm.Get("assertion"), claims, func(tok *jwtlib.Token) (any, error) {
		if tok.Header["kid"] != f.kid {
			return nil, fmt.Errorf("kid %v", tok.Header["kid"])
		}
		return f.pub, nil
	}, jwtlib.WithValidMethods([]string{"RS256"}), jwtlib.WithAudience(f.srv.URL+"/token"), jwtlib.WithIssuer(f.email), jwtlib.WithIssuedAt())
	if err != nil || !tok.Valid {
		fail("assertion: %v", err)
		return
	}
	iat, _ := claims.GetIssuedAt()
	exp, _ := claims.GetExpirationTime()
	if exp == nil || iat == nil || exp.Sub(iat.Time) > time.Hour || exp.Before(time.Now()) {
		fail("iat %v exp %v", iat, exp)
		return
	}
	if claims["scope"] != f.scope {
		fail("scope %v, want %q", claims["scope"], f.scope)
		return
	}
	if sub, _ := claims["sub"].(string); sub != f.subject {
		fail("sub %q, want %q", sub, f.subject)
		return
	}
	access := fmt.Sprintf("ya29.sa-secret-%d", f.n.Add(1))
	f.drive.mu.Lock()
	f.drive.drives[access] = f.drive.drives["tok-robot"]
	f.drive.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"access_token": access, "expires_in": 3599, "token_type": "Bearer"})
}

// memSecrets is a secret store of one map.
type memSecrets struct {
	mu sync.Mutex
	m  map[string]string
}

func (s *memSecrets) Resolve(_ context.Context, name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[name]
	if !ok {
		return "", errors.New("no such secret")
	}
	return v, nil
}

func (s *memSecrets) set(name, v string) {
	s.mu.Lock()
	s.m[name] = v
	s.mu.Unlock()
}

// recorder is a redactor that remembers what it was told.
type recorder struct {
	mu sync.Mutex
	v  []string
}

func (r *recorder) Add(values ...string) {
	r.mu.Lock()
	r.v = append(r.v, values...)
	r.mu.Unlock()
}

func (r *recorder) has(v string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.v, v)
}

// serviceAccountKey is a JSON key as Google's console downloads it, with
// a PKCS#8 key and token_uri pointing at tokenURL.
func serviceAccountKey(t *testing.T, tokenURL string) (string, *rsa.PrivateKey) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "p", "private_key_id": "kid-1",
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": "robot@p.iam.gserviceaccount.com", "client_id": "1",
		"auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": tokenURL,
	})
	return string(key), k
}

type saBundle struct {
	*bundle
	tokens  *fakeTokenEndpoint
	secrets *memSecrets
	red     *recorder
}

func setupSA(t *testing.T, sa config.ServiceAccount) *saBundle {
	t.Helper()
	fake := newFakeDrive(t, map[string]string{"tok-robot": "robot"})
	te := &fakeTokenEndpoint{t: t, drive: fake, email: "robot@p.iam.gserviceaccount.com", kid: "kid-1",
		scope: strings.Join(sa.Scopes, " "), subject: sa.Subject}
	if te.scope == "" {
		te.scope = drive.DefaultScope
	}
	te.srv = httptest.NewServer(te)
	t.Cleanup(te.srv.Close)
	key, k := serviceAccountKey(t, te.srv.URL+"/token")
	te.pub = &k.PublicKey
	secrets := &memSecrets{m: map[string]string{"DRIVE_KEY": key}}
	red := &recorder{}
	sa.Key = "${secret:DRIVE_KEY}"
	p := drive.New("gdrive", config.Drive{APIBaseURL: fake.apiURL(), UploadBaseURL: fake.uploadURL()},
		&drive.Options{ServiceAccount: &sa, Secrets: secrets, Redactor: red})
	c, err := p.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &saBundle{bundle: &bundle{fake: fake, conn: c}, tokens: te, secrets: secrets, red: red}
}

func (b *saBundle) call(t *testing.T, op string, args map[string]any) (any, error) {
	t.Helper()
	return b.conn.Call(context.Background(), harness.CallRequest{Op: op, Args: args})
}

// TestServiceAccount: calls without per-call credentials act as the
// account. One exchange serves many calls (x/oauth2 reuses the token
// until it is about to expire); the assertion is checked by the fake
// token endpoint; the key and every access token go to the redactor.
func TestServiceAccount(t *testing.T) {
	t.Parallel()
	for _, sa := range []config.ServiceAccount{
		{},
		{Scopes: []string{"https://www.googleapis.com/auth/drive"}, Subject: "alice@example.com"},
	} {
		b := setupSA(t, sa)
		b.fake.add("tok-robot", "shared.txt", "text/plain", "root", "for the robot")
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				out, err := b.call(t, "read_file", map[string]any{"path": "shared.txt"})
				if err != nil || out.(map[string]any)["content"] != "for the robot" {
					t.Errorf("read_file = %v, %v", out, err)
				}
			})
		}
		wg.Wait()
		if n := b.tokens.n.Load(); n != 1 {
			t.Fatalf("%d token exchanges for 10 calls, want 1", n)
		}
		key, _ := b.secrets.Resolve(context.Background(), "DRIVE_KEY")
		if !b.red.has("ya29.sa-secret-1") || !b.red.has(key) {
			t.Fatal("the access token or the key was not given to the redactor")
		}
		if info := b.conn.Info(); info["auth"] != "serviceAccount" {
			t.Fatalf("info = %v", info)
		}
	}
}

// TestServiceAccountRefused: a token Drive refuses before its expiry is
// replaced once and the call sent again; a key rotated in the secret
// store is exchanged at the next call.
func TestServiceAccountRefused(t *testing.T) {
	t.Parallel()
	b := setupSA(t, config.ServiceAccount{})
	b.fake.add("tok-robot", "a.txt", "text/plain", "root", "a")
	if _, err := b.call(t, "find_file", map[string]any{"path": "a.txt"}); err != nil {
		t.Fatal(err)
	}
	b.fake.mu.Lock()
	delete(b.fake.drives, "ya29.sa-secret-1") // revoked
	b.fake.mu.Unlock()
	out, err := b.call(t, "find_file", map[string]any{"path": "a.txt"})
	if err != nil || out.(map[string]any)["found"] != true {
		t.Fatalf("after a revocation: %v, %v", out, err)
	}
	if n := b.tokens.n.Load(); n != 2 {
		t.Fatalf("%d exchanges, want 2", n)
	}

	key, k := serviceAccountKey(t, b.tokens.srv.URL+"/token")
	b.tokens.pub = &k.PublicKey // only the new key's assertions pass now
	b.secrets.set("DRIVE_KEY", key)
	if _, err := b.call(t, "list_files", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	if n := b.tokens.n.Load(); n != 3 {
		t.Fatalf("%d exchanges after a key rotation, want 3", n)
	}
}

// TestServiceAccountBadKeys: keys that cannot work fail the call with a
// message that never quotes the key, and send nothing to Drive.
func TestServiceAccountBadKeys(t *testing.T) {
	t.Parallel()
	b := setupSA(t, config.ServiceAccount{})
	good, _ := b.secrets.Resolve(context.Background(), "DRIVE_KEY")
	var m map[string]any
	json.Unmarshal([]byte(good), &m)
	with := func(k, v string) string {
		c := map[string]any{}
		for kk, vv := range m {
			c[kk] = vv
		}
		c[k] = v
		b, _ := json.Marshal(c)
		return string(b)
	}
	for key, want := range map[string]string{
		"not json":                                "is not JSON",
		with("type", "authorized_user"):           `type "authorized_user"`,
		with("private_key", "nope"):               "no PEM private_key",
		with("token_uri", "http://example.com/t"): "must be https",
		with("client_email", ""):                  "no client_email",
	} {
		b.secrets.set("DRIVE_KEY", key)
		_, err := b.call(t, "list_files", map[string]any{})
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Errorf("key %.30q: %v, want %q", key, err, want)
		}
	}
	if len(b.fake.requests()) != 0 {
		t.Fatal("a request went to Drive without a token")
	}
}
