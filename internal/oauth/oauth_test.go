package oauth_test

import (
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/oauth"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// Fixed names of the tests' connection and browser sessions.
const (
	connName = "remote"
	session  = "browser-session-1"
)

var _ connect.Credentials = (*oauth.Service)(nil)

type bundle struct {
	as       *fakeAS
	mcp      *fakeMCP
	st       *store.Store
	key      []byte
	svc      *oauth.Service
	redactor *secrets.SecretRedactor
	conn     oauth.Connection
}

func setup(t *testing.T, asConf func(*fakeAS), mcpConf func(*fakeMCP), connConf func(*oauth.Connection)) *bundle {
	t.Helper()
	b := &bundle{as: newFakeAS(t, asConf), st: storetest.New(t), key: make([]byte, 32)}
	_, _ = rand.Read(b.key)
	b.mcp = newFakeMCP(t, b.as, mcpConf)
	b.conn = oauth.Connection{Name: connName, ResourceURL: b.mcp.url()}
	if connConf != nil {
		connConf(&b.conn)
	}
	b.svc, b.redactor = b.replica(t)
	return b
}

// replica is another Service on the same store and key, as a second
// server replica would have.
func (b *bundle) replica(t *testing.T) (*oauth.Service, *secrets.SecretRedactor) {
	t.Helper()
	r := secrets.NewSecretRedactor()
	svc, err := oauth.New(oauth.Options{
		Store: b.st, Key: b.key, PublicURL: "http://127.0.0.1:9/", Redactor: r,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	svc.Register(b.conn)
	return svc, r
}

// follow sends a browser to authURL and returns the query the
// authorization server redirects back with (the callback is not called).
func follow(t *testing.T, svc *oauth.Service, authURL string) url.Values {
	t.Helper()
	hc := &http.Client{CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(req.URL.String(), svc.RedirectURI()) {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	resp, err := hc.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusFound || err != nil || !strings.HasPrefix(loc.String(), svc.RedirectURI()) {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("authorization answered %d, Location %q: %s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	return loc.Query()
}

// signIn runs Begin, the browser's trip and Complete.
func (b *bundle) signIn(t *testing.T, svc *oauth.Service, principal string) {
	t.Helper()
	u, err := svc.Begin(t.Context(), connName, principal, session)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	conn, who, err := svc.Complete(t.Context(), session, follow(t, svc, u))
	if err != nil || conn != connName || who != principal {
		t.Fatalf("Complete = %q, %q, %v", conn, who, err)
	}
}

func bearer(t *testing.T, svc *oauth.Service, principal string) string {
	t.Helper()
	h, ok, err := svc.Headers(t.Context(), connName, principal)
	if err != nil || !ok {
		t.Fatalf("Headers(%q) = %v, %v, %v", principal, h, ok, err)
	}
	tok, found := strings.CutPrefix(h["Authorization"], "Bearer ")
	if !found || len(h) != 1 {
		t.Fatalf("Headers = %v", h)
	}
	return tok
}

// callMCP posts to the resource through the service's Transport.
func callMCP(t *testing.T, svc *oauth.Service, target string) (*http.Response, error) {
	t.Helper()
	hc := &http.Client{Transport: svc.Transport(connName, nil)}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, target, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return resp, err
}

func TestFullFlow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		as   func(*fakeAS)
		mcp  func(*fakeMCP)
		conn func(*oauth.Connection)
		// checks on the authorization request and the token request
		wantClient string // "registered", "preregistered", "cimd"
		wantMethod string // how the token request authenticated
		wantScope  string
	}{
		{name: "root issuer, dcr basic", wantClient: "registered", wantMethod: "client_secret_basic"},
		{name: "issuer path, oauth metadata", as: func(a *fakeAS) { a.issuerPath = "/tenant1" }, wantClient: "registered", wantMethod: "client_secret_basic"},
		{name: "issuer path, openid inserted", as: func(a *fakeAS) { a.issuerPath = "/tenant1"; a.metadataAt = "openid-insert" }, wantClient: "registered", wantMethod: "client_secret_basic"},
		{name: "issuer path, openid suffix", as: func(a *fakeAS) { a.issuerPath = "/t/2"; a.metadataAt = "openid-suffix" }, wantClient: "registered", wantMethod: "client_secret_basic"},
		{name: "root issuer, openid", as: func(a *fakeAS) { a.metadataAt = "openid-insert" }, wantClient: "registered", wantMethod: "client_secret_basic"},
		{name: "dcr post", as: func(a *fakeAS) { a.authMethods = []string{"client_secret_post", "none"} }, wantClient: "registered", wantMethod: "client_secret_post"},
		{name: "dcr public", as: func(a *fakeAS) { a.authMethods = []string{"none"} }, wantClient: "registered", wantMethod: "none"},
		{
			name: "pre-registered", as: func(a *fakeAS) { a.noDCR = true; a.preClient = [2]string{"pre-id", "pre-secret-value"} },
			conn:       func(c *oauth.Connection) { c.ClientID, c.ClientSecret = "pre-id", "pre-secret-value" },
			wantClient: "preregistered", wantMethod: "client_secret_basic",
		},
		{name: "scope from the challenge", mcp: func(m *fakeMCP) { m.scope = "mcp:read mcp:write"; m.prmScopes = []string{"other"} }, wantClient: "registered", wantMethod: "client_secret_basic", wantScope: "mcp:read mcp:write"},
		{name: "scopes_supported, offline_access offered", as: func(a *fakeAS) { a.scopes = []string{"mcp:read", "offline_access"} }, mcp: func(m *fakeMCP) { m.prmScopes = []string{"mcp:read"}; m.inHeader = false }, wantClient: "registered", wantMethod: "client_secret_basic", wantScope: "mcp:read offline_access"},
		{name: "configured scopes", conn: func(c *oauth.Connection) { c.Scopes = []string{"a", "b"} }, wantClient: "registered", wantMethod: "client_secret_basic", wantScope: "a b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.as, tt.mcp, tt.conn)
			// No token yet: the request goes out bare, the 401 says sign in.
			if _, err := callMCP(t, b.svc, b.mcp.url()); !errors.Is(err, connect.ErrNeedsSignIn) {
				t.Fatalf("before sign-in: err = %v, want ErrNeedsSignIn", err)
			}
			if _, _, err := b.svc.Headers(t.Context(), connName, "alice"); !errors.Is(err, connect.ErrNeedsSignIn) {
				t.Fatalf("Headers before sign-in: %v", err)
			}

			u, err := b.svc.Begin(t.Context(), connName, "alice", session)
			if err != nil {
				t.Fatalf("Begin: %v", err)
			}
			au, _ := url.Parse(u)
			q := au.Query()
			if !strings.HasPrefix(u, b.as.issuer()+"/authorize?") || q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" ||
				len(q.Get("code_challenge")) != 43 || len(q.Get("state")) < 40 || q.Get("resource") != b.mcp.url() || q.Get("redirect_uri") != "http://127.0.0.1:9/oauth/callback" {
				t.Errorf("authorization URL = %s", u)
			}
			if q.Get("scope") != tt.wantScope {
				t.Errorf("scope = %q, want %q", q.Get("scope"), tt.wantScope)
			}
			switch tt.wantClient {
			case "preregistered":
				if q.Get("client_id") != "pre-id" || b.as.registrationCount() != 0 {
					t.Errorf("client_id = %q, registrations = %d", q.Get("client_id"), b.as.registrationCount())
				}
			case "registered":
				if !strings.HasPrefix(q.Get("client_id"), "client-") || b.as.registrationCount() != 1 {
					t.Errorf("client_id = %q, registrations = %d", q.Get("client_id"), b.as.registrationCount())
				}
			}
			conn, who, err := b.svc.Complete(t.Context(), session, follow(t, b.svc, u))
			if err != nil || conn != connName || who != "alice" {
				t.Fatalf("Complete = %q %q %v", conn, who, err)
			}
			form := b.as.lastTokenForm()
			if form.Get("resource") != b.mcp.url() || form.Get("code_verifier") == "" {
				t.Errorf("token request = %v", form)
			}
			if tt.wantMethod == "client_secret_basic" && form.Has("client_secret") || tt.wantMethod == "none" && form.Has("client_secret") {
				t.Errorf("token request (%s) carries client_secret in the body", tt.wantMethod)
			}
			tok := bearer(t, b.svc, "alice")
			if _, ok := b.as.scopesOf(tok); !ok {
				t.Errorf("Headers returned a token the server did not issue")
			}
			if resp, err := callMCP(t, b.svc, b.mcp.url()); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("after sign-in: %v %v", resp, err)
			}
			acct, err := b.svc.Account(t.Context(), connName, "bob")
			if err != nil || acct.Principal != "alice" || acct.SignedInAt.IsZero() || acct.ExpiresAt.Before(time.Now()) {
				t.Errorf("Account (shared connection) = %+v, %v", acct, err)
			}
			if got := b.redactor.String(tok); got != secrets.RedactedText {
				t.Errorf("access token not registered for redaction: %q", got)
			}
			// A second sign-in reuses the registration.
			b.signIn(t, b.svc, "alice")
			if tt.wantClient == "registered" && b.as.registrationCount() != 1 {
				t.Errorf("registrations = %d after two sign-ins", b.as.registrationCount())
			}
		})
	}
}

func TestCIMD(t *testing.T) {
	t.Parallel()
	b := setup(t, func(a *fakeAS) { a.cimd = true; a.authMethods = []string{"none"} }, nil, nil)
	svc, err := oauth.New(oauth.Options{Store: b.st, Key: b.key, PublicURL: "https://patchbay.example/", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	svc.Register(b.conn)
	u, err := svc.Begin(t.Context(), connName, "alice", session)
	if err != nil {
		t.Fatal(err)
	}
	au, _ := url.Parse(u)
	if got := au.Query().Get("client_id"); got != "https://patchbay.example/oauth/client-metadata.json" || b.as.registrationCount() != 0 {
		t.Errorf("client_id = %q, registrations = %d", got, b.as.registrationCount())
	}
	doc := string(svc.ClientMetadata())
	for _, want := range []string{`"client_id": "https://patchbay.example/oauth/client-metadata.json"`, `"redirect_uris": [`, `"https://patchbay.example/oauth/callback"`, `"token_endpoint_auth_method": "none"`, `"refresh_token"`} {
		if !strings.Contains(doc, want) {
			t.Errorf("client metadata lacks %s:\n%s", want, doc)
		}
	}
	// On http, the same server gets a registration instead.
	if _, err := b.svc.Begin(t.Context(), connName, "alice", session); err != nil || b.as.registrationCount() != 1 {
		t.Errorf("http public URL: err %v, registrations %d", err, b.as.registrationCount())
	}
}

func flowKind(err error) string {
	var fe *oauth.FlowError
	if errors.As(err, &fe) {
		return fe.Kind
	}
	return ""
}

func TestCompleteRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		as       func(*fakeAS)
		edit     func(q url.Values)
		session  string
		twice    bool
		wantKind string
		wantMsg  string
	}{
		{name: "replayed state", twice: true, wantKind: oauth.KindState, wantMsg: "already used"},
		{name: "state from another session", session: "browser-session-2", wantKind: oauth.KindState, wantMsg: "different browser session"},
		{name: "unknown state", edit: func(q url.Values) { q.Set("state", "forged") }, wantKind: oauth.KindState, wantMsg: "Start again"},
		{name: "no state", edit: func(q url.Values) { q.Del("state") }, wantKind: oauth.KindState},
		{name: "wrong iss", as: func(a *fakeAS) { a.issMode = "wrong" }, wantKind: oauth.KindIssuer, wantMsg: "evil.example"},
		{name: "iss with a slash added", as: func(a *fakeAS) { a.issMode = "slash" }, wantKind: oauth.KindIssuer},
		{name: "iss advertised but missing", as: func(a *fakeAS) { a.issMode = "omit" }, wantKind: oauth.KindIssuer, wantMsg: "promises"},
		{name: "iss not advertised, wrong one sent", as: func(a *fakeAS) { a.issSupported = false; a.issMode = "wrong" }, wantKind: oauth.KindIssuer},
		{name: "access denied", as: func(a *fakeAS) { a.deny = true }, wantKind: oauth.KindDenied, wantMsg: "declined"},
		{name: "bad code", edit: func(q url.Values) { q.Set("code", "stolen") }, wantKind: oauth.KindExchange, wantMsg: "invalid_grant"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.as, nil, nil)
			u, err := b.svc.Begin(t.Context(), connName, "alice", session)
			if err != nil {
				t.Fatal(err)
			}
			q := follow(t, b.svc, u)
			if tt.edit != nil {
				tt.edit(q)
			}
			sess := session
			if tt.session != "" {
				sess = tt.session
			}
			if tt.twice {
				if _, _, err := b.svc.Complete(t.Context(), sess, q); err != nil {
					t.Fatalf("first Complete: %v", err)
				}
			}
			_, _, err = b.svc.Complete(t.Context(), sess, q)
			var fe *oauth.FlowError
			if !errors.As(err, &fe) || fe.Kind != tt.wantKind || !strings.Contains(fe.Message, tt.wantMsg) {
				t.Fatalf("Complete = %v, want a %s FlowError with %q", err, tt.wantKind, tt.wantMsg)
			}
			if tt.twice {
				return
			}
			if _, _, err := b.svc.Headers(t.Context(), connName, "alice"); !errors.Is(err, connect.ErrNeedsSignIn) {
				t.Errorf("a refused sign-in stored a token: %v", err)
			}
			// The state was used up even though the sign-in failed.
			if tt.edit == nil {
				if _, _, err := b.svc.Complete(t.Context(), session, q); flowKind(err) != oauth.KindState {
					t.Errorf("state reusable after a refusal: %v", err)
				}
			}
		})
	}
}

func TestBeginRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		as       func(*fakeAS)
		mcp      func(*fakeMCP)
		wantKind string
		wantMsg  string
	}{
		{name: "no PKCE S256", as: func(a *fakeAS) { a.noS256 = true }, wantKind: oauth.KindDiscovery, wantMsg: "S256"},
		{name: "metadata issuer mismatch", as: func(a *fakeAS) { a.issuerClaim = "https://attacker.example" }, wantKind: oauth.KindIssuer, wantMsg: "attacker.example"},
		{name: "resource mismatch", mcp: func(m *fakeMCP) { m.resource = "https://evil.example/mcp" }, wantKind: oauth.KindDiscovery, wantMsg: "evil.example"},
		{name: "no registration, no client", as: func(a *fakeAS) { a.noDCR = true }, wantKind: oauth.KindRegistration, wantMsg: "clientId"},
		{name: "no common auth method", as: func(a *fakeAS) { a.authMethods = []string{"private_key_jwt"} }, wantKind: oauth.KindRegistration, wantMsg: "private_key_jwt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tt.as, tt.mcp, nil)
			_, err := b.svc.Begin(t.Context(), connName, "alice", session)
			var fe *oauth.FlowError
			if !errors.As(err, &fe) || fe.Kind != tt.wantKind || !strings.Contains(fe.Message, tt.wantMsg) {
				t.Fatalf("Begin = %v, want a %s FlowError with %q", err, tt.wantKind, tt.wantMsg)
			}
			if b.as.lastAuthRequest() != nil {
				t.Error("the browser would have been sent on anyway")
			}
		})
	}
	t.Run("unknown connection", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil, nil, nil)
		if _, err := b.svc.Begin(t.Context(), "nope", "alice", session); !errors.Is(err, oauth.ErrUnknownConnection) {
			t.Errorf("err = %v", err)
		}
		if h, ok, err := b.svc.Headers(t.Context(), "nope", "alice"); h != nil || ok || err != nil {
			t.Errorf("Headers for an unregistered connection = %v %v %v", h, ok, err)
		}
	})
}

