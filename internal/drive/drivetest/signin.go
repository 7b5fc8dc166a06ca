package drivetest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// SignIn is a fake of Google's OAuth 2.0 authorization server for web
// server applications, as far as patchbay's sign-in uses it: OpenID
// discovery at /.well-known/openid-configuration (S256 offered, no
// dynamic registration, no protected resource metadata on the API), an
// authorization endpoint that answers at once for the user the browser is
// signed in to Google as (SignInAs), and a token endpoint that checks the
// client's secret and the PKCE verifier and issues that user's token,
// which opens the user's Drive in the fake. A refresh (grant_type
// refresh_token) issues a new token that opens the same Drive.
type SignIn struct {
	t     testing.TB
	srv   *httptest.Server
	drive *Drive
	// ClientID and ClientSecret are the pre-registered web client.
	ClientID, ClientSecret string

	mu    sync.Mutex
	user  string           // access token of the signed-in browser user
	codes map[string]grant // outstanding codes
	asked []url.Values     // the authorization requests received
	// refreshes counts the uses of each refresh token; owners is the
	// Drive each refresh token opens.
	refreshes map[string]int
	owners    map[string]*ownerFiles
}

type grant struct {
	token, challenge, redirect string
}

// NewSignIn starts the fake authorization server for the users of d.
func NewSignIn(t testing.TB, d *Drive) *SignIn {
	s := &SignIn{t: t, drive: d, refreshes: map[string]int{}, owners: map[string]*ownerFiles{}, ClientID: "patchbay-test.apps.googleusercontent.com", ClientSecret: "GOCSPX-test-secret-0123",
		codes: map[string]grant{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", s.metadata)
	mux.HandleFunc("GET /o/oauth2/v2/auth", s.authorize)
	mux.HandleFunc("POST /token", s.token)
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	return s
}

// Issuer is the authorization server's issuer identifier.
func (s *SignIn) Issuer() string { return s.srv.URL }

// SignInAs makes the next authorizations grant the user whose Drive
// access token is token.
func (s *SignIn) SignInAs(token string) {
	s.mu.Lock()
	s.user = token
	s.mu.Unlock()
}

// Asked are the authorization requests received so far.
func (s *SignIn) Asked() []url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]url.Values(nil), s.asked...)
}

func (s *SignIn) metadata(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"issuer": s.Issuer(), "authorization_endpoint": s.Issuer() + "/o/oauth2/v2/auth",
		"token_endpoint": s.Issuer() + "/token", "response_types_supported": []string{"code"},
		"code_challenge_methods_supported":      []string{"plain", "S256"},
		"token_endpoint_auth_methods_supported": []string{"client_secret_post", "client_secret_basic"},
		"scopes_supported":                      []string{"openid", "email", "profile"},
	})
}

func (s *SignIn) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	s.mu.Lock()
	s.asked = append(s.asked, q)
	user := s.user
	s.mu.Unlock()
	if q.Get("client_id") != s.ClientID || q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" || user == "" {
		http.Error(w, "Error 400: invalid_request", http.StatusBadRequest)
		return
	}
	code := "4/code-" + nextCode()
	s.mu.Lock()
	s.codes[code] = grant{token: user, challenge: q.Get("code_challenge"), redirect: q.Get("redirect_uri")}
	s.mu.Unlock()
	back, err := url.Parse(q.Get("redirect_uri"))
	if err != nil {
		http.Error(w, "bad redirect_uri", http.StatusBadRequest)
		return
	}
	v := back.Query()
	v.Set("code", code)
	v.Set("state", q.Get("state"))
	v.Set("scope", q.Get("scope"))
	back.RawQuery = v.Encode()
	http.Redirect(w, r, back.String(), http.StatusFound)
}

func (s *SignIn) token(w http.ResponseWriter, r *http.Request) {
	fail := func(code, why string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": why})
	}
	if err := r.ParseForm(); err != nil {
		fail("invalid_request", err.Error())
		return
	}
	id, secret, ok := r.BasicAuth()
	if !ok {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
	}
	if id != s.ClientID || secret != s.ClientSecret {
		fail("invalid_client", "Unauthorized")
		return
	}
	switch r.PostForm.Get("grant_type") {
	case "authorization_code":
	case "refresh_token":
		s.refresh(w, r.PostForm.Get("refresh_token"), fail)
		return
	default:
		fail("unsupported_grant_type", r.PostForm.Get("grant_type"))
		return
	}
	s.mu.Lock()
	g, ok := s.codes[r.PostForm.Get("code")]
	delete(s.codes, r.PostForm.Get("code"))
	s.mu.Unlock()
	sum := sha256.Sum256([]byte(r.PostForm.Get("code_verifier")))
	switch {
	case !ok:
		fail("invalid_grant", "Malformed auth code.")
	case base64.RawURLEncoding.EncodeToString(sum[:]) != g.challenge:
		fail("invalid_grant", "Invalid code verifier.")
	case r.PostForm.Get("redirect_uri") != g.redirect:
		fail("redirect_uri_mismatch", "Bad Request")
	default:
		s.mu.Lock()
		s.owners["1//refresh-"+g.token] = s.drive.filesOf(g.token)
		s.mu.Unlock()
		issue(w, g.token, "1//refresh-"+g.token)
	}
}

// refresh issues a new access token for the user of refresh token rt.
func (s *SignIn) refresh(w http.ResponseWriter, rt string, fail func(code, why string)) {
	user, _ := strings.CutPrefix(rt, "1//refresh-")
	s.mu.Lock()
	files, ok := s.owners[rt]
	s.refreshes[rt]++
	tok := fmt.Sprintf("%s-r%d", user, s.refreshes[rt])
	s.mu.Unlock()
	if !ok {
		fail("invalid_grant", "Bad Request")
		return
	}
	s.drive.setFiles(tok, files)
	issue(w, tok, "")
}

// Refreshes is how often the refresh token of the user whose first token
// was token has been used.
func (s *SignIn) Refreshes(token string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refreshes["1//refresh-"+token]
}

func issue(w http.ResponseWriter, access, refresh string) {
	out := map[string]any{
		"access_token": access, "expires_in": 3599,
		"token_type": "Bearer", "scope": "https://www.googleapis.com/auth/drive.file",
	}
	if refresh != "" {
		out["refresh_token"] = refresh
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

var randMu sync.Mutex
var randN int

// nextCode is a unique string (codes need not be unguessable in a fake).
func nextCode() string {
	randMu.Lock()
	defer randMu.Unlock()
	randN++
	return fmt.Sprintf("%06d", randN)
}
