package openapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

const callsDoc = `{"openapi":"3.0.3","info":{"title":"t","version":"1"},"paths":{
 "/items/{id}":{"parameters":[{"name":"id","in":"path","required":true,"schema":{"type":"string"}}],
  "get":{"operationId":"get","parameters":[
   {"name":"tags","in":"query","schema":{"type":"array","items":{"type":"string"}}},
   {"name":"csv","in":"query","explode":false,"schema":{"type":"array","items":{"type":"integer"}}},
   {"name":"X-Trace","in":"header","schema":{"type":"string"}}],"responses":{"200":{"description":"ok"}}},
  "delete":{"operationId":"remove","responses":{"204":{"description":"gone"}}}},
 "/text":{"get":{"operationId":"text","responses":{"200":{"description":"ok"}}}},
 "/slow":{"get":{"operationId":"slow","responses":{"200":{"description":"ok"}}}},
 "/items":{"post":{"operationId":"put","requestBody":{"content":{"application/json":{"schema":{"type":"array"}}}},"responses":{"200":{"description":"ok"}}}}}}`

// recorder is an API that remembers the last request it got.
type recorder struct {
	mu   sync.Mutex
	last *http.Request
	body string
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	rec.last, rec.body = r, string(b)
	rec.mu.Unlock()
	switch {
	case r.URL.Path == "/openapi.json":
		io.WriteString(w, callsDoc)
	case r.URL.Path == "/text":
		io.WriteString(w, "plain words")
	case r.URL.Path == "/slow":
		<-r.Context().Done()
	case r.Method == "DELETE":
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}
}

func connectCalls(t *testing.T, spec config.OpenAPI) (connect.Conn, *recorder, *httptest.Server) {
	t.Helper()
	rec := &recorder{}
	ts := httptest.NewServer(rec)
	t.Cleanup(ts.Close)
	spec.URL = ts.URL + "/openapi.json"
	c, err := New("api", spec, nil).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c, rec, ts
}

func TestCalls(t *testing.T) {
	t.Parallel()
	c, rec, _ := connectCalls(t, config.OpenAPI{Headers: map[string]string{"X-Key": "k-123"}, RequestTimeoutMs: 200})
	tests := []struct {
		name    string
		req     connect.CallRequest
		want    any
		wantReq string // method, escaped URL and selected headers of the request sent
	}{
		{
			name: "path, query and header parameters",
			req: connect.CallRequest{Op: "get", Args: map[string]any{
				"id": "a b?", "tags": []any{"x", "y"}, "csv": []any{1.0, 2.0}, "X-Trace": "t1"}},
			want:    map[string]any{"ok": true},
			wantReq: "GET /items/a%20b%3F?csv=1%2C2&tags=x&tags=y key=k-123 trace=t1 idem=",
		},
		{
			name:    "empty 2xx is null; writes carry the idempotency key",
			req:     connect.CallRequest{Op: "remove", Args: map[string]any{"id": "7"}, IdempotencyKey: "ex_1:step"},
			want:    nil,
			wantReq: "DELETE /items/7 key=k-123 trace= idem=ex_1:step",
		},
		{
			name:    "text body",
			req:     connect.CallRequest{Op: "text"},
			want:    "plain words",
			wantReq: "GET /text key=k-123 trace= idem=",
		},
		{
			name:    "per-call credentials win over the entry's",
			req:     connect.CallRequest{Op: "put", Args: map[string]any{"body": []any{1.0}}, Headers: map[string]string{"X-Key": "user-tok"}},
			want:    map[string]any{"ok": true},
			wantReq: "POST /items key=user-tok trace= idem=",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.Call(context.Background(), tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if !equalJSON(got, tt.want) {
				t.Errorf("result = %#v, want %#v", got, tt.want)
			}
			rec.mu.Lock()
			r := rec.last
			sent := r.Method + " " + r.URL.RequestURI() + " key=" + r.Header.Get("X-Key") + " trace=" + r.Header.Get("X-Trace") + " idem=" + r.Header.Get("Idempotency-Key")
			rec.mu.Unlock()
			if sent != tt.wantReq {
				t.Errorf("request = %q, want %q", sent, tt.wantReq)
			}
		})
	}
	t.Run("body", func(t *testing.T) {
		if _, err := c.Call(context.Background(), connect.CallRequest{Op: "put", Args: map[string]any{"body": []any{1.0, "two"}}}); err != nil {
			t.Fatal(err)
		}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		if rec.body != `[1,"two"]` || rec.last.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("body = %q (%s)", rec.body, rec.last.Header.Get("Content-Type"))
		}
	})
	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		_, err := c.Call(context.Background(), connect.CallRequest{Op: "slow"})
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
			t.Fatalf("err = %v after %s", err, time.Since(start))
		}
	})
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(20*time.Millisecond, cancel)
		if _, err := c.Call(ctx, connect.CallRequest{Op: "slow"}); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
	})
}

