package oauth

import (
	"net/url"
	"testing"
)

func TestBearerChallenge(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values []string
		want   challenge
		ok     bool
	}{
		{"plain", []string{`Bearer realm="mcp", resource_metadata="https://h/.well-known/oauth-protected-resource/mcp", scope="a b"`},
			challenge{ResourceMetadata: "https://h/.well-known/oauth-protected-resource/mcp", Scope: "a b"}, true},
		{"insufficient scope", []string{`Bearer error="insufficient_scope", scope="mcp:write", error_description="need \"write\""`},
			challenge{Scope: "mcp:write", Error: "insufficient_scope"}, true},
		{"case and spacing", []string{`bearer   Scope = "x" ,RESOURCE_METADATA=https://h/m`}, challenge{Scope: "x", ResourceMetadata: "https://h/m"}, true},
		{"after another scheme", []string{`DPoP algs="ES256", Bearer scope="s"`}, challenge{Scope: "s"}, true},
		{"second header", []string{`Basic realm="x"`, `Bearer error="invalid_token"`}, challenge{Error: "invalid_token"}, true},
		{"bare scheme", []string{`Bearer`}, challenge{}, true},
		{"token68 before", []string{`Negotiate abc==, Bearer scope="s"`}, challenge{Scope: "s"}, true},
		{"no bearer", []string{`Basic realm="x"`}, challenge{}, false},
		{"garbage", []string{`=,,"" =`}, challenge{}, false},
		{"unterminated quote", []string{`Bearer scope="a b`}, challenge{Scope: "a b"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := bearerChallenge(tt.values)
			if got != tt.want || ok != tt.ok {
				t.Errorf("bearerChallenge(%q) = %+v, %v; want %+v, %v", tt.values, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func FuzzParseChallenges(f *testing.F) {
	f.Add(`Bearer realm="mcp", scope="a b", error="insufficient_scope"`)
	f.Add(`DPoP algs="ES256", Bearer x=y, z`)
	f.Fuzz(func(t *testing.T, h string) {
		_ = parseChallenges(h) // must end, must not panic
	})
}

func TestResourceCovers(t *testing.T) {
	t.Parallel()
	server, _ := url.Parse("http://localhost:3000/mcp")
	for resource, want := range map[string]bool{
		"":                               true,
		"http://localhost:3000/mcp":      true,
		"http://localhost:3000":          true,
		"http://localhost:3000/":         true,
		"HTTP://LOCALHOST:3000/mcp":      true,
		"http://localhost:3000/mcp/":     true,
		"http://localhost:3000/mc":       false,
		"http://localhost:3000/mcp/sub":  false,
		"http://localhost:3001/mcp":      false,
		"https://localhost:3000/mcp":     false,
		"https://evil.example.com/mcp":   false,
		"http://localhost:3000/mcp#frag": false,
	} {
		if got := resourceCovers(resource, server); got != want {
			t.Errorf("resourceCovers(%q) = %v, want %v", resource, got, want)
		}
	}
}
