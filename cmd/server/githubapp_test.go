package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/githubapp/githubapptest"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// issuesDoc is a GitHub-like description of two issue operations, with
// GitHub's operationIds.
const issuesDoc = `{"openapi": "3.0.3", "info": {"title": "issues", "version": "1"},
 "paths": {
  "/repos/{owner}/{repo}/issues": {"post": {"operationId": "issues/create",
    "parameters": [{"name": "owner", "in": "path", "required": true, "schema": {"type": "string"}},
                   {"name": "repo", "in": "path", "required": true, "schema": {"type": "string"}}],
    "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["title"],
      "properties": {"title": {"type": "string"}, "body": {"type": "string"}}}}}},
    "responses": {"201": {"description": "created"}}}},
  "/repos/{owner}/{repo}/issues/{issue_number}": {"get": {"operationId": "issues/get",
    "parameters": [{"name": "owner", "in": "path", "required": true, "schema": {"type": "string"}},
                   {"name": "repo", "in": "path", "required": true, "schema": {"type": "string"}},
                   {"name": "issue_number", "in": "path", "required": true, "schema": {"type": "integer"}}],
    "responses": {"200": {"description": "ok"}}}}}}`

// issuesAPI serves issuesDoc and its operations on the fake GitHub. Each
// request must carry an installation token granted for its repository
// (GitHub answers 404 for a repository the token does not cover); the
// API records which token each call carried.
type issuesAPI struct {
	gh *githubapptest.Server

	mu     sync.Mutex
	doc    []githubapptest.Grant // the grants the document requests carried
	calls  []githubapptest.Grant // the grants the API calls carried
	issues map[string][]map[string]any
}

func newIssuesAPI(t *testing.T) *issuesAPI {
	a := &issuesAPI{gh: githubapptest.New(t, "4242"), issues: map[string][]map[string]any{}}
	a.gh.Handle("GET /openapi.json", func(w http.ResponseWriter, r *http.Request) {
		g, _ := a.gh.GrantOf(r)
		a.mu.Lock()
		a.doc = append(a.doc, g)
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, issuesDoc)
	})
	a.gh.Handle("POST /repos/{owner}/{repo}/issues", a.create)
	a.gh.Handle("GET /repos/{owner}/{repo}/issues/{number}", a.get)
	return a
}

// grant checks the request's token covers its repository with the
// permission needed.
func (a *issuesAPI) grant(w http.ResponseWriter, r *http.Request, level string) (string, bool) {
	g, ok := a.gh.GrantOf(r)
	if !ok {
		githubapptest.WriteJSON(w, http.StatusUnauthorized, map[string]string{"message": "Bad credentials"})
		return "", false
	}
	repo := strings.ToLower(r.PathValue("owner") + "/" + r.PathValue("repo"))
	if repo != strings.ToLower(g.Owner+"/"+g.Repo) || (level == "write" && g.Permissions["issues"] != "write") || g.Permissions["issues"] == "" {
		githubapptest.WriteJSON(w, http.StatusNotFound, map[string]string{"message": "Not Found"})
		return "", false
	}
	a.mu.Lock()
	a.calls = append(a.calls, g)
	a.mu.Unlock()
	return repo, true
}

func (a *issuesAPI) create(w http.ResponseWriter, r *http.Request) {
	repo, ok := a.grant(w, r, "write")
	if !ok {
		return
	}
	var in map[string]any
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		githubapptest.WriteJSON(w, http.StatusBadRequest, map[string]string{"message": "Problems parsing JSON"})
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	issue := map[string]any{"number": len(a.issues[repo]) + 1, "title": in["title"], "body": in["body"], "state": "open",
		"html_url": "https://github.com/" + repo + "/issues/" + fmt.Sprint(len(a.issues[repo])+1)}
	a.issues[repo] = append(a.issues[repo], issue)
	githubapptest.WriteJSON(w, http.StatusCreated, issue)
}

func (a *issuesAPI) get(w http.ResponseWriter, r *http.Request) {
	repo, ok := a.grant(w, r, "read")
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, issue := range a.issues[repo] {
		if fmt.Sprint(issue["number"]) == r.PathValue("number") {
			githubapptest.WriteJSON(w, http.StatusOK, issue)
			return
		}
	}
	githubapptest.WriteJSON(w, http.StatusNotFound, map[string]string{"message": "Not Found"})
}