func TestRefresh(t *testing.T) {
	t.Parallel()
	b := setup(t, func(a *fakeAS) { a.expiresIn = 30 }, nil, nil) // inside the 60 s margin
	b.signIn(t, b.svc, "admin")
	tok := bearer(t, b.svc, "admin")
	if b.as.refreshes.Load() != 1 {
		t.Fatalf("refreshes = %d, want 1 (the token expires within the margin)", b.as.refreshes.Load())
	}
	form := b.as.lastTokenForm()
	if form.Get("grant_type") != "refresh_token" || form.Get("resource") != b.mcp.url() {
		t.Errorf("refresh request = %v", form)
	}
	if _, ok := b.as.scopesOf(tok); !ok {
		t.Error("Headers did not return the refreshed token")
	}
	if got := b.redactor.String(form.Get("refresh_token")); got != secrets.RedactedText {
		t.Error("refresh token not registered for redaction")
	}
}

func TestRefreshOnceAcrossReplicas(t *testing.T) {
	t.Parallel()
	b := setup(t, func(a *fakeAS) { a.expiresIn = 30; a.refreshDelay = 300 * time.Millisecond }, nil, nil)
	b.signIn(t, b.svc, "admin")
	other, _ := b.replica(t)
	// Four callers, two per replica, at once.
	var wg sync.WaitGroup
	got := make([]string, 4)
	errs := make([]error, 4)
	for i, svc := range []*oauth.Service{b.svc, other, b.svc, other} {
		wg.Go(func() {
			h, _, err := svc.Headers(t.Context(), connName, "anyone")
			got[i], errs[i] = h["Authorization"], err
		})
	}
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i] != got[0] || got[i] == "" {
			t.Fatalf("caller %d: %q, %v (caller 0: %q)", i, got[i], errs[i], got[0])
		}
	}
	if n := b.as.refreshes.Load(); n != 1 {
		t.Errorf("refreshes = %d, want exactly 1", n)
	}
}

