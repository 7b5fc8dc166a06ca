package web_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/oauth"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// fakeSignIns is an authorization server in a map: Begin hands out a
// state bound to the session, Complete checks it once.
type fakeSignIns struct {
	mu       sync.Mutex
	states   map[string][3]string // state → connection, principal, session
	accounts map[string]oauth.Account
}

func (f *fakeSignIns) Begin(_ context.Context, connection, principal, session string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	state := "st-" + connection + "-" + principal
	f.states[state] = [3]string{connection, principal, session}
	return "https://as.example/authorize?state=" + url.QueryEscape(state), nil
}

func (f *fakeSignIns) Complete(_ context.Context, session string, q url.Values) (string, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.states[q.Get("state")]
	delete(f.states, q.Get("state"))
	if !ok || st[2] != session {
		return "", "", &oauth.FlowError{Kind: "state", Message: "This sign-in link was already used or has expired. Start the sign-in again."}
	}
	if q.Get("error") == "access_denied" {
		return st[0], st[1], &oauth.FlowError{Kind: "denied", Message: "You declined access on the server's page."}
	}
	f.accounts[st[0]+"/"+st[1]] = oauth.Account{Principal: st[1], Scopes: []string{"read"}, SignedInAt: time.Now()}
	return st[0], st[1], nil
}

func (f *fakeSignIns) Account(_ context.Context, connection, principal string) (oauth.Account, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.accounts[connection+"/"+principal]
	if !ok {
		return oauth.Account{}, errors.New("not signed in")
	}
	return a, nil
}

func (f *fakeSignIns) ClientMetadata() []byte {
	return []byte(`{"client_id":"https://patchbay.example/oauth/client-metadata.json"}`)
}

func (f *fakeSignIns) Disconnect(_ context.Context, connection, principal string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.accounts, connection+"/"+principal)
	return nil
}

const aliceKey = "alice-api-key-0123456789"

func setupSignIns(t *testing.T) (*bundle, *fakeSignIns) {
	t.Helper()
	reg := registry.NewRegistry(nil)
	for name, access := range map[string]registry.Access{
		"shared": {SignIn: registry.SignInShared}, "mine": {SignIn: registry.SignInPerUser}, "plain": {},
	} {
		must(t, reg.Add(name, connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "x"}})))
		must(t, reg.SetAccess(name, access))
	}
	must(t, reg.Start(context.Background()))
	st := storetest.New(t)
	als := gates.NewAllowlists(st)
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: als})
	f := &fakeSignIns{states: map[string][3]string{}, accounts: map[string]oauth.Account{}}
	e := echo.New()
	must(t, web.Mount(e, web.Options{AdminToken: adminToken, Store: st, Executions: execs, Registry: reg, Allowlists: als,
		SignIns: f, Users: []web.User{{SHA256: sha256.Sum256([]byte(aliceKey)), Principal: authz.Principal{Name: "alice"}}}}))
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close(); _ = reg.Close() })
	return &bundle{url: srv.URL, execs: execs, als: als}, f
}

func signInWith(t *testing.T, b *bundle, token string) *client {
	t.Helper()
	c := newClient(t, b.url)
	c.get("/admin/sign-in")
	p := c.do(http.MethodPost, "/admin/sign-in", url.Values{"_csrf": {c.csrf}, "token": {token}, "next": {"/admin"}})
	if p.status != http.StatusSeeOther {
		t.Fatalf("sign-in: %d", p.status)
	}
	c.get("/admin")
	return c
}

// startFlow follows Connect to the authorization server and returns the
// state it was given.
func startFlow(t *testing.T, c *client, conn string) string {
	t.Helper()
	p := c.get("/oauth/" + conn + "/start")
	loc, _ := url.Parse(p.header.Get("Location"))
	if p.status != http.StatusSeeOther || loc == nil || loc.Host != "as.example" {
		t.Fatalf("start %s: %d %q", conn, p.status, p.header.Get("Location"))
	}
	return loc.Query().Get("state")
}

func TestSignInFlowInTheUI(t *testing.T) {
	t.Parallel()
	b, f := setupSignIns(t)
	admin := signIn(t, b)

	// The operator signs in to the shared connection for everyone.
	state := startFlow(t, admin, "shared")
	p := admin.get("/oauth/callback?state=" + url.QueryEscape(state) + "&code=c1")
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/admin/connections/shared?flash=signed-in" {
		t.Fatalf("callback: %d %q", p.status, p.header.Get("Location"))
	}
	page := admin.get("/admin/connections/shared")
	if got := strings.Join(strings.Fields(page.doc.Find("#signed-in").Text()), " "); !strings.HasPrefix(got, "as admin") {
		t.Fatalf("signed-in panel %q", got)
	}
	// The same state again is refused with a readable page.
	if p := admin.get("/oauth/callback?state=" + url.QueryEscape(state) + "&code=c1"); p.status != http.StatusBadRequest || p.doc.Find("#signin-failed[data-kind=state]").Length() != 1 {
		t.Fatalf("replayed state: %d %q", p.status, p.doc.Find("main").Text())
	}

	// A user (API key) signs in to a per-user connection for themselves,
	// cannot sign in to the shared one, and sees no operator page.
	alice := signInWith(t, b, aliceKey)
	if p := alice.get("/admin/allowlists"); p.status != http.StatusForbidden {
		t.Fatalf("user on an operator page: %d", p.status)
	}
	if p := alice.get("/oauth/shared/start"); p.status != http.StatusForbidden {
		t.Fatalf("user starting a shared sign-in: %d", p.status)
	}
	state = startFlow(t, alice, "mine")
	if !strings.HasSuffix(state, "-alice") {
		t.Fatalf("per-user sign-in for %q, want alice", state)
	}
	// Another browser session cannot finish alice's sign-in.
	if p := admin.get("/oauth/callback?state=" + url.QueryEscape(state) + "&code=c2"); p.status != http.StatusBadRequest {
		t.Fatalf("callback from another session: %d", p.status)
	}
	state = startFlow(t, alice, "mine")
	if p := alice.get("/oauth/callback?state=" + url.QueryEscape(state) + "&error=access_denied"); p.status != http.StatusBadRequest ||
		!strings.Contains(p.doc.Find("#signin-failed").Text(), "declined") {
		t.Fatalf("denied: %d %q", p.status, p.doc.Find("main").Text())
	}
	state = startFlow(t, alice, "mine")
	alice.get("/oauth/callback?state=" + url.QueryEscape(state) + "&code=c3")
	if _, ok := f.accounts["mine/alice"]; !ok {
		t.Fatal("alice's sign-in was not stored")
	}
	// Disconnect needs the session's CSRF token.
	if p := alice.do(http.MethodPost, "/admin/connections/mine/disconnect", url.Values{}); p.status != http.StatusForbidden {
		t.Fatalf("disconnect without CSRF: %d", p.status)
	}
	alice.get("/admin/connections/mine")
	if p := alice.post("/admin/connections/mine/disconnect", nil); p.status != http.StatusSeeOther {
		t.Fatalf("disconnect: %d", p.status)
	}
	if _, ok := f.accounts["mine/alice"]; ok {
		t.Fatal("disconnect left alice's sign-in")
	}
	if p := admin.get("/oauth/plain/start"); p.status != http.StatusNotFound {
		t.Fatalf("sign-in to a connection without OAuth: %d", p.status)
	}
	// Without a session the start page sends the browser to sign in.
	if p := newClient(t, b.url).get("/oauth/shared/start"); p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "/admin/sign-in") {
		t.Fatalf("start without a session: %d %q", p.status, p.header.Get("Location"))
	}
}
