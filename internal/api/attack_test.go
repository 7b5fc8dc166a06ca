package api_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/openapi"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestRunKeyCannotTakeTheHost replays the attack an ordinary key made on
// an earlier version: rewrite its own allowlist to grant itself a shell,
// bring that shell in a document, approve its own guarded call, and read
// another key's work. Each step is refused, and the shell never runs.
func TestRunKeyCannotTakeTheHost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const jsonCT = "application/json"
	marker := filepath.Join(t.TempDir(), "pwned")
	shell := `{"name":"sh","command":"/bin/sh","args":["-c","touch ` + marker + `"],"ops":["*"]}`
	as := func(key string) []string { return []string{"Authorization", "Bearer " + key} }

	// 1. A run key cannot change the allowlist that bounds it, or another.
	if r := b.do(t, "PUT", "/v1/allowlists/test", jsonCT, `{"connections":{"mem":{"ops":["*"]}},"mcp":[`+shell+`]}`, as("alice-key")...); r.status != 403 {
		t.Fatalf("run key PUT own allowlist = %d %s", r.status, r.body)
	}
	if r := b.do(t, "DELETE", "/v1/allowlists/test", "", "", as("bob-key")...); r.status != 403 {
		t.Fatalf("run key DELETE allowlist = %d %s", r.status, r.body)
	}

	// 2. Not even an admin can grant a command line through the API: the
	// config file is the one place a command is trusted.
	r := b.do(t, "PUT", "/v1/allowlists/test", jsonCT, `{"connections":{"mem":{"ops":["*"]}},"mcp":[`+shell+`]}`)
	if r.status != 422 || r.json(t)["code"] != "HOST_GRANT_REFUSED" || !strings.Contains(string(r.body), `"/mcp/0/command"`) {
		t.Fatalf("admin PUT command grant = %d %s", r.status, r.body)
	}
	// An admin may still grant a server by URL.
	if r := b.do(t, "PUT", "/v1/allowlists/urls", jsonCT, `{"connections":{},"mcp":[{"name":"remote","url":"https://mcp.example.test/mcp","ops":["*"]}]}`); r.status != 201 {
		t.Fatalf("admin PUT url grant = %d %s", r.status, r.body)
	}

	// 3. A document bringing the shell is refused before anything runs.
	doc := `{"version":1,"connections":{"sh":{"mcp":{"name":"sh","command":"/bin/sh","args":["-c","touch ` + marker + `"]}}},"root":{"kind":"call","id":"x","connection":"sh","op":"run"}}`
	if r := b.do(t, "POST", "/v1/executions", jsonCT, `{"workflow":`+doc+`}`, as("alice-key")...); r.status != 422 || r.json(t)["code"] != "CONNECTION_NOT_ALLOWED" {
		t.Fatalf("document bringing a shell = %d %s", r.status, r.body)
	}

	// 4. A key cannot approve its own guarded call, nor can another run key.
	exec := b.submitAs(t, "alice-key", `{"workflow":`+guardedDoc+`}`)
	ap := b.pendingApproval(t, exec)
	if r := b.do(t, "POST", "/v1/approvals/"+ap+"/approve", "", "", as("alice-key")...); r.status != 409 || r.json(t)["code"] != "APPROVAL_SELF" {
		t.Fatalf("self approval = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/approvals/"+ap+"/approve", "", "", as("bob-key")...); r.status != 404 {
		t.Fatalf("approval by another run key = %d %s", r.status, r.body)
	}

	// 5. Another run key sees nothing of alice's: not the execution, its
	// events, its approval, nor a line of the list.
	for _, path := range []string{"/v1/executions/" + exec, "/v1/executions/" + exec + "/events", "/v1/approvals/" + ap} {
		if r := b.do(t, "GET", path, "", "", as("bob-key")...); r.status != 404 {
			t.Fatalf("bob GET %s = %d %s", path, r.status, r.body)
		}
	}
	for _, path := range []string{"/v1/executions", "/v1/approvals"} {
		if r := b.do(t, "GET", path, "", "", as("bob-key")...); strings.Contains(string(r.body), exec) {
			t.Fatalf("bob's %s lists alice's execution: %s", path, r.body)
		}
		if r := b.do(t, "GET", path, "", "", as("auditor-key")...); !strings.Contains(string(r.body), exec) {
			t.Fatalf("the auditor's %s lacks alice's execution: %s", path, r.body)
		}
	}
	for _, path := range []string{"/v1/executions/" + exec + "/cancel", "/v1/executions/" + exec + "/resume"} {
		if r := b.do(t, "POST", path, "", "", as("bob-key")...); r.status != 404 {
			t.Fatalf("bob POST %s = %d %s", path, r.status, r.body)
		}
	}

	// 6. Secrets and sources need their grants.
	if r := b.do(t, "PUT", "/v1/secrets/app.token", jsonCT, `{"value":"overwritten-value"}`, as("alice-key")...); r.status != 403 {
		t.Fatalf("run key PUT secret = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/sources/deploys/events", jsonCT, `{"id":"e1","type":"deploy.failed","payload":{"service":"x"}}`, as("alice-key")...); r.status != 403 {
		t.Fatalf("run key push = %d %s", r.status, r.body)
	}

	// The approver decides; the call runs once, and the shell never ran.
	if r := b.do(t, "POST", "/v1/approvals/"+ap+"/approve", "", "", as("approver-key")...); r.status != 200 {
		t.Fatalf("approve = %d %s", r.status, r.body)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the shell command ran: %v", err)
	}
}

// filesDoc is an API whose allowlist grants getFile and follow, and whose
// policy denies adminOp.
const filesDoc = `{"openapi":"3.0.3","info":{"title":"files","version":"1"},"paths":{
 "/api/files/{dir}/{name}":{"get":{"operationId":"getFile","parameters":[
   {"name":"dir","in":"path","required":true,"schema":{"type":"string"}},
   {"name":"name","in":"path","required":true,"schema":{"type":"string"}}],"responses":{"200":{"description":"ok"}}}},
 "/api/admin":{"get":{"operationId":"adminOp","responses":{"200":{"description":"ok"}}}},
 "/api/go":{"get":{"operationId":"follow","responses":{"200":{"description":"ok"}}}}}}`

// recording is a server that remembers what reached it: the path as sent
// and the credential header.
type recording struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []string
}