func TestRefusedRefreshNeedsSignIn(t *testing.T) {
	t.Parallel()
	b := setup(t, func(a *fakeAS) { a.expiresIn = 30 }, nil, nil)
	b.signIn(t, b.svc, "admin")
	b.as.refuseRefresh.Store(true)
	_, ok, err := b.svc.Headers(t.Context(), connName, "admin")
	if !ok || !errors.Is(err, connect.ErrNeedsSignIn) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Headers = %v, %v", ok, err)
	}
	keys, _ := b.st.Client.Keys(t.Context(), b.st.Prefix+"oauth:token:*").Result()
	if len(keys) != 0 {
		t.Errorf("token kept after a refused refresh: %v", keys)
	}
	if _, err := b.svc.Account(t.Context(), connName, "admin"); !errors.Is(err, oauth.ErrNotSignedIn) {
		t.Errorf("Account = %v", err)
	}
	// The discovery session says so too.
	if _, err := callMCP(t, b.svc, b.mcp.url()); !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Errorf("Transport = %v", err)
	}
}

// TestRefusedRefreshSaysWhy: the token endpoint's code and description
// reach the error a call is refused with, whatever shape x/oauth2 left
// them in (a JSON body sent as text/plain, which it reads as a form),
// and the refresh token it echoes is redacted there.
func TestRefusedRefreshSaysWhy(t *testing.T) {
	t.Parallel()
	for _, contentType := range []string{"application/json", "text/plain"} {
		b := setup(t, func(a *fakeAS) {
			a.expiresIn = 30
			a.refuseType = contentType
			a.refuseBody = `{"error":"invalid_grant","error_description":"Token has been expired or revoked: {refresh_token}"}`
		}, nil, nil)
		b.signIn(t, b.svc, "admin")
		_, _, err := b.svc.Headers(t.Context(), connName, "admin")
		if !errors.Is(err, connect.ErrNeedsSignIn) {
			t.Fatalf("%s: err = %v", contentType, err)
		}
		shown := b.redactor.String(err.Error())
		refresh := b.as.lastTokenForm().Get("refresh_token")
		if !strings.Contains(shown, "invalid_grant: Token has been expired or revoked: "+secrets.RedactedText) || refresh == "" || strings.Contains(shown, refresh) {
			t.Errorf("%s: the error reads %q", contentType, shown)
		}
	}
}