// called is the grants the API calls carried.
func (a *issuesAPI) called() []githubapptest.Grant {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]githubapptest.Grant(nil), a.calls...)
}

// gitHubAppConfig is a config with one OpenAPI connection, gh, whose
// calls carry a token for the caller's own org (<principal>-org/widgets),
// and four callers; carol's and dave's orgs have no installation.
func gitHubAppConfig(t *testing.T, gh *githubapptest.Server) string {
	return writeConfig(t, fmt.Sprintf(`
connections:
  gh:
    openapi: { url: %[1]q, baseUrl: %[2]q, docAuth: true }
    requiresPrincipal: true
    auth:
      githubApp:
        appId: %[3]q
        privateKey: "${secret:gh-app-key}"
        apiBaseUrl: %[2]q
        owner: { $expr: "principal + '-org'" }
        repo: widgets
        permissions: { issues: write }
        discovery: { owner: acme, repo: widgets, permissions: { metadata: read } }
apiKeys:
  - { name: alice, key: k-alice, allowlist: default }
  - { name: bob, key: k-bob, allowlist: default }
  - { name: carol, key: k-carol, allowlist: default }
  - { name: dave, key: k-dave, allowlist: default }
allowlists:
  default:
    connections:
      gh: { ops: ["*"] }
`, gh.URL+"/openapi.json", gh.URL, gh.AppID))
}

