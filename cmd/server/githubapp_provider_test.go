package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/githubapp"
	"github.com/patchbay-dev/patchbay/internal/githubapp/githubapptest"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// tokenSource is what the repos provider needs of a GitHub App source,
// declared where it is used, as a provider package would.
type tokenSource interface {
	Token(ctx context.Context, owner, repo string, permissions map[string]string) (string, error)
	Invalidate(ctx context.Context, owner, repo string, permissions map[string]string, rejected string) error
	APIBaseURL() string
}

// reposKind is a provider kind of this test: its one operation, brief,
// reads an issue of <principal>-org/widgets and the README of
// <principal>-org/docs in one call, each with a token asked for the
// scope that read needs. It is careless on purpose: it logs the tokens
// and returns the first, which the redactor must catch.
var reposKind = providerKind{gitHubApp: true, build: func(name string, _ config.Connection, d providerDeps) connect.Provider {
	var tokens tokenSource
	if d.tokens != nil {
		tokens = d.tokens
	}
	return connect.ProviderFunc(func(context.Context) (connect.Conn, error) {
		return &reposConn{tokens: tokens, logger: d.logger}, nil
	})
}}

var (
	issueScope  = map[string]string{"issues": "read"}
	readmeScope = map[string]string{"contents": "read"}
)

type reposConn struct {
	tokens tokenSource
	logger *slog.Logger
}