func TestExpiredWithoutRefreshToken(t *testing.T) {
	t.Parallel()
	b := setup(t, func(a *fakeAS) { a.expiresIn = 30; a.noRefresh = true }, nil, nil)
	now := time.Now()
	var offset atomic.Int64
	svc, err := oauth.New(oauth.Options{Store: b.st, Key: b.key, PublicURL: "http://127.0.0.1:9", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now: func() time.Time { return now.Add(time.Duration(offset.Load())) }})
	if err != nil {
		t.Fatal(err)
	}
	svc.Register(b.conn)
	b.signIn(t, svc, "admin")
	bearer(t, svc, "admin")              // within the margin, not expired: still used
	offset.Store(int64(2 * time.Minute)) // well past the 30 s lifetime, however slow the sign-in was
	if _, _, err := svc.Headers(t.Context(), connName, "admin"); !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Errorf("expired token without refresh: %v", err)
	}
}

func TestPerUserIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil, func(c *oauth.Connection) { c.PerUser = true })
	b.signIn(t, b.svc, "alice")
	alice := bearer(t, b.svc, "alice")
	for _, p := range []string{"bob", "admin", "Alice", ""} {
		if h, ok, err := b.svc.Headers(t.Context(), connName, p); !ok || !errors.Is(err, connect.ErrNeedsSignIn) || h != nil {
			t.Errorf("Headers(%q) = %v, %v, %v: alice's token must not serve another principal", p, h, ok, err)
		}
		if _, err := b.svc.Account(t.Context(), connName, p); !errors.Is(err, oauth.ErrNotSignedIn) {
			t.Errorf("Account(%q) = %v", p, err)
		}
	}
	b.signIn(t, b.svc, "bob")
	bob := bearer(t, b.svc, "bob")
	if bob == alice || bearer(t, b.svc, "alice") != alice {
		t.Errorf("tokens mixed up: alice %q bob %q", alice, bob)
	}
	// A copy of alice's stored token under bob's key does not decrypt.
	keys, _ := b.st.Client.Keys(t.Context(), b.st.Prefix+"oauth:token:*").Result()
	if len(keys) != 2 {
		t.Fatalf("token keys = %v", keys)
	}
	v, _ := b.st.Client.Get(t.Context(), keys[0]).Result()
	_ = b.st.Client.Set(t.Context(), keys[1], v, 0).Err()
	got := map[string]bool{}
	for _, p := range []string{"alice", "bob"} {
		_, _, err := b.svc.Headers(t.Context(), connName, p)
		got[p] = err == nil
	}
	if got["alice"] && got["bob"] {
		t.Error("a token copied to another principal's key was accepted")
	}
	// The discovery session uses the most recent sign-in (bob), there is
	// no operator sign-in.
	if resp, err := callMCP(t, b.svc, b.mcp.url()); err != nil && !errors.Is(err, connect.ErrNeedsSignIn) || err == nil && resp.StatusCode != http.StatusOK {
		t.Errorf("Transport on a per-user connection: %v %v", resp, err)
	}
}