func equalJSON(a, b any) bool {
	return strings.TrimSpace(string(mustJSON(a))) == strings.TrimSpace(string(mustJSON(b)))
}

func TestErrorCarriesStatusAndExcerpt(t *testing.T) {
	t.Parallel()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/openapi.json" {
			io.WriteString(w, `{"openapi":"3.1.0","info":{"title":"t","version":"1"},"paths":{"/x":{"get":{"operationId":"x","responses":{}}}}}`)
			return
		}
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, strings.Repeat("é", 600))
	}))
	t.Cleanup(ts.Close)
	c, err := New("api", config.OpenAPI{URL: ts.URL + "/openapi.json"}, nil).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Call(context.Background(), connect.CallRequest{Op: "x"})
	var ce *connect.CallError
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Message, "HTTP 418: éé") || len(ce.Message) > errorExcerpt+20 {
		t.Fatalf("err = %v", err)
	}
}

// TestDocAuth: the configured headers go with the document request only
// when they have to, never across a redirect to another origin, and a
// refused document says which fix applies.
func TestDocAuth(t *testing.T) {
	t.Parallel()
	const doc = `{"openapi":"3.0.3","info":{"title":"t","version":"1"},"paths":{}}`
	// other serves the document on another origin, answering 401 to a
	// request without the key when protected.
	var mu sync.Mutex
	var gotKey string
	serve := func(protected bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			gotKey = r.Header.Get("X-Key")
			mu.Unlock()
			if protected && r.Header.Get("X-Key") == "" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			io.WriteString(w, doc)
		}
	}
	open := httptest.NewServer(serve(false))
	t.Cleanup(open.Close)
	locked := httptest.NewServer(serve(true))
	t.Cleanup(locked.Close)
	redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, locked.URL+"/doc.json", http.StatusFound)
	}))
	t.Cleanup(redirect.Close)
	yes, no := true, false
	tests := []struct {
		name     string
		url      string
		baseURL  string
		docAuth  *bool
		wantKey  bool
		wantFail string
	}{
		{name: "no baseUrl", url: open.URL, wantKey: false},
		{name: "same-origin baseUrl", url: open.URL, baseURL: open.URL + "/api", wantKey: true},
		{name: "other-origin baseUrl", url: open.URL, baseURL: "https://api.example.com", wantKey: false},
		{name: "docAuth true", url: open.URL, baseURL: "https://api.example.com", docAuth: &yes, wantKey: true},
		{name: "docAuth false", url: open.URL, baseURL: open.URL, docAuth: &no, wantKey: false},
		{name: "401 without credentials", url: locked.URL, baseURL: "https://api.example.com", wantFail: "set baseUrl, or docAuth: true"},
		{name: "401 with docAuth false", url: locked.URL, docAuth: &no, wantFail: "set docAuth: true"},
		{name: "redirect to another origin", url: redirect.URL, docAuth: &yes, wantFail: "point url at the final location"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Not parallel: the servers record one request at a time.
			spec := config.OpenAPI{URL: tt.url + "/doc.json", BaseURL: tt.baseURL, DocAuth: tt.docAuth, Headers: map[string]string{"X-Key": "secret-key"}}
			_, err := New("api", spec, nil).Connect(context.Background())
			if tt.wantFail != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantFail) {
					t.Fatalf("err = %v, want %q", err, tt.wantFail)
				}
				if strings.Contains(err.Error(), "secret-key") {
					t.Fatalf("err shows the key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if (gotKey != "") != tt.wantKey {
				t.Fatalf("document request had key %q, want sent = %v", gotKey, tt.wantKey)
			}
		})
	}
}
