package main

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/bearer"
	"github.com/patchbay-dev/patchbay/internal/config"
)

func TestMCPTokens(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	load := func(public, file string) *config.Config {
		t.Helper()
		env := map[string]string{"PATCHBAY_CONFIG": "c.yaml", "PATCHBAY_PUBLIC_URL": public}
		cfg, err := config.Load(func(k string) string { return env[k] }, func(string) ([]byte, error) { return []byte(file), nil })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}

	tokens, err := mcpTokens(load("", "name: x"), logger)
	if err != nil || tokens != nil {
		t.Fatalf("without mcp.oauth = %v, %v; want nil (API keys only)", tokens, err)
	}

	cfg := load("https://patchbay.example.com", `mcp:
  oauth:
    issuer: https://auth.example.com
    scopes: [mcp:tools]
    principals: {"user-1": {allowlist: default, roles: [run]}}
`)
	tokens, err = mcpTokens(cfg, logger)
	if err != nil || tokens == nil {
		t.Fatalf("mcpTokens = %v, %v", tokens, err)
	}
	if got, want := tokens.Challenge(), `Bearer resource_metadata="https://patchbay.example.com/.well-known/oauth-protected-resource/mcp"`; got != want {
		t.Errorf("Challenge = %s, want %s", got, want)
	}
	rec := httptest.NewRecorder()
	tokens.MetadataHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/.well-known/oauth-protected-resource/mcp", nil))
	var md struct {
		Resource             string   `json:"resource"`
		AuthorizationServers []string `json:"authorization_servers"`
		Scopes               []string `json:"scopes_supported"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &md); err != nil || md.Resource != "https://patchbay.example.com/mcp" ||
		len(md.AuthorizationServers) != 1 || md.AuthorizationServers[0] != "https://auth.example.com" || len(md.Scopes) != 1 {
		t.Errorf("metadata = %s (%v)", rec.Body, err)
	}
	// An API key is not the verifier's to judge; an opaque token without
	// introspection is refused, never sent anywhere.
	if tokens.Accepts("pb-api-key") {
		t.Error("an API key went to the token verifier")
	}
	if _, err := tokens.Verify(t.Context(), "opaque"); !errors.Is(err, bearer.ErrRefused) {
		t.Errorf("opaque token = %v", err)
	}
}