func TestTransportKeepsTokenOnOrigin(t *testing.T) {
	t.Parallel()
	var leaked atomic.Value
	leaked.Store("")
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked.Store(r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(other.Close)
	b := setup(t, nil, func(m *fakeMCP) { m.redirectTo = other.URL + "/landing" }, nil)
	b.signIn(t, b.svc, "admin")

	hc := &http.Client{Transport: b.svc.Transport(connName, nil)}
	resp, err := hc.Get(b.mcp.srv.URL + "/redirect")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.URL.Host != strings.TrimPrefix(other.URL, "http://") {
		t.Fatalf("the redirect was not followed: %v", resp.Request.URL)
	}
	if got := leaked.Load().(string); got != "" {
		t.Errorf("the other origin received Authorization %q", got)
	}
	// A direct request elsewhere gets nothing either.
	if _, err := hc.Get(other.URL + "/direct"); err != nil || leaked.Load().(string) != "" {
		t.Errorf("direct request to another origin: %v, Authorization %q", err, leaked.Load())
	}
	if resp, err := callMCP(t, b.svc, b.mcp.url()); err != nil || resp.StatusCode != http.StatusOK || b.mcp.seen.Load() == 0 {
		t.Errorf("the resource server itself: %v %v", resp, err)
	}
}

func TestStepUp(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, func(m *fakeMCP) { m.scope = "mcp:basic" }, nil)
	b.signIn(t, b.svc, "admin")
	if got := b.as.lastAuthRequest().Get("scope"); got != "mcp:basic" {
		t.Fatalf("first scope = %q", got)
	}
	b.mcp.needScopes = []string{"mcp:write"}
	if _, err := callMCP(t, b.svc, b.mcp.url()); !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Fatalf("403 insufficient_scope: %v", err)
	}
	b.signIn(t, b.svc, "admin")
	if got := b.as.lastAuthRequest().Get("scope"); got != "mcp:basic mcp:write" {
		t.Errorf("step-up scope = %q, want the union", got)
	}
	if resp, err := callMCP(t, b.svc, b.mcp.url()); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("after step-up: %v %v", resp, err)
	}
}

