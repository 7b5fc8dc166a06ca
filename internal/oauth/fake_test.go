package oauth_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeAS is an authorization server that checks what a client must do
// (PKCE S256, resource, redirect URI, the registered auth method) and
// records what it saw.
type fakeAS struct {
	srv *httptest.Server

	// Settings, fixed before the first request.
	issuerPath   string   // "" or a path such as /tenant1
	metadataAt   string   // "oauth" (RFC 8414 path insertion), "openid-insert", "openid-suffix"
	issuerClaim  string   // the issuer the metadata names; "" is the real one
	noS256       bool     // leave S256 out of code_challenge_methods_supported
	issSupported bool     // authorization_response_iss_parameter_supported
	issMode      string   // "" (send the right iss), "omit", "wrong", "slash"
	authMethods  []string // token_endpoint_auth_methods_supported
	noDCR        bool
	cimd         bool
	scopes       []string // scopes_supported
	expiresIn    int      // of tokens from a code (0: 3600); refreshed ones last 3600 s
	refreshDelay time.Duration
	deny         bool
	noRefresh    bool // issue no refresh tokens
	preClient    [2]string
	// refuseType and refuseBody, when set, answer every refresh with 400
	// and that body; {refresh_token} in it stands for the one sent.
	refuseType, refuseBody string

	mu            sync.Mutex
	clients       map[string]regClient
	codes         map[string]codeGrant
	tokens        map[string][]string // access token → scopes
	refreshTokens map[string][]string
	registrations int
	authRequests  []url.Values
	tokenForms    []url.Values
	revoked       []string
	refuseRefresh atomic.Bool
	refreshes     atomic.Int32
	n             atomic.Int32
}

type regClient struct{ secret, method, redirect string }

type codeGrant struct {
	client, challenge, resource, redirect string
	scopes                                []string
}

func newFakeAS(t *testing.T, configure func(*fakeAS)) *fakeAS {
	t.Helper()
	a := &fakeAS{
		metadataAt: "oauth", issSupported: true, authMethods: []string{"client_secret_basic", "client_secret_post", "none"},
		clients: map[string]regClient{}, codes: map[string]codeGrant{}, tokens: map[string][]string{}, refreshTokens: map[string][]string{},
	}
	if configure != nil {
		configure(a)
	}
	if a.preClient[0] != "" {
		a.clients[a.preClient[0]] = regClient{secret: a.preClient[1], method: "client_secret_basic"}
	}
	mux := http.NewServeMux()
	p := a.issuerPath
	switch a.metadataAt {
	case "oauth":
		mux.HandleFunc("GET /.well-known/oauth-authorization-server"+p, a.metadata)
	case "openid-insert":
		mux.HandleFunc("GET /.well-known/openid-configuration"+p, a.metadata)
	case "openid-suffix":
		mux.HandleFunc("GET "+p+"/.well-known/openid-configuration", a.metadata)
	}
	mux.HandleFunc("GET "+p+"/authorize", a.authorize)
	mux.HandleFunc("POST "+p+"/token", a.token)
	mux.HandleFunc("POST "+p+"/register", a.register)
	mux.HandleFunc("POST "+p+"/revoke", a.revoke)
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *fakeAS) issuer() string { return a.srv.URL + a.issuerPath }

func (a *fakeAS) metadata(w http.ResponseWriter, r *http.Request) { a.metadataAs(w, "") }

// metadataAs writes the metadata document; claim, when set, is the issuer
// it names (another origin publishing this server's endpoints).
func (a *fakeAS) metadataAs(w http.ResponseWriter, claim string) {
	iss := a.issuer()
	md := map[string]any{
		"issuer":                                iss,
		"authorization_endpoint":                iss + "/authorize",
		"token_endpoint":                        iss + "/token",
		"revocation_endpoint":                   iss + "/revoke",
		"response_types_supported":              []string{"code"},
		"token_endpoint_auth_methods_supported": a.authMethods,
		"code_challenge_methods_supported":      []string{"plain", "S256"},
	}
	if a.issuerClaim != "" {
		md["issuer"] = a.issuerClaim
	}
	if claim != "" {
		md["issuer"] = claim
	}
	if a.noS256 {
		md["code_challenge_methods_supported"] = []string{"plain"}
	}
	if a.issSupported {
		md["authorization_response_iss_parameter_supported"] = true
	}
	if !a.noDCR {
		md["registration_endpoint"] = iss + "/register"
	}
	if a.cimd {
		md["client_id_metadata_document_supported"] = true
	}
	if a.scopes != nil {
		md["scopes_supported"] = a.scopes
	}
	writeJSON(w, http.StatusOK, md)
}