// TestGitHubAppOpenAPI: an OpenAPI connection authenticated by a GitHub
// App, end to end through POST /v1/executions. Each principal's calls
// carry a token minted for its own org's installation; the document
// request carries the narrow discovery token; a token never shows in a
// record, an event or the log; an org without the App fails the call with
// not_installed and leaves the connection ready; a secondary rate limit
// fails it with rate_limited and GitHub's retry-after; a token revoked
// early is replaced once.
func TestGitHubAppOpenAPI(t *testing.T) {
	t.Parallel()
	api := newIssuesAPI(t)
	gh := api.gh
	gh.Install("acme", "widgets", 1)
	gh.Install("alice-org", "widgets", 2)
	gh.Install("bob-org", "widgets", 3)
	cfg := gitHubAppConfig(t, gh)
	for mode, redisURL := range redisModes(t) {
		t.Run(mode, func(t *testing.T) {
			srv := start(t, map[string]string{
				"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_SECRET_GH_APP_KEY": gh.KeyPEM(),
				"PATCHBAY_SECRET_KEY": "0123456789abcdef0123456789abcdef",
				"REDIS_URL":           redisURL, "PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
			})
			var conn struct {
				State     string                  `json:"state"`
				Tools     []string                `json:"tools"`
				GitHubApp *registry.GitHubAppAuth `json:"githubApp"`
			}
			getJSONAs(t, srv.url+"/v1/connections/gh", "k-alice", &conn)
			if conn.State != "ready" || strings.Join(conn.Tools, " ") != "gh_issues_create gh_issues_get" {
				t.Fatalf("connection = %+v", conn)
			}
			// Status names the App and the scope as configured.
			if a := conn.GitHubApp; a == nil || a.AppID != gh.AppID || a.APIBaseURL != gh.URL || a.Owner != "" || a.OwnerExpr != "principal + '-org'" ||
				a.Repo != "widgets" || a.Permissions["issues"] != "write" || a.Discovery == nil || a.Discovery.Owner != "acme" {
				t.Fatalf("status githubApp = %+v", conn.GitHubApp)
			}
			api.mu.Lock()
			doc := api.doc[len(api.doc)-1]
			api.mu.Unlock()
			if doc.Owner != "acme" || doc.Repo != "widgets" || len(doc.Permissions) != 1 || doc.Permissions["metadata"] != "read" {
				t.Fatalf("the document request carried %+v, want the discovery scope", doc)
			}

			ids := map[string]string{}
			for _, who := range []string{"alice", "bob"} {
				before := len(api.called())
				ex := postAny(t, srv.url, "k-"+who, []byte(fmt.Sprintf(`{"wait":"10s","workflow":{"version":1,
					"connections":{"gh":{}},"root":{"kind":"sequence","id":"main","steps":[
					{"kind":"call","id":"open","connection":"gh","op":"issues/create","args":{"owner":"%[1]s-org","repo":"widgets","title":"from %[1]s"}},
					{"kind":"call","id":"read","connection":"gh","op":"issues/get","args":{"owner":"%[1]s-org","repo":"widgets","issue_number":{"$expr":"$steps.open.number"}}}]}}}`, who)))
				if ex["status"] != "succeeded" {
					t.Fatalf("%s: execution = %v", who, ex)
				}
				if out, _ := ex["output"].(map[string]any); out["title"] != "from "+who {
					t.Fatalf("%s: output = %v", who, ex["output"])
				}
				for _, g := range api.called()[before:] {
					if g.Owner != who+"-org" || g.Repo != "widgets" || g.Permissions["issues"] != "write" {
						t.Fatalf("%s's call carried a token for %+v", who, g)
					}
				}
				ids[who] = ex["id"].(string)
			}
			if calls := api.called(); calls[len(calls)-1].Token == calls[len(calls)-3].Token {
				t.Fatal("alice and bob's calls carried the same token")
			}

			t.Run("not installed", func(t *testing.T) {
				before := len(api.called())
				ex := postAny(t, srv.url, "k-carol", []byte(`{"wait":"10s","workflow":{"version":1,"connections":{"gh":{}},
					"root":{"kind":"call","id":"open","connection":"gh","op":"issues/create","args":{"owner":"carol-org","repo":"widgets","title":"x"}}}}`))
				if ex["status"] != "failed" || !strings.Contains(fmt.Sprint(ex["error"]), "not_installed") {
					t.Fatalf("execution = %v, want failed with not_installed", ex)
				}
				if n := len(api.called()); n != before {
					t.Fatalf("%d calls reached the API", n-before)
				}
				getJSONAs(t, srv.url+"/v1/connections/gh", "k-alice", &conn)
				if conn.State != "ready" {
					t.Fatalf("after carol's failure the connection is %s", conn.State)
				}
				ids["carol"] = ex["id"].(string)
			})

			t.Run("rate limited", func(t *testing.T) {
				gh.ReplyTo("dave-org", "widgets", githubapptest.Reply{Status: http.StatusForbidden,
					Header: map[string]string{"Retry-After": "30"}, Body: `{"message":"You have exceeded a secondary rate limit."}`})
				ex := postAny(t, srv.url, "k-dave", []byte(`{"wait":"10s","workflow":{"version":1,"connections":{"gh":{}},
					"root":{"kind":"call","id":"open","connection":"gh","op":"issues/create","args":{"owner":"dave-org","repo":"widgets","title":"x"}}}}`))
				msg := fmt.Sprint(ex["error"])
				if ex["status"] != "failed" || !strings.Contains(msg, "rate_limited") || !strings.Contains(msg, "retry after 30s") {
					t.Fatalf("execution = %v, want failed with rate_limited and its retry-after", ex)
				}
				ids["dave"] = ex["id"].(string)
			})

			t.Run("revoked token replaced once", func(t *testing.T) {
				calls := api.called()
				var old string
				for _, g := range calls {
					if g.Owner == "alice-org" {
						old = g.Token
					}
				}
				gh.Revoke(old)
				ex := postAny(t, srv.url, "k-alice", []byte(`{"wait":"10s","workflow":{"version":1,"connections":{"gh":{}},
					"root":{"kind":"call","id":"read","connection":"gh","op":"issues/get","args":{"owner":"alice-org","repo":"widgets","issue_number":1}}}}`))
				if ex["status"] != "succeeded" {
					t.Fatalf("execution = %v", ex)
				}
				if last := api.called()[len(api.called())-1]; last.Token == old || last.Owner != "alice-org" {
					t.Fatalf("the retried call carried %+v", last)
				}
				ids["alice-again"] = ex["id"].(string)
			})

			tokens := gh.Tokens()
			if len(tokens) < 3 {
				t.Fatalf("%d tokens issued", len(tokens))
			}
			for who, id := range ids {
				key := "k-" + strings.TrimSuffix(who, "-again")
				checkNoSecretAs(t, srv.url, key, id, append(tokens, gh.KeyPEM()[40:80])...)
			}
			out := srv.output.String()
			for _, tok := range tokens {
				if strings.Contains(out, tok) {
					t.Fatalf("an installation token reached the log:\n%s", out)
				}
			}
		})
	}
}