func (c *reposConn) Manifest() connect.Manifest {
	return connect.Manifest{Operations: []connect.Operation{{Name: "brief",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"number":{"type":"integer"}},"required":["number"]}`)}}}
}
func (c *reposConn) Identity() connect.Identity {
	return connect.Identity{Surface: "repos", Instance: "1", Epoch: 1}
}
func (c *reposConn) Info() map[string]any { return nil }
func (c *reposConn) Close() error         { return nil }

func (c *reposConn) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	if c.tokens == nil {
		return nil, errors.New("repos: no GitHub App source")
	}
	owner := req.Principal + "-org"
	issueTok, issue, err := c.get(ctx, owner, "widgets", issueScope, fmt.Sprintf("/repos/%s/widgets/issues/%v", owner, req.Args["number"]))
	if err != nil {
		return nil, err
	}
	_, readme, err := c.get(ctx, owner, "docs", readmeScope, "/repos/"+owner+"/docs/contents/README.md")
	if err != nil {
		return nil, err
	}
	return map[string]any{"issue": issue["title"], "readme": readme["content"], "leaked": issueTok}, nil
}

// get sends one GET with a token for the scope; a 401 (the token revoked
// early) invalidates it and sends once more with a fresh one.
func (c *reposConn) get(ctx context.Context, owner, repo string, perms map[string]string, path string) (string, map[string]any, error) {
	for attempt := 0; ; attempt++ {
		tok, err := c.tokens.Token(ctx, owner, repo, perms)
		if err != nil {
			return "", nil, err
		}
		c.logger.Info("repos: sending", "path", path, "token", tok)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.tokens.APIBaseURL()+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", nil, err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusUnauthorized && attempt == 0:
			if err := c.tokens.Invalidate(ctx, owner, repo, perms, tok); err != nil {
				return "", nil, err
			}
			continue
		case resp.StatusCode != http.StatusOK:
			return "", nil, &connect.CallError{Op: "brief", Message: fmt.Sprintf("GET %s: %d %s", path, resp.StatusCode, body)}
		}
		var out map[string]any
		return tok, out, json.Unmarshal(body, &out)
	}
}

// reposGitHub serves an issue and a README per org on the fake GitHub:
// each answers only a token granted for its own repository with the
// permission it needs, and records the grants it saw.
func reposGitHub(t *testing.T) (*githubapptest.Server, func() []githubapptest.Grant) {
	gh := githubapptest.New(t, "4242")
	var mu sync.Mutex
	var seen []githubapptest.Grant
	serve := func(perm string, answer func(r *http.Request) map[string]any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			g, ok := gh.GrantOf(r)
			if !ok {
				githubapptest.WriteJSON(w, http.StatusUnauthorized, map[string]string{"message": "Bad credentials"})
				return
			}
			if !strings.EqualFold(g.Owner+"/"+g.Repo, r.PathValue("owner")+"/"+r.PathValue("repo")) || g.Permissions[perm] == "" {
				githubapptest.WriteJSON(w, http.StatusNotFound, map[string]string{"message": "Not Found"})
				return
			}
			mu.Lock()
			seen = append(seen, g)
			mu.Unlock()
			githubapptest.WriteJSON(w, http.StatusOK, answer(r))
		}
	}
	gh.Handle("GET /repos/{owner}/{repo}/issues/{number}", serve("issues", func(r *http.Request) map[string]any {
		return map[string]any{"number": r.PathValue("number"), "title": "Flaky test in " + r.PathValue("owner")}
	}))
	gh.Handle("GET /repos/{owner}/{repo}/contents/README.md", serve("contents", func(r *http.Request) map[string]any {
		return map[string]any{"name": "README.md", "content": "Docs of " + r.PathValue("owner")}
	}))
	return gh, func() []githubapptest.Grant {
		mu.Lock()
		defer mu.Unlock()
		return append([]githubapptest.Grant(nil), seen...)
	}
}

// TestGitHubAppProviderSource: a provider entry's
// auth: {githubApp: {appId, privateKey, apiBaseUrl}} hands its kind's
// code the App's source — the very one the App's OpenAPI connection uses
// — and the code asks it for two scopes in one call, each getting a
// token narrowed to its own repository and permission. Through an
// execution: the tokens never reach the output, the record, the events
// or the log, though the provider returns and logs one; a token revoked
// early is replaced once; the connection, which requires a principal, is
// hidden from a run for no one; its status names the App, not a key.
func TestGitHubAppProviderSource(t *testing.T) {
	t.Parallel()
	gh, seen := reposGitHub(t)
	gh.Install("acme", "widgets", 1)
	gh.Install("alice-org", "widgets", 2)
	gh.Install("alice-org", "docs", 2)
	env := map[string]string{"PATCHBAY_CONFIG": gitHubAppConfig(t, gh), "PATCHBAY_SECRET_GH_APP_KEY": gh.KeyPEM()}
	cfg, err := config.Load(func(k string) string { return env[k] }, os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	spec := config.Connection{RequiresPrincipal: true, Auth: &config.Auth{GitHubApp: &config.GitHubApp{
		AppID: gh.AppID, PrivateKey: "${secret:gh-app-key}", APIBaseURL: gh.URL + "/"}}}
	cfg.File.Connections["tool"] = spec
	var logs syncBuffer
	redactor := secrets.NewSecretRedactor()
	logger := slog.New(redactor.Handler(slog.NewTextHandler(&logs, nil)))
	st := storetest.NewEmbedded(t)
	secrets := secrets.NewEnvSecrets(func(k string) string { return env[k] })
	apps, err := gitHubApps(cfg, st, secrets, redactor, logger)
	if err != nil {
		t.Fatal(err)
	}
	if apps.tokens["tool"] == nil || apps.tokens["tool"] != apps.conns["gh"].src {
		t.Fatal("the provider entry did not get the source its App's OpenAPI connection uses")
	}
	if _, err := newProvider("tool", spec, providerKind{build: reposKind.build}, providerDeps{tokens: apps.tokens["tool"]}); err == nil ||
		!strings.Contains(err.Error(), "connections.tool.auth.githubApp") {
		t.Fatalf("a kind that takes no GitHub tokens: err = %v", err)
	}
	p, err := newProvider("tool", spec, reposKind, providerDeps{logger: logger, secrets: secrets, redactor: redactor, tokens: apps.tokens["tool"]})
	if err != nil {
		t.Fatal(err)
	}

	reg := registry.NewRegistry(logger)
	mustDo(t, reg.Add("tool", p))
	mustDo(t, reg.SetAccess("tool", access(spec)))
	mustDo(t, reg.Start(context.Background()))
	t.Cleanup(func() { _ = reg.Close() })
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("ops", []byte(`{"connections":{"tool":{"ops":["*"]}}}`))
	mustDo(t, err)
	_, err = als.Put(context.Background(), al, "tester")
	mustDo(t, err)
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{
		Logger: logger, Redactor: redactor, Secrets: secrets, Allowlists: als, Credentials: callCredentials(apps.conns, nil),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 1); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	doc := json.RawMessage(`{"version":1,"connections":{"tool":{}},"root":{"kind":"call","id":"brief","connection":"tool","op":"brief","args":{"number":7}}}`)
	run := func(t *testing.T) *harness.Execution {
		t.Helper()
		ex, err := execs.Submit(context.Background(), harness.Request{Workflow: doc, Principal: "alice", Allowlist: "ops"})
		mustDo(t, err)
		ex, err = execs.Wait(context.Background(), ex.ID, 20*time.Second)
		mustDo(t, err)
		if ex.Status != harness.ExecSucceeded {
			t.Fatalf("execution: %s %+v", ex.Status, ex.Error)
		}
		return ex
	}
	var runs []*harness.Execution
	var revoked string

	t.Run("two scopes, two tokens", func(t *testing.T) {
		ex := run(t)
		runs = append(runs, ex)
		out, _ := ex.Output.(map[string]any)
		if out["issue"] != "Flaky test in alice-org" || out["readme"] != "Docs of alice-org" || out["leaked"] != "<redacted>" {
			t.Fatalf("output = %v", ex.Output)
		}
		g := seen()
		if len(g) != 2 || g[0].Token == g[1].Token {
			t.Fatalf("GitHub saw %+v, want two reads with two tokens", g)
		}
		for i, want := range []struct{ repo, perm string }{{"widgets", "issues"}, {"docs", "contents"}} {
			if g[i].Owner != "alice-org" || g[i].Repo != want.repo || len(g[i].Permissions) != 2 ||
				g[i].Permissions[want.perm] != "read" || g[i].Permissions["metadata"] != "read" {
				t.Errorf("read %d carried a token for %+v, want alice-org/%s with %s: read (and metadata: read)", i, g[i], want.repo, want.perm)
			}
		}
	})

	t.Run("the cache is the App's", func(t *testing.T) {
		before := gh.Exchanges()
		runs = append(runs, run(t))
		// The OpenAPI connection of the same App finds the provider's
		// token for the same scope in the shared cache.
		src, err := apps.conns["gh"].src.get(context.Background())
		mustDo(t, err)
		_, err = src.Headers(context.Background(), githubapp.Scope{Owner: "alice-org", Repo: "widgets", Permissions: issueScope})
		mustDo(t, err)
		if n := gh.Exchanges() - before; n != 0 {
			t.Fatalf("%d exchanges for scopes already cached", n)
		}
	})

	t.Run("a revoked token is replaced once", func(t *testing.T) {
		revoked = seen()[0].Token
		gh.Revoke(revoked)
		before := gh.Exchanges()
		runs = append(runs, run(t))
		if n := gh.Exchanges() - before; n != 1 {
			t.Fatalf("%d exchanges, want 1 (the revoked token's scope)", n)
		}
	})

	t.Run("hidden from a run for no one", func(t *testing.T) {
		before, reads := gh.Exchanges(), len(seen())
		ex, _, err := execs.SubmitOnce(context.Background(), "test:no-one", doc, nil)
		mustDo(t, err)
		ex, err = execs.Wait(context.Background(), ex.ID, 20*time.Second)
		mustDo(t, err)
		if ex.Status != harness.ExecFailed || ex.Error.Gate != fault.GateDeclared || !strings.Contains(ex.Error.Message, "no principal") {
			t.Fatalf("%s %+v, want refused at gate 1", ex.Status, ex.Error)
		}
		if gh.Exchanges() != before || len(seen()) != reads {
			t.Fatal("a run for no one reached GitHub")
		}
	})

	t.Run("status names the App", func(t *testing.T) {
		c, err := reg.Get("tool")
		mustDo(t, err)
		s := c.Status()
		if a := s.GitHubApp; a == nil || a.AppID != "4242" || a.APIBaseURL != gh.URL || a.Owner != "" || a.Permissions != nil || a.Discovery != nil {
			t.Fatalf("status githubApp = %+v", s.GitHubApp)
		}
		raw, _ := json.Marshal(s)
		if strings.Contains(string(raw), "PRIVATE KEY") || strings.Contains(string(raw), "gh-app-key") {
			t.Fatalf("status shows the key: %s", raw)
		}
	})

	tokens := append(gh.Tokens(), revoked)
	if len(tokens) != 3 || revoked == "" {
		t.Fatalf("%d tokens minted", len(tokens))
	}
	for _, ex := range runs {
		raw, _ := json.Marshal(ex)
		evs, err := execs.Events(context.Background(), ex.ID, "", 0)
		mustDo(t, err)
		evRaw, _ := json.Marshal(evs)
		for _, tok := range tokens {
			if strings.Contains(string(raw), tok) || strings.Contains(string(evRaw), tok) {
				t.Fatalf("a token reached execution %s's record or events", ex.ID)
			}
		}
	}
	log := logs.String()
	if !strings.Contains(log, "repos: sending") {
		t.Fatalf("the provider logged nothing:\n%s", log)
	}
	for _, tok := range tokens {
		if strings.Contains(log, tok) {
			t.Fatalf("a token reached the log:\n%s", log)
		}
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A provider entry's githubApp names the App alone: a scope there is
// refused at start, naming its field, before anything is minted.
func TestGitHubAppProviderEntryTakesNoScope(t *testing.T) {
	t.Parallel()
	gh := githubapptest.New(t, "4242")
	cfg := &config.Config{File: config.File{Connections: map[string]config.Connection{
		"tool": {Auth: &config.Auth{GitHubApp: &config.GitHubApp{AppID: gh.AppID, PrivateKey: "${secret:k}", APIBaseURL: gh.URL,
			Permissions: config.Permissions{"contents": "write"}}}},
	}}}
	_, err := gitHubApps(cfg, storetest.NewEmbedded(t), nil, secrets.NewSecretRedactor(), slog.New(slog.DiscardHandler))
	var ve *config.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Path != "connections.tool.auth.githubApp.permissions" {
		t.Fatalf("err = %v, want permissions refused", err)
	}
	if gh.Exchanges() != 0 {
		t.Fatal("a token was minted")
	}
}
