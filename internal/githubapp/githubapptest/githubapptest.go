// Package githubapptest is a local fake of the GitHub a GitHub App talks
// to, for tests of code that uses package githubapp: the installation
// lookup and the token exchange, following GitHub's documented responses,
// and a way to serve repository endpoints that see which installation
// token (and so which grant) a request carried. It listens on loopback.
package githubapptest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Grant is what one installation token is good for.
type Grant struct {
	Token       string
	Owner, Repo string
	Permissions map[string]string
}

// Server is the fake GitHub. Its URL is the App's apiBaseUrl.
type Server struct {
	URL   string
	AppID string
	// Key is the App's private key; KeyPEM is it as GitHub hands it out.
	Key *rsa.PrivateKey

	mux *http.ServeMux

	mu            sync.Mutex
	installations map[string]int64 // lower-cased owner/repo
	replies       map[string]Reply // lower-cased owner/repo → canned lookup answer
	grants        map[string]Grant // by token
	exchanges     int
}

// New starts a fake GitHub for the App appID (with a fresh 2048-bit key),
// closed when the test ends.
func New(t testing.TB, appID string) *Server {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{AppID: appID, Key: key, mux: http.NewServeMux(), installations: map[string]int64{}, replies: map[string]Reply{}, grants: map[string]Grant{}}
	s.mux.HandleFunc("GET /repos/{owner}/{repo}/installation", s.lookup)
	s.mux.HandleFunc("POST /app/installations/{id}/access_tokens", s.exchange)
	srv := httptest.NewServer(s.mux)
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// KeyPEM is the App's private key in PKCS#1 PEM.
func (s *Server) KeyPEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(s.Key)}))
}

// Install installs the App on owner/repo as installation id.
func (s *Server) Install(owner, repo string, id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.installations[strings.ToLower(owner+"/"+repo)] = id
}

// Reply is a canned answer.
type Reply struct {
	Status int
	Header map[string]string
	Body   string
}

// ReplyTo makes the installation lookup of owner/repo answer r (a rate
// limit, say) instead of looking the installation up.
func (s *Server) ReplyTo(owner, repo string, r Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replies[strings.ToLower(owner+"/"+repo)] = r
}

// Handle serves pattern (a net/http pattern) besides the App routes: a
// repository endpoint, whose handler finds the request's grant with
// GrantOf.
func (s *Server) Handle(pattern string, h http.HandlerFunc) { s.mux.HandleFunc(pattern, h) }

// GrantOf is the grant of the installation token r carries; false when
// it carries none this server issued (or one revoked).
func (s *Server) GrantOf(r *http.Request) (Grant, bool) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		tok, ok = strings.CutPrefix(r.Header.Get("Authorization"), "token ")
	}
	if !ok {
		return Grant{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.grants[tok]
	return g, ok
}

// Tokens are the installation tokens issued so far.
func (s *Server) Tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.grants))
	for tok := range s.grants {
		out = append(out, tok)
	}
	return out
}

// Exchanges is how many token exchanges were answered.
func (s *Server) Exchanges() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exchanges
}

// Revoke makes GitHub refuse tok from now on (an App uninstalled, a token
// revoked before its expiry).
func (s *Server) Revoke(tok string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.grants, tok)
}

// WriteJSON writes v as GitHub does.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// appAuth checks the App JWT as GitHub does: RS256 by the App's key, iss
// the App id, issued in the past, expiring at most 10 minutes on.
func (s *Server) appAuth(w http.ResponseWriter, r *http.Request) bool {
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	var claims jwt.RegisteredClaims
	_, err := jwt.ParseWithClaims(raw, &claims, func(*jwt.Token) (any, error) { return &s.Key.PublicKey, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithIssuer(s.AppID), jwt.WithIssuedAt(), jwt.WithExpirationRequired())
	if !ok || err != nil || time.Until(claims.ExpiresAt.Time) > 10*time.Minute {
		WriteJSON(w, http.StatusUnauthorized, map[string]string{"message": "A JSON web token could not be decoded", "documentation_url": "https://docs.github.com/rest"})
		return false
	}
	return true
}

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) {
	if !s.appAuth(w, r) {
		return
	}
	owner, repo := r.PathValue("owner"), r.PathValue("repo")
	s.mu.Lock()
	id, ok := s.installations[strings.ToLower(owner+"/"+repo)]
	canned, isCanned := s.replies[strings.ToLower(owner+"/"+repo)]
	s.mu.Unlock()
	if isCanned {
		for k, v := range canned.Header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.WriteHeader(canned.Status)
		_, _ = io.WriteString(w, canned.Body)
		return
	}
	if !ok {
		WriteJSON(w, http.StatusNotFound, map[string]string{"message": "Not Found", "documentation_url": "https://docs.github.com/rest/apps/apps#get-a-repository-installation-for-the-authenticated-app"})
		return
	}
	WriteJSON(w, http.StatusOK, map[string]any{
		"id": id, "app_id": s.AppID, "target_type": "Organization", "repository_selection": "selected",
		"account": map[string]any{"login": owner, "type": "Organization"},
	})
}

func (s *Server) exchange(w http.ResponseWriter, r *http.Request) {
	if !s.appAuth(w, r) {
		return
	}
	var req struct {
		Repositories []string          `json:"repositories"`
		Permissions  map[string]string `json:"permissions"`
	}
	body, err := io.ReadAll(r.Body)
	if err != nil || json.Unmarshal(body, &req) != nil || len(req.Repositories) != 1 {
		WriteJSON(w, http.StatusUnprocessableEntity, map[string]string{"message": "Problems parsing JSON"})
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var owner string
	for full, id := range s.installations {
		o, repo, _ := strings.Cut(full, "/")
		if fmt.Sprint(id) == r.PathValue("id") && strings.EqualFold(repo, req.Repositories[0]) {
			owner = o
		}
	}
	if owner == "" {
		WriteJSON(w, http.StatusUnprocessableEntity, map[string]string{"message": "There is at least one repository that does not exist or is not accessible to the parent installation."})
		return
	}
	s.exchanges++
	tok := "ghs_" + rand.Text()
	s.grants[tok] = Grant{Token: tok, Owner: owner, Repo: req.Repositories[0], Permissions: req.Permissions}
	WriteJSON(w, http.StatusCreated, map[string]any{
		"token": tok, "expires_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
		"permissions": req.Permissions, "repository_selection": "selected",
		"repositories": []map[string]any{{"name": req.Repositories[0], "full_name": owner + "/" + req.Repositories[0]}},
	})
}