func getJSONAs(t *testing.T, url, key string, v any) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s = %d %s", url, resp.StatusCode, data)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatal(err)
	}
}

// TestGitHubAppCredentialsForNoOne: a scope that depends on the principal
// is never evaluated for a run without one (requiresPrincipal hides the
// connection from such runs first; this is the second fence), and no
// exchange is attempted.
func TestGitHubAppCredentialsForNoOne(t *testing.T) {
	t.Parallel()
	gh := githubapptest.New(t, "4242")
	gh.Install("acme", "widgets", 1)
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"PATCHBAY_CONFIG": gitHubAppConfig(t, gh), "PATCHBAY_SECRET_GH_APP_KEY": gh.KeyPEM()}[k]
	}, os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	st := storetest.NewEmbedded(t)
	apps, err := gitHubApps(cfg, st, secrets.NewEnvSecrets(func(k string) string {
		return map[string]string{"PATCHBAY_SECRET_GH_APP_KEY": gh.KeyPEM()}[k]
	}), secrets.NewSecretRedactor(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	creds := callCredentials(apps.conns, nil)
	for _, principal := range []string{"", harness.HostPrincipal} {
		if _, _, err := creds.Headers(context.Background(), "gh", principal); err == nil || !strings.Contains(err.Error(), "runs for no one") {
			t.Fatalf("principal %q: err = %v", principal, err)
		}
	}
	if _, ok, err := creds.Headers(context.Background(), "other", "alice"); ok || err != nil {
		t.Fatalf("a connection without credentials: ok %v err %v", ok, err)
	}
	if n := gh.Exchanges(); n != 0 {
		t.Fatalf("%d exchanges", n)
	}
}

// TestGitHubAppAgentOpensIssue: a model turn (the agent shorthand, a fake
// model server) opens an issue through the App-authenticated connection.
// The call carries alice's org's token; neither the model, nor the
// record, the events or the log ever see it.
func TestGitHubAppAgentOpensIssue(t *testing.T) {
	t.Parallel()
	api := newIssuesAPI(t)
	gh := api.gh
	gh.Install("acme", "widgets", 1)
	gh.Install("alice-org", "widgets", 2)
	llm := newScriptedCalls(t, []scriptedCall{
		{Tool: "gh_issues_create", Args: `{"owner": "alice-org", "repo": "widgets", "title": "Flaky test", "body": "seen twice"}`},
	}, "Opened issue 1.")
	cfg := writeConfig(t, mustRead(t, gitHubAppConfig(t, gh))+fmt.Sprintf("models:\n  local: { type: openai, baseURL: %q }\n", llm.URL+"/v1"))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_SECRET_GH_APP_KEY": gh.KeyPEM(),
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	})
	status, ex := post2(strings.TrimPrefix(srv.url, "http://"), "k-alice",
		[]byte(`{"agent":{"model":"local/llama3","instructions":"Open an issue about the flaky test."},"input":"go"}`))
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ex)
	}
	ex = waitDoneAs(t, srv.url, "k-alice", ex["id"].(string))
	if ex["status"] != "succeeded" || ex["output"] != "Opened issue 1." {
		t.Fatalf("execution = %v", ex)
	}
	calls := api.called()
	if len(calls) != 1 || calls[0].Owner != "alice-org" || calls[0].Permissions["issues"] != "write" {
		t.Fatalf("API calls carried %+v", calls)
	}
	llm.mu.Lock()
	results := strings.Join(llm.results, "\n")
	llm.mu.Unlock()
	if !strings.Contains(results, "Flaky test") {
		t.Fatalf("tool results sent to the model: %q", results)
	}
	for _, tok := range gh.Tokens() {
		if strings.Contains(results, tok) || strings.Contains(srv.output.String(), tok) {
			t.Fatal("an installation token reached the model or the log")
		}
	}
	checkNoSecretAs(t, srv.url, "k-alice", ex["id"].(string), gh.Tokens()...)
}

