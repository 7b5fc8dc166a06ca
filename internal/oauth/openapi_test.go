package oauth_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/oauth"
	"github.com/patchbay-dev/patchbay/internal/openapi"
)

// fakeAPI is a REST API behind the fake authorization server: its
// document is public, its one operation wants a token the server issued,
// and it records the Authorization header of every request.
type fakeAPI struct {
	srv *httptest.Server
	as  *fakeAS

	mu       sync.Mutex
	docAuths []string // Authorization of each document request
	calls    []string // Authorization of each whoami call
}

const apiDocument = `{"openapi":"3.0.3","info":{"title":"who","version":"1"},
 "paths":{"/whoami":{"get":{"operationId":"whoami","responses":{"200":{"description":"ok"}}}}}}`

// callWhoami is a document with one call of the fake API's operation.
const callWhoami = `{"version":1,"connections":{"` + connName + `":{}},"root":{"kind":"call","id":"c","connection":"` + connName + `","op":"whoami","args":{}}}`

func newFakeAPI(t *testing.T, as *fakeAS) *fakeAPI {
	t.Helper()
	a := &fakeAPI{as: as}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.docAuths = append(a.docAuths, r.Header.Get("Authorization"))
		a.mu.Unlock()
		_, _ = io.WriteString(w, apiDocument)
	})
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/api", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"resource": a.srv.URL + "/api", "authorization_servers": []string{as.issuer()}})
	})
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		tok, _ := strings.CutPrefix(auth, "Bearer ")
		if _, ok := as.scopesOf(tok); !ok {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer error="invalid_token", resource_metadata="%s/.well-known/oauth-protected-resource/api"`, a.srv.URL))
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_token"})
			return
		}
		a.mu.Lock()
		a.calls = append(a.calls, auth)
		a.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
	})
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *fakeAPI) recorded() (docs, calls []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.docAuths...), append([]string(nil), a.calls...)
}

// A per-user OAuth sign-in on an OpenAPI connection, wired as the server
// wires it: each principal's call carries that principal's own token,
// resolved at the call; the document is read with the shared sign-in's
// token only (never a user's); a token the API refuses, and that cannot
// be refreshed, fails the call saying a sign-in is needed; no token shows
// in the execution or its events.
func TestOpenAPIPerUserTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, nil, nil, func(c *oauth.Connection) { c.PerUser = true })
	api := newFakeAPI(t, b.as)
	b.conn.ResourceURL = api.srv.URL + "/api"
	b.svc.Register(b.conn)
	b.signIn(t, b.svc, "alice")
	b.signIn(t, b.svc, "bob")
	alice, bob := bearer(t, b.svc, "alice"), bearer(t, b.svc, "bob")

	spec := config.OpenAPI{URL: api.srv.URL + "/api/openapi.json", BaseURL: api.srv.URL + "/api"}
	provider := openapi.New(connName, spec, &openapi.Options{Shared: b.svc, Redactor: b.redactor})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add(connName, provider))
	must(t, reg.SetAccess(connName, registry.Access{SignIn: registry.SignInPerUser}))
	must(t, reg.Start(t.Context()))
	t.Cleanup(func() { _ = reg.Close() })
	execs := runExecutions(t, b, reg)

	run := func(principal string) *harness.Execution {
		t.Helper()
		ex, err := execs.Submit(t.Context(), harness.Request{Workflow: json.RawMessage(callWhoami), Principal: principal, Allowlist: "ops"})
		must(t, err)
		ex, err = execs.Wait(t.Context(), ex.ID, 10*time.Second)
		must(t, err)
		return ex
	}
	var ran []*harness.Execution
	for _, who := range []string{"alice", "bob", "alice"} {
		ex := run(who)
		if ex.Status != harness.ExecSucceeded {
			t.Fatalf("%s: %s %+v", who, ex.Status, ex.Error)
		}
		ran = append(ran, ex)
	}
	docs, calls := api.recorded()
	want := []string{"Bearer " + alice, "Bearer " + bob, "Bearer " + alice}
	if strings.Join(calls, "|") != strings.Join(want, "|") {
		t.Fatalf("calls carried %q, want each principal's own token", calls)
	}
	if len(docs) != 1 || docs[0] != "" {
		t.Fatalf("document requests carried %q, want one without a token: only a shared sign-in may read it", docs)
	}

	// A run for nobody (a trigger's) does not see a per-user connection.
	host, _, err := execs.SubmitOnce(t.Context(), "host-run", json.RawMessage(callWhoami), nil)
	must(t, err)
	if host, err = execs.Wait(t.Context(), host.ID, 10*time.Second); err != nil || host.Status != harness.ExecFailed || host.Error.Gate != fault.GateDeclared || !strings.Contains(host.Error.Message, "no principal") {
		t.Fatalf("host run: %+v, %v; want refused at gate 1", host, err)
	}

	// carol has not signed in: refused before anything is sent.
	if ex := run("carol"); ex.Status != harness.ExecFailed || ex.Error.Gate != fault.GateSecrets || !strings.Contains(ex.Error.Message, "needs a sign-in") {
		t.Fatalf("carol: %s %+v, want refused at gate 6 for a sign-in", ex.Status, ex.Error)
	}

	// The API stops accepting alice's token and it cannot be refreshed.
	b.as.mu.Lock()
	delete(b.as.tokens, alice)
	b.as.mu.Unlock()
	b.as.refuseRefresh.Store(true)
	ex := run("alice")
	if ex.Status != harness.ExecFailed || !strings.Contains(ex.Error.Message, "HTTP 401") || !strings.Contains(ex.Error.Message, connect.ErrNeedsSignIn.Error()) {
		t.Fatalf("alice with a refused token: %s %+v, want a failure saying a sign-in is needed", ex.Status, ex.Error)
	}
	ran = append(ran, ex)
	for _, ex := range ran {
		noTokenIn(t, execs, ex, alice, bob)
	}

	// Once an operator signs in for everyone, the document is read with
	// that shared token, still never a user's.
	b.as.refuseRefresh.Store(false)
	b.signIn(t, b.svc, oauth.SharedPrincipal)
	shared := bearer(t, b.svc, oauth.SharedPrincipal)
	conn, err := provider.Connect(t.Context())
	must(t, err)
	_ = conn.Close()
	if docs, _ := api.recorded(); docs[len(docs)-1] != "Bearer "+shared {
		t.Fatalf("document request carried %q, want the shared token", docs[len(docs)-1])
	}
}

// runExecutions starts workers with the sign-in service as the
// executions' per-call credentials and an allowlist "ops" with every
// operation.
func runExecutions(t *testing.T, b *bundle, reg *registry.Registry) *harness.Executions {
	t.Helper()
	als := gates.NewAllowlists(b.st)
	al, err := gates.ParseAllowlist("ops", []byte(`{"connections":{"`+connName+`":{"ops":["*"]}}}`))
	must(t, err)
	_, err = als.Put(t.Context(), al, "tester")
	must(t, err)
	execs := harness.NewExecutions(b.st, reg, &harness.ExecutionsOptions{
		Allowlists: als, Credentials: b.svc, Redactor: b.redactor,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 1); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return execs
}

// noTokenIn fails when a token shows in the execution or its events.
func noTokenIn(t *testing.T, execs *harness.Executions, ex *harness.Execution, tokens ...string) {
	t.Helper()
	evs, err := execs.Events(t.Context(), ex.ID, "", 0)
	must(t, err)
	if len(evs) == 0 {
		t.Fatalf("execution %s has no events", ex.ID)
	}
	rec, err := json.Marshal(ex)
	must(t, err)
	all, err := json.Marshal(evs)
	must(t, err)
	for _, tok := range tokens {
		if strings.Contains(string(rec), tok) || strings.Contains(string(all), tok) {
			t.Fatalf("execution %s shows a token", ex.ID)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
