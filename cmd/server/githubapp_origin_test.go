package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/githubapp/githubapptest"
)

// awayDoc has one operation, which the fake GitHub answers with a
// redirect; farDoc's servers name another origin than GitHub's.
const awayDoc = `{"openapi":"3.0.3","info":{"title":"t","version":"1"},"paths":{"/repos/{owner}/{repo}/away":{"get":{"operationId":"away",
 "parameters":[{"name":"owner","in":"path","required":true,"schema":{"type":"string"}},{"name":"repo","in":"path","required":true,"schema":{"type":"string"}}],
 "responses":{"200":{"description":"ok"}}}}}}`

// TestGitHubAppTokenStaysOnGitHub: an installation token goes to the
// App's apiBaseUrl only. A call GitHub redirects to another port of its
// host fails without the token going there; a document whose servers
// name another origin is refused at load naming both; and GitHub's own
// words about a refused exchange are in the step's error.
func TestGitHubAppTokenStaysOnGitHub(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var stolen []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		stolen = append(stolen, r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	t.Cleanup(other.Close)
	gh := githubapptest.New(t, "4242")
	gh.Install("acme", "widgets", 1)
	gh.Install("acme", "gadgets", 2)
	gh.ReplyTo("acme", "gadgets", githubapptest.Reply{Status: http.StatusUnauthorized,
		Body: `{"message":"'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires","documentation_url":"https://docs.github.com/rest"}`})
	gh.Handle("GET /away.json", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, awayDoc) })
	gh.Handle("GET /far.json", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, strings.Replace(awayDoc, `"paths"`, fmt.Sprintf(`"servers":[{"url":%q}],"paths"`, other.URL), 1))
	})
	gh.Handle("GET /repos/{owner}/{repo}/away", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/stolen", http.StatusFound)
	})
	app := func(repo string) string {
		return fmt.Sprintf(`{ githubApp: { appId: %q, privateKey: "${secret:gh-app-key}", apiBaseUrl: %q, owner: acme, repo: %s, permissions: { contents: read },
			discovery: { owner: acme, repo: widgets, permissions: { metadata: read } } } }`, gh.AppID, gh.URL, repo)
	}
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  gh:  { openapi: { url: %[1]q, baseUrl: %[2]q }, auth: %[3]s }
  far: { openapi: { url: %[4]q }, auth: %[3]s }
  gadgets: { openapi: { url: %[1]q, baseUrl: %[2]q }, auth: %[5]s }
apiKeys:
  - { name: alice, key: k-alice, allowlist: default }
allowlists:
  default:
    connections: { gh: { ops: ["*"] }, far: { ops: ["*"] }, gadgets: { ops: ["*"] } }
`, gh.URL+"/away.json", gh.URL, app("widgets"), gh.URL+"/far.json", app("gadgets")))
	srv := start(t, map[string]string{"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_SECRET_GH_APP_KEY": gh.KeyPEM()})

	var far struct {
		State     string `json:"state"`
		LastError string `json:"lastError"`
	}
	getJSONAs(t, srv.url+"/v1/connections/far", "k-alice", &far)
	if far.State != "unavailable" || !strings.Contains(far.LastError, other.URL) || !strings.Contains(far.LastError, "apiBaseUrl "+gh.URL) {
		t.Fatalf("far = %+v, want unavailable naming %s and %s", far, other.URL, gh.URL)
	}

	run := func(conn string) map[string]any {
		return postAny(t, srv.url, "k-alice", []byte(`{"wait":"10s","workflow":{"version":1,"connections":{"`+conn+`":{}},
			"root":{"kind":"call","id":"c","connection":"`+conn+`","op":"away","args":{"owner":"acme","repo":"widgets"}}}}`))
	}
	ex := run("gh")
	if msg := fmt.Sprint(ex["error"]); ex["status"] != "failed" || !strings.Contains(msg, "not followed") || !strings.Contains(msg, other.URL+"/stolen") {
		t.Fatalf("redirected call: %v", ex)
	}
	if len(gh.Tokens()) == 0 {
		t.Fatal("no token was minted: the call never reached GitHub")
	}
	mu.Lock()
	if len(stolen) != 0 {
		t.Errorf("the other port was sent %q", stolen)
	}
	mu.Unlock()
	checkNoSecretAs(t, srv.url, "k-alice", ex["id"].(string), gh.Tokens()...)

	ex = run("gadgets")
	if msg := fmt.Sprint(ex["error"]); ex["status"] != "failed" || !strings.Contains(msg, "unauthorized") || !strings.Contains(msg, "'Expiration time' claim ('exp') must be a numeric value") {
		t.Fatalf("refused exchange: %v", ex)
	}
}
