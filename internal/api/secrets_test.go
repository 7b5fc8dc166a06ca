package api_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// exerciseSecrets drives PUT /v1/secrets/{name} on a server with no
// writable store (TestPutSecret covers the rest).
func exerciseSecrets(t *testing.T, b *bundle) {
	t.Helper()
	r := b.do(t, "PUT", "/v1/secrets/app.token", "application/json", `{"value":"tok-123456"}`)
	if r.status != 501 || r.json(t)["code"] != "SECRETS_READ_ONLY" || bytes.Contains(r.body, []byte("tok-123456")) {
		t.Fatalf("PUT secret without a store = %d %s", r.status, r.body)
	}
}

// failingWriter is a SecretWriter whose backend is down.
type failingWriter struct{}

func (failingWriter) Put(context.Context, string, string) error {
	return errors.New("redis: connection refused")
}

// recordingWriter keeps what it was given.
type recordingWriter struct {
	mu     sync.Mutex
	values map[string]string
}

func (w *recordingWriter) Put(_ context.Context, name, value string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.values[name] = value
	return nil
}

func TestPutSecret(t *testing.T) {
	t.Parallel()
	keys, err := secrets.NewKeyring(secrets.KeyringKey{ID: "k1", Key: bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	stored := secrets.NewRedisSecrets(storetest.New(t), keys)
	b := setup(t, func(o *api.Options) { o.Secrets = stored })
	const ct = "application/json"
	const value = "s3cr3t/value+with=stuff"

	r := b.do(t, "PUT", "/v1/secrets/app.password", ct, `{"value":"`+value+`"}`)
	if r.status != 204 || len(r.body) != 0 {
		t.Fatalf("PUT = %d %s", r.status, r.body)
	}
	if got, err := stored.Resolve(t.Context(), "app.password"); err != nil || got != value {
		t.Fatalf("Resolve = %q, %v", got, err)
	}
	// Replacing is a PUT like any other.
	if r = b.do(t, "PUT", "/v1/secrets/app.password", ct, `{"value":"second-value"}`); r.status != 204 {
		t.Fatalf("PUT again = %d %s", r.status, r.body)
	}
	if got, _ := stored.Resolve(t.Context(), "app.password"); got != "second-value" {
		t.Fatalf("after replace: %q", got)
	}
	// curl -d sends a form content type; a JSON object body is accepted.
	if r = b.do(t, "PUT", "/v1/secrets/curl.token", "application/x-www-form-urlencoded", `{"value":"from-curl"}`); r.status != 204 {
		t.Fatalf("PUT from curl = %d %s", r.status, r.body)
	}

	tests := []struct {
		name   string
		path   string
		ct     string
		body   string
		status int
		code   string
		field  string
	}{
		{"bad name", "/v1/secrets/bad%20name", ct, `{"value":"x-value"}`, 422, "VALIDATION_FAILED", "name"},
		{"dot dot", "/v1/secrets/..", ct, `{"value":"x-value"}`, 422, "VALIDATION_FAILED", "name"},
		{"name too long", "/v1/secrets/" + strings.Repeat("n", 129), ct, `{"value":"x-value"}`, 422, "VALIDATION_FAILED", "name"},
		{"value missing", "/v1/secrets/a", ct, `{}`, 422, "VALIDATION_FAILED", "/value"},
		{"value not a string", "/v1/secrets/a", ct, `{"value":123456}`, 422, "VALIDATION_FAILED", "/value"},
		{"value empty", "/v1/secrets/a", ct, `{"value":""}`, 422, "VALIDATION_FAILED", "/value"},
		{"unknown field", "/v1/secrets/a", ct, `{"value":"x-value","ttl":5}`, 422, "VALIDATION_FAILED", "/ttl"},
		{"malformed", "/v1/secrets/a", ct, `{"value":"x-val`, 400, "MALFORMED_JSON", ""},
		{"array body", "/v1/secrets/a", ct, `["x-value"]`, 400, "MALFORMED_JSON", ""},
		{"wrong content type", "/v1/secrets/a", "text/plain", `x-value`, 415, "UNSUPPORTED_MEDIA_TYPE", ""},
		{"too large", "/v1/secrets/a", ct, `{"value":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "BODY_TOO_LARGE", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := b.do(t, "PUT", tt.path, tt.ct, tt.body)
			if r.status != tt.status {
				t.Fatalf("status = %d, want %d: %s", r.status, tt.status, r.body)
			}
			p := r.json(t)
			if p["code"] != tt.code {
				t.Fatalf("problem = %s, want code %s", r.body, tt.code)
			}
			if bytes.Contains(r.body, []byte("x-val")) {
				t.Fatalf("problem quotes the value: %s", r.body)
			}
			if tt.field == "" {
				return
			}
			errs, _ := p["errors"].([]any)
			for _, e := range errs {
				if e.(map[string]any)["path"] == tt.field {
					return
				}
			}
			t.Fatalf("problem %s names no field %s", r.body, tt.field)
		})
	}
	if _, err := stored.Resolve(t.Context(), "a"); !errors.Is(err, secrets.ErrSecretNotFound) {
		t.Errorf("a refused PUT stored something: %v", err)
	}
}

func TestPutSecretUnauthenticatedAndFailing(t *testing.T) {
	t.Parallel()
	w := &recordingWriter{values: map[string]string{}}
	b := setup(t, func(o *api.Options) { o.Secrets = w })
	r := b.do(t, "PUT", "/v1/secrets/app.token", "application/json", `{"value":"tok-123456"}`, "Authorization", "")
	if r.status != 401 || len(w.values) != 0 {
		t.Fatalf("PUT without a key = %d, stored %d", r.status, len(w.values))
	}

	failing := setup(t, func(o *api.Options) { o.Secrets = failingWriter{} })
	r = failing.do(t, "PUT", "/v1/secrets/app.token", "application/json", `{"value":"tok-123456"}`)
	if r.status != 500 || r.json(t)["code"] != "INTERNAL" || bytes.Contains(r.body, []byte("redis")) {
		t.Fatalf("PUT on a failing store = %d %s", r.status, r.body)
	}
}