func TestStepUpFutile(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, func(m *fakeMCP) { m.scope = "mcp:admin" }, nil)
	b.signIn(t, b.svc, "admin")
	// The token has mcp:admin, yet the server keeps asking for it: signing
	// in again cannot help, so it must not look like a sign-in is needed
	// (a caller that signs in on ErrNeedsSignIn would loop).
	b.mcp.forbid = "mcp:admin"
	_, err := callMCP(t, b.svc, b.mcp.url())
	if !errors.Is(err, oauth.ErrInsufficientScope) || errors.Is(err, connect.ErrNeedsSignIn) {
		t.Fatalf("403 for a scope the token has: %v, want ErrInsufficientScope", err)
	}
}

func TestTokensEncryptedAtRest(t *testing.T) {
	t.Parallel()
	b := setup(t, func(a *fakeAS) { a.authMethods = []string{"client_secret_post"} }, nil, nil)
	b.signIn(t, b.svc, "admin")
	tok := bearer(t, b.svc, "admin")
	b.as.mu.Lock()
	var secrets []string
	for _, c := range b.as.clients {
		secrets = append(secrets, c.secret)
	}
	for r := range b.as.refreshTokens {
		secrets = append(secrets, r)
	}
	b.as.mu.Unlock()
	secrets = append(secrets, tok)
	keys, err := b.st.Client.Keys(t.Context(), b.st.Prefix+"*").Result()
	if err != nil || len(keys) < 3 {
		t.Fatalf("keys = %v, %v", keys, err)
	}
	for _, k := range keys {
		var raw string
		switch typ, _ := b.st.Client.Type(t.Context(), k).Result(); typ {
		case "string":
			raw, _ = b.st.Client.Get(t.Context(), k).Result()
		case "zset":
			m, _ := b.st.Client.ZRange(t.Context(), k, 0, -1).Result()
			raw = strings.Join(m, " ")
		}
		for _, s := range secrets {
			if s != "" && strings.Contains(raw, s) {
				t.Errorf("key %s holds a secret in clear", k)
			}
		}
		if strings.Contains(k, ":token:") && !strings.HasPrefix(raw, "v1:o") {
			t.Errorf("token stored as %q…, want v1:<key id>:…", raw[:min(len(raw), 12)])
		}
	}
	// Another key cannot read it: a sign-in is needed, nothing breaks.
	other := make([]byte, 32)
	_, _ = rand.Read(other)
	svc, _ := oauth.New(oauth.Options{Store: b.st, Key: other, PublicURL: "http://127.0.0.1:9", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	svc.Register(b.conn)
	if _, _, err := svc.Headers(t.Context(), connName, "admin"); !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Errorf("Headers under another key = %v", err)
	}
}

func TestDisconnectRevokes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil, nil)
	b.signIn(t, b.svc, "admin")
	tok := bearer(t, b.svc, "admin")
	if err := b.svc.Disconnect(t.Context(), connName, "someone"); err != nil {
		t.Fatal(err)
	}
	b.as.mu.Lock()
	revoked := slices.Clone(b.as.revoked)
	b.as.mu.Unlock()
	if len(revoked) != 2 || !slices.Contains(revoked, tok) || !strings.HasPrefix(revoked[0], "refresh-token-") {
		t.Errorf("revoked = %v", revoked)
	}
	if _, err := b.svc.Account(t.Context(), connName, "admin"); !errors.Is(err, oauth.ErrNotSignedIn) {
		t.Errorf("Account after Disconnect = %v", err)
	}
	if err := b.svc.Disconnect(t.Context(), connName, "admin"); err != nil {
		t.Errorf("second Disconnect = %v", err)
	}
}