func newRecording(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) *recording {
	rec := &recording{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, r.URL.EscapedPath()+" key="+r.Header.Get("X-Key"))
		rec.mu.Unlock()
		h(w, r)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recording) seen() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]string(nil), rec.reqs...)
}

// TestCallsCannotCarryCredentialsAway replays attacks on an OpenAPI
// connection's credential and its operation grant: a path parameter that
// walks to another operation's path, an answer that redirects the call
// (and its secret header) to another origin, and a document whose
// servers point the credential elsewhere. Each is refused, and neither
// the other path nor the other origin is sent anything.
func TestCallsCannotCarryCredentialsAway(t *testing.T) {
	t.Parallel()
	const key = "files-key-0123456789"
	other := newRecording(t, func(http.ResponseWriter, *http.Request) {})
	files := newRecording(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/openapi.json":
			io.WriteString(w, filesDoc)
		case "/far.json":
			io.WriteString(w, strings.Replace(filesDoc, `"paths"`, fmt.Sprintf(`"servers":[{"url":%q}],"paths"`, other.srv.URL), 1))
		case "/api/go":
			http.Redirect(w, r, other.srv.URL+"/collect", http.StatusFound)
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"ok":true}`)
		}
	})
	b := setupFiles(t, files.srv.URL, key)
	as := []string{"Authorization", "Bearer alice-key"}
	run := func(op, args string) map[string]any {
		t.Helper()
		r := b.do(t, "POST", "/v1/executions", "application/json", `{"wait":"10s","workflow":{"version":1,"connections":{"files":{}},
			"root":{"kind":"call","id":"c","connection":"files","op":"`+op+`","args":`+args+`}}}`, as...)
		if r.status != 200 {
			t.Fatalf("POST %s = %d %s", op, r.status, r.body)
		}
		return r.json(t)
	}

	// 1. The operation granted cannot reach the denied one's path.
	if ex := run("adminOp", `{}`); ex["status"] != "failed" {
		t.Fatalf("adminOp = %v", ex)
	}
	for _, dir := range []string{"..", "%2e%2e", ".", "a/b", "..%2F.."} {
		ex := run("getFile", fmt.Sprintf(`{"dir":%q,"name":"admin"}`, dir))
		e, _ := ex["error"].(map[string]any)
		if ex["status"] != "failed" || e["code"] != "steering_denied" || e["gate"] != 2.0 || !strings.Contains(fmt.Sprint(e["message"]), `argument "dir"`) {
			t.Fatalf("dir %q: %v", dir, ex)
		}
	}
	if ex := run("getFile", `{"dir":"docs","name":"a.txt"}`); ex["status"] != "succeeded" {
		t.Fatalf("an ordinary file: %v", ex)
	}

	// 2. A redirect to another origin does not take the key along.
	ex := run("follow", `{}`)
	if msg := fmt.Sprint(ex["error"]); ex["status"] != "failed" || !strings.Contains(msg, "not followed") {
		t.Fatalf("follow = %v", ex)
	}

	// 3. A document cannot send the key to the origin its servers name.
	r := b.do(t, "GET", "/v1/connections/far", "", "", as...)
	far := r.json(t)
	if far["state"] != "unavailable" || !strings.Contains(fmt.Sprint(far["lastError"]), other.srv.URL) || !strings.Contains(fmt.Sprint(far["lastError"]), files.srv.URL+"/far.json") {
		t.Fatalf("far = %s", r.body)
	}

	if got := other.seen(); len(got) != 0 {
		t.Fatalf("the other origin was sent %q", got)
	}
	var sent []string
	for _, req := range files.seen() {
		if strings.HasPrefix(req, "/api/") {
			sent = append(sent, req)
		}
	}
	if want := []string{"/api/files/docs/a.txt key=" + key, "/api/go key=" + key}; strings.Join(sent, "; ") != strings.Join(want, "; ") {
		t.Fatalf("the API was sent %q, want %q", sent, want)
	}
}

// setupFiles is an API server over two OpenAPI connections of the API at
// base, whose calls carry key in X-Key: files (granted getFile and
// follow, adminOp denied) and far (its document's servers elsewhere).
func setupFiles(t *testing.T, base, key string) *bundle {
	t.Helper()
	secrets := secrets.NewEnvSecrets(func(name string) string {
		return map[string]string{secrets.SecretEnvVar("files.key"): key}[name]
	})
	reg := registry.NewRegistry(nil)
	headers := map[string]string{"X-Key": "${secret:files.key}"}
	must(t, reg.Add("files", openapi.New("files", config.OpenAPI{URL: base + "/openapi.json", Headers: headers}, &openapi.Options{Secrets: secrets})))
	must(t, reg.Add("far", openapi.New("far", config.OpenAPI{URL: base + "/far.json", Headers: headers}, &openapi.Options{Secrets: secrets})))
	must(t, reg.SetPolicy("files", registry.Policy{Deny: []string{"adminOp"}}))
	if err := reg.Start(context.Background()); err == nil {
		t.Fatal("far started")
	}
	st := storetest.New(t)
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("test", []byte(`{"connections":{"files":{"ops":["getFile","follow","adminOp"]},"far":{"ops":["*"]}}}`))
	must(t, err)
	_, err = als.Put(context.Background(), al, "setup")
	must(t, err)
	metrics := api.NewMetrics()
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Observer: metrics, Allowlists: als})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 1); close(done) }()
	srv := httptest.NewServer(api.New(api.Options{
		Executions: execs, Registry: reg, Allowlists: als, MaxBodyBytes: 64 << 10, Metrics: metrics,
		APIKeys: []api.Key{{SHA256: sha256.Sum256([]byte("alice-key")), Principal: authz.Principal{Name: "alice", Allowlist: "test"}}},
	}))
	t.Cleanup(func() { srv.Close(); cancel(); <-done; _ = reg.Close() })
	router, err := gorillamux.NewRouter(loadSpec(t))
	must(t, err)
	return &bundle{url: srv.URL, router: router, spec: loadSpec(t), seen: map[string]bool{}}
}
