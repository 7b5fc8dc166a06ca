package drivetest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Account is a service account: its JSON key, as Google's console
// downloads it, and a fake of Google's token endpoint that takes the
// JWT-bearer grant (RFC 7523) for it. The endpoint checks the assertion
// as Google documents it: RS256 signed with the account's key, kid the
// key's id, iss the account's email, aud the token URI, the scope asked
// for, an exp at most an hour after iat, sub only when delegating. Each
// exchange mints a new access token that opens the Drive of the token
// given to NewAccount.
type Account struct {
	t     testing.TB
	srv   *httptest.Server
	drive *Drive
	robot string
	Email string
	// Scope and Subject are what assertions must carry.
	Scope, Subject string

	mu  sync.Mutex
	kid string
	pub *rsa.PublicKey
	key string
	n   atomic.Int64
	// Issued are the access tokens minted, in order.
	issued []string
	// refusal, when set, answers every token request.
	refusal *refusal
}

type refusal struct {
	status            int
	contentType, body string
}

// NewAccount starts the token endpoint of an account whose tokens open
// the Drive robotToken opens in d.
func NewAccount(t testing.TB, d *Drive, robotToken, scope, subject string) *Account {
	a := &Account{t: t, drive: d, robot: robotToken, Email: "robot@patchbay-test.iam.gserviceaccount.com", Scope: scope, Subject: subject}
	a.srv = httptest.NewServer(a)
	t.Cleanup(a.srv.Close)
	a.Rotate()
	return a
}

// TokenURL is the key's token_uri.
func (a *Account) TokenURL() string { return a.srv.URL + "/token" }

// Key is the account's current JSON key.
func (a *Account) Key() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.key
}

// Exchanges counts the tokens minted.
func (a *Account) Exchanges() int64 { return a.n.Load() }

// Issued are the access tokens minted so far.
func (a *Account) Issued() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.issued...)
}

// Rotate gives the account a new key (PKCS#8, a new key id); assertions
// signed with the old one are refused from now on.
func (a *Account) Rotate() {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		a.t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		a.t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.kid = fmt.Sprintf("kid-%d", time.Now().UnixNano())
	key, _ := json.Marshal(map[string]string{
		"type": "service_account", "project_id": "patchbay-test", "private_key_id": a.kid,
		"private_key":  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		"client_email": a.Email, "client_id": "1",
		"auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": a.TokenURL(),
	})
	a.key, a.pub = string(key), &k.PublicKey
}

// Refuse makes every token request answered with status and body, as
// Google answers a key it does not know; {assertion} in body stands for
// the request's assertion, as an endpoint that echoes it would send.
func (a *Account) Refuse(status int, contentType, body string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.refusal = &refusal{status: status, contentType: contentType, body: body}
}

func (a *Account) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	ref := a.refusal
	a.mu.Unlock()
	if ref != nil {
		_ = r.ParseForm()
		w.Header().Set("Content-Type", ref.contentType)
		w.WriteHeader(ref.status)
		fmt.Fprint(w, strings.ReplaceAll(ref.body, "{assertion}", r.PostForm.Get("assertion")))
		return
	}
	if err := a.check(r); err != nil {
		a.t.Errorf("token request: %v", err)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"error":"invalid_grant","error_description":"Invalid JWT Signature."}`)
		return
	}
	access := fmt.Sprintf("ya29.robot-secret-%d", a.n.Add(1))
	a.drive.Alias(access, a.robot)
	a.mu.Lock()
	a.issued = append(a.issued, access)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"access_token": access, "expires_in": 3599, "token_type": "Bearer"})
}

func (a *Account) check(r *http.Request) error {
	if r.Method != http.MethodPost || r.URL.Path != "/token" {
		return fmt.Errorf("%s %s", r.Method, r.URL.Path)
	}
	if err := r.ParseForm(); err != nil {
		return err
	}
	if g := r.PostForm.Get("grant_type"); g != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		return fmt.Errorf("grant_type %q", g)
	}
	a.mu.Lock()
	kid, pub := a.kid, a.pub
	a.mu.Unlock()
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(r.PostForm.Get("assertion"), claims, func(tok *jwt.Token) (any, error) {
		if tok.Header["kid"] != kid {
			return nil, fmt.Errorf("kid %v, want %s", tok.Header["kid"], kid)
		}
		return pub, nil
	}, jwt.WithValidMethods([]string{"RS256"}), jwt.WithAudience(a.TokenURL()), jwt.WithIssuer(a.Email), jwt.WithIssuedAt(), jwt.WithExpirationRequired())
	if err != nil {
		return fmt.Errorf("assertion: %w", err)
	}
	iat, _ := claims.GetIssuedAt()
	exp, _ := claims.GetExpirationTime()
	if iat == nil || exp.Sub(iat.Time) > time.Hour {
		return fmt.Errorf("iat %v exp %v", iat, exp)
	}
	if claims["scope"] != a.Scope {
		return fmt.Errorf("scope %v, want %q", claims["scope"], a.Scope)
	}
	if sub, _ := claims["sub"].(string); sub != a.Subject {
		return fmt.Errorf("sub %q, want %q", sub, a.Subject)
	}
	return nil
}
