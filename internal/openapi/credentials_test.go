package openapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// elsewhere is another origin: it records what reaches it (the headers
// that could carry a credential) and answers 200.
type elsewhere struct {
	srv  *httptest.Server
	mu   sync.Mutex
	seen []string
}

func newElsewhere(t *testing.T) *elsewhere {
	t.Helper()
	e := &elsewhere{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.seen = append(e.seen, r.Method+" "+r.URL.Path+" key="+r.Header.Get("X-Key")+" auth="+r.Header.Get("Authorization"))
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"from":"elsewhere"}`)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *elsewhere) requests() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.seen...)
}

const redirectDoc = `{"openapi":"3.0.3","info":{"title":"t","version":"1"},"paths":{
 "/away":{"get":{"operationId":"away","responses":{"200":{"description":"ok"}}}},
 "/moved":{"get":{"operationId":"moved","responses":{"200":{"description":"ok"}}}},
 "/write":{"post":{"operationId":"write","responses":{"200":{"description":"ok"}}}},
 "/files/{dir}/{name}":{"get":{"operationId":"file","parameters":[
   {"name":"dir","in":"path","required":true,"schema":{"type":"string"}},
   {"name":"name","in":"path","required":true,"schema":{"type":"string"}}],"responses":{"200":{"description":"ok"}}}}}}`

// redirectingAPI serves redirectDoc on one loopback port: /away answers
// 302 to another port, /moved 302 to its own /here, /write 307 to
// /here. seen records what the API itself received.
func redirectingAPI(t *testing.T, other string) (*httptest.Server, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.EscapedPath()+" key="+r.Header.Get("X-Key")+" auth="+r.Header.Get("Authorization"))
		mu.Unlock()
		switch r.URL.Path {
		case "/openapi.json":
			io.WriteString(w, redirectDoc)
		case "/away":
			http.Redirect(w, r, other+"/stolen?sig=1", http.StatusFound)
		case "/moved":
			http.Redirect(w, r, "/here", http.StatusFound)
		case "/write":
			http.Redirect(w, r, "/here", http.StatusTemporaryRedirect)
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"from":"api"}`)
		}
	}))
	t.Cleanup(ts.Close)
	return ts, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// TestCallRedirects: a call's configured secret header and its per-call
// token (a GitHub App installation token, say) never reach another
// origin — another port of the same host included — whatever
// followRedirects says; within the origin a GET follows with them, a
// write follows nowhere.
func TestCallRedirects(t *testing.T) {
	t.Parallel()
	const key, token = "key-0123456789", "Bearer ghs_installation0123456789"
	const k = " key=" + key + " auth=" + token
	tests := []struct {
		mode, op  string
		want      any    // the result, nil when the call must fail
		wantErr   string // in the CallError
		wantAPI   string
		wantOther string
	}{
		{"", "away", nil, "leads away from", "GET /away" + k, ""},
		{"same-origin", "moved", map[string]any{"from": "api"}, "", "GET /moved" + k + "; GET /here" + k, ""},
		{"same-origin", "write", nil, "a POST goes only where it was addressed", "POST /write" + k, ""},
		{"none", "moved", nil, "follows no redirects", "GET /moved" + k, ""},
		{"any", "away", map[string]any{"from": "elsewhere"}, "", "GET /away" + k, "GET /stolen key= auth="},
		{"any", "write", nil, "a POST goes only where it was addressed", "POST /write" + k, ""},
	}
	for _, tt := range tests {
		t.Run(tt.mode+" "+tt.op, func(t *testing.T) {
			t.Parallel()
			other := newElsewhere(t)
			api, apiSeen := redirectingAPI(t, other.srv.URL)
			spec := config.OpenAPI{URL: api.URL + "/openapi.json", FollowRedirects: tt.mode, Headers: map[string]string{"X-Key": "${secret:api.key}"}}
			c, err := New("api", spec, &Options{Secrets: &fakeSecrets{values: map[string]string{"api.key": key}}, Shared: fakeShared{true}}).Connect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			out, err := c.Call(context.Background(), connect.CallRequest{Op: tt.op, Headers: map[string]string{"Authorization": token}})
			if tt.wantErr != "" {
				var ce *connect.CallError
				if !errors.As(err, &ce) || !strings.Contains(ce.Message, tt.wantErr) || strings.Contains(ce.Message, "sig=") {
					t.Fatalf("err = %v, want a CallError with %q", err, tt.wantErr)
				}
			} else if err != nil || !equalJSON(out, tt.want) {
				t.Fatalf("got %v, %v; want %v", out, err, tt.want)
			}
			if got := strings.Join(apiSeen()[1:], "; "); got != tt.wantAPI {
				t.Errorf("the API saw %q\nwant %q", got, tt.wantAPI)
			}
			if got := strings.Join(other.requests(), "; "); got != tt.wantOther {
				t.Errorf("the other origin saw %q\nwant %q", got, tt.wantOther)
			}
		})
	}
}

