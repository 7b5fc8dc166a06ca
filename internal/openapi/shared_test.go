package openapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// fakeShared is a shared sign-in: signedIn says whether anyone signed in
// for everyone.
type fakeShared struct{ signedIn bool }

func (f fakeShared) SharedHeaders(_ context.Context, connection string) (map[string]string, bool, error) {
	if !f.signedIn {
		return nil, true, fmt.Errorf("nobody signed in to %s: %w", connection, connect.ErrNeedsSignIn)
	}
	return map[string]string{"Authorization": "Bearer shared-token"}, true, nil
}

// The document request carries the shared sign-in's token under the same
// docAuth rules as the headers; a document that wants it before anyone
// signed in makes the connection need a sign-in.
func TestDocumentCarriesOnlyTheSharedToken(t *testing.T) {
	t.Parallel()
	const doc = `{"openapi":"3.0.3","info":{"title":"t","version":"1"},"paths":{}}`
	var mu sync.Mutex
	var got string
	serve := func(protected bool) *httptest.Server {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = r.Header.Get("Authorization")
			mu.Unlock()
			if protected && got == "" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			_, _ = io.WriteString(w, doc)
		}))
		t.Cleanup(ts.Close)
		return ts
	}
	open, locked := serve(false), serve(true)
	no := false
	tests := []struct {
		name     string
		url      string
		baseURL  string
		docAuth  *bool
		signedIn bool
		want     string
		wantErr  error
	}{
		{name: "same origin", url: open.URL, baseURL: open.URL + "/api", signedIn: true, want: "Bearer shared-token"},
		{name: "other origin", url: open.URL, baseURL: "https://api.example.com", signedIn: true},
		{name: "docAuth false", url: open.URL, baseURL: open.URL, docAuth: &no, signedIn: true},
		{name: "nobody signed in, public document", url: open.URL, baseURL: open.URL},
		{name: "nobody signed in, protected document", url: locked.URL, baseURL: locked.URL, wantErr: connect.ErrNeedsSignIn},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Not parallel: the servers record one request at a time.
			spec := config.OpenAPI{URL: tt.url + "/doc.json", BaseURL: tt.baseURL, DocAuth: tt.docAuth}
			_, err := New("api", spec, &Options{Shared: fakeShared{tt.signedIn}}).Connect(context.Background())
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if got != tt.want {
				t.Fatalf("document request carried %q, want %q", got, tt.want)
			}
		})
	}
}

// An entry whose calls all use the shared sign-in needs one before it is
// ready, even when its document is public.
func TestSharedOnlyNeedsTheSignIn(t *testing.T) {
	t.Parallel()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"openapi":"3.0.3","info":{"title":"t","version":"1"},"paths":{}}`)
	}))
	t.Cleanup(ts.Close)
	spec := config.OpenAPI{URL: ts.URL + "/doc.json"}
	if _, err := New("api", spec, &Options{Shared: fakeShared{false}, SharedOnly: true}).Connect(context.Background()); !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Fatalf("shared, nobody signed in: err = %v, want ErrNeedsSignIn", err)
	}
	if _, err := New("api", spec, &Options{Shared: fakeShared{true}, SharedOnly: true}).Connect(context.Background()); err != nil {
		t.Fatalf("shared, signed in: %v", err)
	}
	if _, err := New("api", spec, &Options{Shared: fakeShared{false}}).Connect(context.Background()); err != nil {
		t.Fatalf("per user, no shared sign-in: %v", err)
	}
}