func TestNewChecksOptions(t *testing.T) {
	t.Parallel()
	st := storetest.NewEmbedded(t)
	key := make([]byte, 32)
	for _, tt := range []struct {
		name string
		o    oauth.Options
	}{
		{"no store", oauth.Options{Key: key, PublicURL: "http://h"}},
		{"short key", oauth.Options{Store: st, Key: key[:16], PublicURL: "http://h"}},
		{"no public url", oauth.Options{Store: st, Key: key}},
		{"public url with query", oauth.Options{Store: st, Key: key, PublicURL: "https://h/?x=1"}},
		{"bad key id", oauth.Options{Store: st, Key: key, KeyID: "a:b", PublicURL: "https://h"}},
	} {
		if _, err := oauth.New(tt.o); err == nil {
			t.Errorf("%s: New accepted it", tt.name)
		}
	}
}

func TestKeyFromSecretKey(t *testing.T) {
	t.Parallel()
	id, key, err := oauth.KeyFromSecretKey("k2:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=, k1:" + strings.Repeat("A", 43) + "=")
	if err != nil || id != "k2" || len(key) != 32 || key[31] != 31 {
		t.Errorf("key list: %q %v %v", id, key, err)
	}
	id, key, err = oauth.KeyFromSecretKey("a long random passphrase 12345")
	if err != nil || id != "k1" || len(key) != 32 {
		t.Errorf("passphrase: %q %v %v", id, key, err)
	}
	if _, _, err := oauth.KeyFromSecretKey("short"); err == nil || strings.Contains(err.Error(), "short") {
		t.Errorf("short passphrase: %v", err)
	}
}