// TestServersMayNotMoveCredentials: without baseUrl, a document's
// servers[0].url on another origin than the document's gets no
// credential — the connection is refused at load, naming both URLs —
// and a GitHub App's token goes to its apiBaseUrl's origin only, whatever
// baseUrl or the document say.
func TestServersMayNotMoveCredentials(t *testing.T) {
	t.Parallel()
	other := newElsewhere(t)
	serve := func(servers string) string {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"openapi":"3.0.3","info":{"title":"t","version":"1"},"servers":[{"url":%q}],"paths":{"/x":{"get":{"operationId":"x","responses":{}}}}}`, servers)
		}))
		t.Cleanup(ts.Close)
		return ts.URL
	}
	foreign := serve(other.srv.URL + "/v1")
	relative := serve("/v2")
	headers := map[string]string{"X-Key": "key-0123456789"}
	tests := []struct {
		name    string
		spec    config.OpenAPI
		opts    Options
		wantErr []string // all in the error; none: it loads
	}{
		{name: "headers, servers elsewhere", spec: config.OpenAPI{URL: foreign + "/doc.json", Headers: headers},
			wantErr: []string{foreign + "/doc.json", other.srv.URL + "/v1", "servers[0].url", "set baseUrl: " + other.srv.URL + "/v1"}},
		{name: "sign-in, servers elsewhere", spec: config.OpenAPI{URL: foreign + "/doc.json"}, opts: Options{Shared: fakeShared{true}},
			wantErr: []string{foreign + "/doc.json", other.srv.URL + "/v1"}},
		{name: "no credentials, servers elsewhere", spec: config.OpenAPI{URL: foreign + "/doc.json"}},
		{name: "baseUrl says so", spec: config.OpenAPI{URL: foreign + "/doc.json", BaseURL: other.srv.URL + "/v1", Headers: headers}},
		{name: "relative servers", spec: config.OpenAPI{URL: relative + "/doc.json", Headers: headers}},
		{name: "file document", spec: config.OpenAPI{URL: "api.json", Headers: headers},
			opts: Options{ReadFile: func(string) ([]byte, error) {
				return []byte(`{"openapi":"3.0.3","servers":[{"url":"https://api.example.com"}],"paths":{}}`), nil
			}},
			wantErr: []string{"api.json", "https://api.example.com"}},
		{name: "github app, servers elsewhere", spec: config.OpenAPI{URL: foreign + "/doc.json"}, opts: Options{Shared: fakeShared{true}, CredentialsOnlyTo: foreign},
			wantErr: []string{other.srv.URL + "/v1", "apiBaseUrl " + foreign}},
		{name: "github app, baseUrl elsewhere", spec: config.OpenAPI{URL: foreign + "/doc.json", BaseURL: other.srv.URL}, opts: Options{Shared: fakeShared{true}, CredentialsOnlyTo: foreign},
			wantErr: []string{other.srv.URL, "apiBaseUrl " + foreign}},
		{name: "github app, another port", spec: config.OpenAPI{URL: relative + "/doc.json"}, opts: Options{Shared: fakeShared{true}, CredentialsOnlyTo: other.srv.URL},
			wantErr: []string{relative + "/v2", "apiBaseUrl " + other.srv.URL}},
		{name: "github app, its own API", spec: config.OpenAPI{URL: relative + "/doc.json"}, opts: Options{Shared: fakeShared{true}, CredentialsOnlyTo: relative + "/api/v3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := New("api", tt.spec, &tt.opts).Connect(context.Background())
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("loaded")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %v\nwant it to name %s", err, want)
				}
			}
			if strings.Contains(err.Error(), "key-0123456789") {
				t.Errorf("err shows the key: %v", err)
			}
		})
	}
	if got := other.requests(); len(got) != 0 {
		t.Fatalf("the servers' origin was sent %v", got)
	}
}

// TestPerCallCredentialsNeedAPlaceToGo: an entry loaded without
// credentials whose calls go where its document says refuses a call that
// brings some, before anything is sent.
func TestPerCallCredentialsNeedAPlaceToGo(t *testing.T) {
	t.Parallel()
	other := newElsewhere(t)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"openapi":"3.0.3","info":{"title":"t","version":"1"},"servers":[{"url":%q}],"paths":{"/x":{"get":{"operationId":"x","responses":{}}}}}`, other.srv.URL)
	}))
	t.Cleanup(ts.Close)
	c, err := New("api", config.OpenAPI{URL: ts.URL + "/doc.json"}, nil).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Call(context.Background(), connect.CallRequest{Op: "x"}); err != nil {
		t.Fatalf("a call without credentials: %v", err)
	}
	_, err = c.Call(context.Background(), connect.CallRequest{Op: "x", Headers: map[string]string{"Authorization": "Bearer user-token"}})
	if err == nil || !strings.Contains(err.Error(), "set baseUrl") {
		t.Fatalf("err = %v", err)
	}
	if got := other.requests(); len(got) != 1 || strings.Contains(got[0], "user-token") {
		t.Fatalf("the servers' origin saw %v", got)
	}
}

