package openapi

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
)

// fakeSecrets is a secret store whose values a test changes.
type fakeSecrets struct {
	mu     sync.Mutex
	values map[string]string
}

func (f *fakeSecrets) Resolve(_ context.Context, name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.values[name]
	if !ok {
		return "", secrets.ErrSecretNotFound
	}
	return v, nil
}

func (f *fakeSecrets) set(name, v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values[name] = v
}

type fakeRedactor struct {
	mu     sync.Mutex
	values []string
}

func (f *fakeRedactor) Add(values ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values = append(f.values, values...)
}

// TestSecretHeadersResolvePerCall: a rotated secret is sent from the next
// call on, every value sent is known to the redactor first, and a missing
// secret fails the call without sending it.
func TestSecretHeadersResolvePerCall(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/openapi.json" {
			io.WriteString(w, `{"openapi":"3.1.0","info":{"title":"t","version":"1"},"paths":{"/x":{"get":{"operationId":"x","responses":{}}}}}`)
			return
		}
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	t.Cleanup(ts.Close)
	fake := &fakeSecrets{values: map[string]string{"api.token": "first-token-123"}}
	red := &fakeRedactor{}
	spec := config.OpenAPI{URL: ts.URL + "/openapi.json", Headers: map[string]string{"Authorization": "Bearer ${secret:api.token}"}}
	if s := Secrets(spec); len(s) != 0 {
		t.Fatalf("Secrets = %q: a reference is no secret", s)
	}
	c, err := New("api", spec, &Options{Secrets: fake, Redactor: red}).Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	call := func() error {
		_, err := c.Call(context.Background(), connect.CallRequest{Op: "x"})
		return err
	}
	if err := call(); err != nil {
		t.Fatal(err)
	}
	fake.set("api.token", "second-token-456")
	if err := call(); err != nil {
		t.Fatal(err)
	}
	fake.set("api.token", "")
	delete(fake.values, "api.token")
	err = call()
	if !errors.Is(err, secrets.ErrSecretNotFound) || !strings.Contains(err.Error(), "api.token") {
		t.Fatalf("missing secret: err = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, []string{"Bearer first-token-123", "Bearer second-token-456"}) {
		t.Fatalf("sent %q", got)
	}
	if !slices.Contains(red.values, "first-token-123") || !slices.Contains(red.values, "second-token-456") {
		t.Fatalf("redactor knows %q", red.values)
	}
}