// A token the server stops accepting before its expiry (revoked, rotated)
// is refreshed once and the request sent again, on the connection's own
// session (Transport) and for a call's credentials (Refresh); a second
// caller with the same rejected token gets the new one without another
// refresh, and a refused refresh needs a sign-in.
func TestRejectedTokenRefreshedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil, nil)
	b.signIn(t, b.svc, "admin")
	revoke := func(tok string) {
		b.as.mu.Lock()
		delete(b.as.tokens, tok)
		b.as.mu.Unlock()
	}

	revoke(bearer(t, b.svc, "admin"))
	resp, err := callMCP(t, b.svc, b.mcp.url())
	if err != nil || resp.StatusCode != http.StatusOK || b.as.refreshes.Load() != 1 {
		t.Fatalf("Transport after a revoked token: %v %v, refreshes %d", resp, err, b.as.refreshes.Load())
	}

	old := map[string]string{"Authorization": "Bearer " + bearer(t, b.svc, "admin")}
	revoke(bearer(t, b.svc, "admin"))
	fresh, err := b.svc.Refresh(t.Context(), connName, "anyone", old)
	if err != nil || fresh["Authorization"] == old["Authorization"] {
		t.Fatalf("Refresh = %v, %v", fresh, err)
	}
	if tok, _ := strings.CutPrefix(fresh["Authorization"], "Bearer "); tok == "" || b.redactor.String(tok) != secrets.RedactedText {
		t.Error("the refreshed token is not registered for redaction")
	}
	other, _ := b.replica(t)
	again, err := other.Refresh(t.Context(), connName, "anyone", old)
	if err != nil || again["Authorization"] != fresh["Authorization"] || b.as.refreshes.Load() != 2 {
		t.Fatalf("second Refresh with the same rejected token = %v, %v, refreshes %d (want the new token, 2)", again, err, b.as.refreshes.Load())
	}

	b.as.refuseRefresh.Store(true)
	if _, err := b.svc.Refresh(t.Context(), connName, "anyone", fresh); !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Fatalf("Refresh refused = %v, want ErrNeedsSignIn", err)
	}
}

// A server of the 2025-03-26 revision has no protected resource metadata:
// its origin is its authorization server, and signing in works all the
// same (with PKCE S256 and the issuer check).
func TestServerWithoutResourceMetadata(t *testing.T) {
	t.Parallel()
	// Its authorization responses carry no iss (RFC 9207 postdates it).
	b := setup(t, func(a *fakeAS) { a.issMode, a.issSupported = "omit", false }, func(m *fakeMCP) { m.legacy = true }, nil)
	b.signIn(t, b.svc, "admin")
	bearer(t, b.svc, "admin")
	resp, err := callMCP(t, b.svc, b.mcp.url())
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("after sign-in: %v %v", resp, err)
	}
}