func (a *fakeAS) register(w http.ResponseWriter, r *http.Request) {
	var req struct {
		RedirectURIs []string `json:"redirect_uris"`
		Method       string   `json:"token_endpoint_auth_method"`
		GrantTypes   []string `json:"grant_types"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.RedirectURIs) != 1 || !slices.Contains(a.authMethods, req.Method) {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_client_metadata"})
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.registrations++
	id := fmt.Sprintf("client-%d", a.n.Add(1))
	c := regClient{method: req.Method, redirect: req.RedirectURIs[0]}
	if req.Method != "none" {
		c.secret = fmt.Sprintf("client-secret-%d-%d", a.n.Add(1), time.Now().UnixNano())
	}
	a.clients[id] = c
	out := map[string]any{"client_id": id, "token_endpoint_auth_method": req.Method, "redirect_uris": req.RedirectURIs}
	if c.secret != "" {
		out["client_secret"] = c.secret
	}
	writeJSON(w, http.StatusCreated, out)
}

func (a *fakeAS) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	a.mu.Lock()
	a.authRequests = append(a.authRequests, q)
	c, known := a.clients[q.Get("client_id")]
	a.mu.Unlock()
	cimd := a.cimd && strings.HasPrefix(q.Get("client_id"), "https://")
	switch {
	case !known && !cimd:
		http.Error(w, "unknown client", http.StatusBadRequest)
		return
	case known && c.redirect != "" && c.redirect != q.Get("redirect_uri"):
		http.Error(w, "redirect_uri mismatch", http.StatusBadRequest)
		return
	case q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("resource") == "":
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	back, _ := url.Parse(q.Get("redirect_uri"))
	v := url.Values{"state": {q.Get("state")}}
	switch a.issMode {
	case "":
		v.Set("iss", a.issuer())
	case "wrong":
		v.Set("iss", "https://evil.example")
	case "slash":
		v.Set("iss", a.issuer()+"/")
	}
	if a.deny {
		v.Set("error", "access_denied")
	} else {
		code := fmt.Sprintf("code-%d", a.n.Add(1))
		a.mu.Lock()
		a.codes[code] = codeGrant{client: q.Get("client_id"), challenge: q.Get("code_challenge"), resource: q.Get("resource"), redirect: q.Get("redirect_uri"), scopes: strings.Fields(q.Get("scope"))}
		a.mu.Unlock()
		v.Set("code", code)
	}
	back.RawQuery = v.Encode()
	http.Redirect(w, r, back.String(), http.StatusFound)
}

// clientAuth returns the client id the request authenticated as, checking
// that it used the method it registered.
func (a *fakeAS) clientAuth(r *http.Request) (string, bool) {
	id, secret, basic := r.BasicAuth()
	method := "client_secret_basic"
	if !basic {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
		method = "client_secret_post"
		if secret == "" {
			method = "none"
		}
	} else {
		id, _ = url.QueryUnescape(id)
		secret, _ = url.QueryUnescape(secret)
	}
	a.mu.Lock()
	c, ok := a.clients[id]
	a.mu.Unlock()
	if !ok && a.cimd && strings.HasPrefix(id, "https://") && method == "none" {
		return id, true
	}
	return id, ok && c.method == method && c.secret == secret
}

func (a *fakeAS) token(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request"})
		return
	}
	a.mu.Lock()
	a.tokenForms = append(a.tokenForms, r.PostForm)
	a.mu.Unlock()
	client, ok := a.clientAuth(r)
	if !ok {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_client"})
		return
	}
	var scopes []string
	expiresIn := cmpInt(a.expiresIn, 3600)
	switch r.PostForm.Get("grant_type") {
	case "authorization_code":
		a.mu.Lock()
		g, ok := a.codes[r.PostForm.Get("code")]
		delete(a.codes, r.PostForm.Get("code"))
		a.mu.Unlock()
		sum := sha256.Sum256([]byte(r.PostForm.Get("code_verifier")))
		if !ok || g.client != client || g.redirect != r.PostForm.Get("redirect_uri") || g.resource != r.PostForm.Get("resource") ||
			base64.RawURLEncoding.EncodeToString(sum[:]) != g.challenge {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_grant"})
			return
		}
		scopes = g.scopes
	case "refresh_token":
		a.refreshes.Add(1)
		time.Sleep(a.refreshDelay)
		a.mu.Lock()
		s, ok := a.refreshTokens[r.PostForm.Get("refresh_token")]
		a.mu.Unlock()
		if a.refuseBody != "" {
			w.Header().Set("Content-Type", a.refuseType)
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(strings.ReplaceAll(a.refuseBody, "{refresh_token}", r.PostForm.Get("refresh_token"))))
			return
		}
		if !ok || a.refuseRefresh.Load() || r.PostForm.Get("resource") == "" {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_grant", "error_description": "refresh token revoked"})
			return
		}
		scopes, expiresIn = s, 3600
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "unsupported_grant_type"})
		return
	}
	n := a.n.Add(1)
	access := fmt.Sprintf("access-token-%d-%d", n, time.Now().UnixNano())
	out := map[string]any{"access_token": access, "token_type": "Bearer", "expires_in": expiresIn}
	a.mu.Lock()
	a.tokens[access] = scopes
	if !a.noRefresh {
		refresh := fmt.Sprintf("refresh-token-%d-%d", n, time.Now().UnixNano())
		a.refreshTokens[refresh] = scopes
		out["refresh_token"] = refresh
	}
	a.mu.Unlock()
	if len(scopes) > 0 {
		out["scope"] = strings.Join(scopes, " ")
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *fakeAS) revoke(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	if _, ok := a.clientAuth(r); !ok {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_client"})
		return
	}
	a.mu.Lock()
	a.revoked = append(a.revoked, r.PostForm.Get("token"))
	delete(a.tokens, r.PostForm.Get("token"))
	delete(a.refreshTokens, r.PostForm.Get("token"))
	a.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (a *fakeAS) scopesOf(token string) ([]string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.tokens[token]
	return s, ok
}

func (a *fakeAS) registrationCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.registrations
}

func (a *fakeAS) lastTokenForm() url.Values {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tokenForms[len(a.tokenForms)-1]
}

func (a *fakeAS) lastAuthRequest() url.Values {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.authRequests) == 0 {
		return nil
	}
	return a.authRequests[len(a.authRequests)-1]
}

// fakeMCP is a protected MCP resource on its own origin: /mcp answers
// JSON-RPC for a token of its authorization server, else 401 with the
// challenge; /redirect sends the client to another origin.
type fakeMCP struct {
	srv        *httptest.Server
	as         *fakeAS
	scope      string   // the challenge's scope
	prmScopes  []string // scopes_supported of the resource metadata
	resource   string   // "" is the real /mcp URL
	needScopes []string // a token must hold these, else 403 insufficient_scope
	inHeader   bool     // resource_metadata in the challenge
	legacy     bool     // 2025-03-26: no resource metadata; the AS metadata at this origin
	redirectTo string
	forbid     string       // every authorized request: 403 insufficient_scope for this scope
	seen       atomic.Int32 // authorized requests
}

func newFakeMCP(t *testing.T, as *fakeAS, configure func(*fakeMCP)) *fakeMCP {
	t.Helper()
	m := &fakeMCP{as: as, inHeader: true}
	if configure != nil {
		configure(m)
	}
	mux := http.NewServeMux()
	if m.legacy {
		m.inHeader = false
		// The authorization server's document, naming this origin its
		// issuer, as a 2025-03-26 server that is its own AS publishes it.
		mux.HandleFunc("GET /.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
			as.metadataAs(w, m.srv.URL)
		})
	} else {
		mux.HandleFunc("GET /.well-known/oauth-protected-resource/mcp", m.resourceMetadata)
	}
	mux.HandleFunc("/mcp", m.serve)
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, m.redirectTo, http.StatusFound)
	})
	m.srv = httptest.NewServer(mux)
	t.Cleanup(m.srv.Close)
	return m
}

func (m *fakeMCP) resourceMetadata(w http.ResponseWriter, r *http.Request) {
	res := m.resource
	if res == "" {
		res = m.url()
	}
	md := map[string]any{"resource": res, "authorization_servers": []string{m.as.issuer()}}
	if m.prmScopes != nil {
		md["scopes_supported"] = m.prmScopes
	}
	writeJSON(w, http.StatusOK, md)
}

func (m *fakeMCP) url() string { return m.srv.URL + "/mcp" }

func (m *fakeMCP) serve(w http.ResponseWriter, r *http.Request) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	scopes, valid := m.as.scopesOf(tok)
	if !ok || !valid {
		ch := `Bearer error="invalid_token"`
		if m.inHeader {
			ch += fmt.Sprintf(`, resource_metadata="%s/.well-known/oauth-protected-resource/mcp"`, m.srv.URL)
		}
		if m.scope != "" {
			ch += fmt.Sprintf(`, scope="%s"`, m.scope)
		}
		w.Header().Set("WWW-Authenticate", ch)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_token"})
		return
	}
	if m.forbid != "" {
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer error="insufficient_scope", scope="%s"`, m.forbid))
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "insufficient_scope"})
		return
	}
	for _, need := range m.needScopes {
		if !slices.Contains(scopes, need) {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer error="insufficient_scope", scope="%s"`, strings.Join(m.needScopes, " ")))
			writeJSON(w, http.StatusForbidden, map[string]string{"error": "insufficient_scope"})
			return
		}
	}
	m.seen.Add(1)
	writeJSON(w, http.StatusOK, map[string]any{"jsonrpc": "2.0", "id": 1, "result": map[string]any{}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func cmpInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}
