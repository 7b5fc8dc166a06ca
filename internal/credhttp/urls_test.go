package credhttp_test

import (
	"net/url"
	"slices"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

func TestSecure(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]bool{
		"https://auth.example.com":     true,
		"http://127.0.0.1:8080/token":  true,
		"http://localhost/x":           true,
		"http://[::1]:9/":              true,
		"http://auth.example.com":      false,
		"https://":                     false,
		"ftp://127.0.0.1/":             false,
		"http://127.0.0.1.example.com": false,
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := credhttp.Secure(u); got != want {
			t.Errorf("Secure(%s) = %v, want %v", raw, got, want)
		}
	}
}

func TestMetadataURLs(t *testing.T) {
	t.Parallel()
	tests := map[string][]string{
		"https://a.example/": {"https://a.example/.well-known/oauth-authorization-server", "https://a.example/.well-known/openid-configuration"},
		"https://a.example/tenant1": {
			"https://a.example/.well-known/oauth-authorization-server/tenant1",
			"https://a.example/.well-known/openid-configuration/tenant1",
			"https://a.example/tenant1/.well-known/openid-configuration",
		},
	}
	for issuer, want := range tests {
		u, _ := url.Parse(issuer)
		if got := credhttp.MetadataURLs(u); !slices.Equal(got, want) {
			t.Errorf("MetadataURLs(%s) = %v, want %v", issuer, got, want)
		}
	}
}