// TestDocAuthKeepsTheAppTokenOnGitHub: docAuth: true cannot send a GitHub
// App's token to a document on another origin than its apiBaseUrl.
func TestDocAuthKeepsTheAppTokenOnGitHub(t *testing.T) {
	t.Parallel()
	doc := newElsewhere(t)
	yes := true
	spec := config.OpenAPI{URL: doc.srv.URL + "/doc.json", BaseURL: "https://api.github.com", DocAuth: &yes}
	_, err := New("gh", spec, &Options{Shared: fakeShared{true}, CredentialsOnlyTo: "https://api.github.com"}).Connect(context.Background())
	if err == nil || !strings.Contains(err.Error(), doc.srv.URL+"/doc.json") || !strings.Contains(err.Error(), "apiBaseUrl https://api.github.com") {
		t.Fatalf("err = %v", err)
	}
	if got := doc.requests(); len(got) != 0 {
		t.Fatalf("the document's origin saw %v", got)
	}
}

// TestPathArgsNotSent: the provider checks path parameters again where it
// builds the path, so a caller that skipped gate 2 sends nothing either.
func TestPathArgsNotSent(t *testing.T) {
	t.Parallel()
	api, apiSeen := redirectingAPI(t, "http://127.0.0.1:1")
	c, err := New("api", config.OpenAPI{URL: api.URL + "/openapi.json"}, nil).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"..", ".", "a/b", "%2e%2e", "%2F"} {
		_, err := c.Call(context.Background(), connect.CallRequest{Op: "file", Args: map[string]any{"dir": dir, "name": "admin"}})
		var ce *connect.CallError
		if !errors.As(err, &ce) || !strings.Contains(ce.Message, `argument "dir"`) {
			t.Errorf("dir %q: err = %v", dir, err)
		}
	}
	if _, err := c.Call(context.Background(), connect.CallRequest{Op: "file", Args: map[string]any{"dir": "docs", "name": "a b"}}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(apiSeen()[1:], "; "); got != "GET /files/docs/a%20b key= auth=" {
		t.Fatalf("the API saw %q", got)
	}
}