// TestGitHubAppMCP: a remote MCP server authenticated by a GitHub App.
// The connection's own session (initialize, tools/list) carries the
// discovery token; alice's call goes in a session of hers, with her
// org's token.
func TestGitHubAppMCP(t *testing.T) {
	t.Parallel()
	gh := githubapptest.New(t, "4242")
	gh.Install("acme", "widgets", 1)
	gh.Install("alice-org", "widgets", 2)
	var mu sync.Mutex
	seen := map[string][]string{} // JSON-RPC method → the owners of the tokens it carried
	demoSrv := server.NewStreamableHTTPServer(demo.NewServer())
	mcpHTTP := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g, ok := gh.GrantOf(r)
		if !ok {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var msg struct {
			Method string `json:"method"`
		}
		_ = json.Unmarshal(body, &msg)
		mu.Lock()
		seen[msg.Method] = append(seen[msg.Method], g.Owner)
		mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		demoSrv.ServeHTTP(w, r)
	}))
	t.Cleanup(mcpHTTP.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  remote:
    mcp: { url: %[1]q }
    requiresPrincipal: true
    auth:
      githubApp:
        appId: %[2]q
        privateKey: "${secret:gh-app-key}"
        apiBaseUrl: %[3]q
        owner: { $expr: "principal + '-org'" }
        repo: widgets
        permissions: { contents: read }
        discovery: { owner: acme, repo: widgets, permissions: { metadata: read } }
apiKeys:
  - { name: alice, key: k-alice, allowlist: default }
allowlists:
  default: { connections: { remote: { ops: ["*"] } } }
`, mcpHTTP.URL+"/mcp", gh.AppID, gh.URL))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_SECRET_GH_APP_KEY": gh.KeyPEM(),
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	})
	ex := postAny(t, srv.url, "k-alice", []byte(`{"wait":"10s","workflow":{"version":1,"connections":{"remote":{}},
		"root":{"kind":"call","id":"sum","connection":"remote","op":"add","args":{"a":2,"b":3}}}}`))
	if ex["status"] != "succeeded" {
		t.Fatalf("execution = %v", ex)
	}
	mu.Lock()
	defer mu.Unlock()
	if lists := seen["tools/list"]; len(lists) == 0 || lists[0] != "acme" {
		t.Fatalf("tools/list carried tokens of %v, want the discovery scope's (acme)", lists)
	}
	if calls := seen["tools/call"]; len(calls) != 1 || calls[0] != "alice-org" {
		t.Fatalf("tools/call carried tokens of %v, want alice-org's", calls)
	}
	checkNoSecretAs(t, srv.url, "k-alice", ex["id"].(string), gh.Tokens()...)
}

// TestGitHubAppNeedsSecretKeyOnRedis: tokens are sealed under
// PATCHBAY_SECRET_KEY, which every replica must share, so a githubApp
// connection on a real Redis without it is refused at start.
func TestGitHubAppNeedsSecretKeyOnRedis(t *testing.T) {
	t.Parallel()
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ")")
	}
	gh := githubapptest.New(t, "4242")
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"PATCHBAY_CONFIG": gitHubAppConfig(t, gh)}[k]
	}, os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	st := storetest.New(t)
	_, err = gitHubApps(cfg, st, nil, secrets.NewSecretRedactor(), slog.New(slog.DiscardHandler))
	var ve *config.ValidationError
	if !errors.As(err, &ve) || ve.Problems[0].Path != "PATCHBAY_SECRET_KEY" || !strings.Contains(ve.Problems[0].Message, "auth: githubApp") {
		t.Fatalf("err = %v, want PATCHBAY_SECRET_KEY required", err)
	}
}

// TestGitHubAppKeyResolvedOnFirstUse: the private key is read from the
// secret chain when a token is first needed; a key that is missing then
// fails that call (naming the secret, not a value) and is looked up
// again on the next.
func TestGitHubAppKeyResolvedOnFirstUse(t *testing.T) {
	t.Parallel()
	gh := githubapptest.New(t, "4242")
	gh.Install("alice-org", "widgets", 2)
	cfg, err := config.Load(func(k string) string {
		return map[string]string{"PATCHBAY_CONFIG": gitHubAppConfig(t, gh)}[k]
	}, os.ReadFile)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	env := map[string]string{}
	fromEnv := secrets.NewEnvSecrets(func(k string) string {
		mu.Lock()
		defer mu.Unlock()
		return env[k]
	})
	apps, err := gitHubApps(cfg, storetest.NewEmbedded(t), fromEnv, secrets.NewSecretRedactor(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	creds := callCredentials(apps.conns, nil)
	if _, _, err := creds.Headers(context.Background(), "gh", "alice"); err == nil || !strings.Contains(err.Error(), "${secret:gh-app-key}") {
		t.Fatalf("without the key: err = %v", err)
	}
	mu.Lock()
	env["PATCHBAY_SECRET_GH_APP_KEY"] = gh.KeyPEM()
	mu.Unlock()
	h, ok, err := creds.Headers(context.Background(), "gh", "alice")
	if err != nil || !ok || !strings.HasPrefix(h["Authorization"], "Bearer ghs_") {
		t.Fatalf("with the key: %v %v %v", h, ok, err)
	}
}

// TestGitHubAppHiddenFromTriggerTurns: a connection whose token's scope
// follows the caller (requiresPrincipal) is hidden from a trigger turn,
// which runs for no one: its call is refused at gate 1, before any token
// is asked for or any request sent.
func TestGitHubAppHiddenFromTriggerTurns(t *testing.T) {
	t.Parallel()
	api := newIssuesAPI(t)
	gh := api.gh
	gh.Install("acme", "widgets", 1)
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cfg := strings.Replace(mustRead(t, gitHubAppConfig(t, gh)), "apiKeys:\n", fmt.Sprintf(`  jobs:
    source: { events: { job.done: { type: object } } }
    webhooks: { secrets: [%q] }
triggers:
  - id: file
    connection: jobs
    event: job.done
    workflow:
      version: 1
      connections: { gh: {} }
      root: { kind: call, id: open, connection: gh, op: issues/create, args: { owner: acme, repo: widgets, title: x } }
apiKeys:
  - { name: reader, key: k-reader, allowlist: none, roles: [read] }
`, secret), 1)
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": writeConfig(t, cfg), "PATCHBAY_SECRET_GH_APP_KEY": gh.KeyPEM(),
	})
	exchanges := gh.Exchanges() // the discovery token the document request carried
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"type":"job.done","id":"evt-1","payload":{}}`)
	now := time.Now()
	sig, _ := wh.Sign("msg-1", now, body)
	req, _ := http.NewRequest("POST", srv.url+"/hooks/jobs", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", "msg-1")
	req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("webhook = %d", resp.StatusCode)
	}
	var list struct {
		Executions []map[string]any `json:"items"`
	}
	var ex map[string]any
	for deadline := time.Now().Add(20 * time.Second); ex == nil && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		getJSONAs(t, srv.url+"/v1/executions", "k-reader", &list)
		for _, e := range list.Executions {
			if e["status"] == "failed" || e["status"] == "succeeded" {
				ex = e
			}
		}
	}
	if ex == nil || ex["status"] != "failed" {
		t.Fatalf("trigger turn = %v (listed %v)", ex, list.Executions)
	}
	_, full := get2(strings.TrimPrefix(srv.url, "http://"), "k-reader", "/v1/executions/"+ex["id"].(string))
	e, _ := full["error"].(map[string]any)
	if e["gate"] != 1.0 || !strings.Contains(fmt.Sprint(e["message"]), "no principal") {
		t.Fatalf("trigger turn error = %v, want refused at gate 1", full["error"])
	}
	if n := gh.Exchanges() - exchanges; n != 0 || len(api.called()) != 0 {
		t.Fatalf("%d exchanges, %d API calls for the trigger turn", n, len(api.called()))
	}
}
