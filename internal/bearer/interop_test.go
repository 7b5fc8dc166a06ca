package bearer_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/bearer"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// sdkVersion is the @modelcontextprotocol/sdk whose demo authorization
// server issues the tokens; the same pin as internal/oauth's interop test.
const sdkVersion = "1.32.2"

// TestInteropTypeScriptSDKDemoIssuer has the MCP TypeScript SDK's demo
// authorization server (simpleStreamableHttp.js --oauth) issue an access
// token for patchbay's /mcp, by dynamic registration and the authorization
// code flow with PKCE, and checks that the Verifier accepts it. The demo
// issues opaque tokens (random UUIDs) and publishes no key set, so they
// are checked by introspection at its /introspect, which names the
// client (client_id), not a user.
func TestInteropTypeScriptSDKDemoIssuer(t *testing.T) {
	t.Parallel()
	mcpPort, authPort := npmtest.OAuthDemo(t, sdkVersion)
	authBase := fmt.Sprintf("http://localhost:%d", authPort)

	var md struct {
		Issuer                string `json:"issuer"`
		AuthorizationEndpoint string `json:"authorization_endpoint"`
		TokenEndpoint         string `json:"token_endpoint"`
		RegistrationEndpoint  string `json:"registration_endpoint"`
		JWKSURI               string `json:"jwks_uri"`
	}
	getJSON(t, authBase+"/.well-known/oauth-authorization-server", &md)
	if md.Issuer != authBase+"/" || md.RegistrationEndpoint == "" {
		t.Fatalf("demo metadata = %+v", md)
	}
	if md.JWKSURI != "" {
		t.Errorf("the demo now publishes a key set (%s): its tokens may be JWTs; test them against it", md.JWKSURI)
	}

	const patchbay = "http://127.0.0.1:8080"
	const ourResource = patchbay + "/mcp"
	clientID, token := demoToken(t, md.AuthorizationEndpoint, md.TokenEndpoint, md.RegistrationEndpoint, ourResource)
	if strings.Count(token, ".") == 2 {
		t.Logf("the demo issued a JWT-shaped token; it is still checked by introspection here")
	}

	newVerifier := func(introspection string) *bearer.Verifier {
		v, err := bearer.New(bearer.Options{
			Issuer:           md.Issuer,
			Resource:         ourResource,
			MetadataURL:      patchbay + "/.well-known/oauth-protected-resource/mcp",
			IntrospectionURL: introspection,
			Claim:            "client_id",
			Principals:       map[string]bearer.Principal{clientID: {Name: "demo-client", Allowlist: "default"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	v := newVerifier(authBase + "/introspect")
	p, err := v.Verify(t.Context(), token)
	if err != nil || p.Name != "demo-client" || p.Allowlist != "default" {
		t.Fatalf("the demo's token: %+v, %v", p, err)
	}
	for _, made := range []string{"made-up-token", "2b3e9c5a-0000-4000-8000-000000000000", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"} {
		if _, err := v.Verify(t.Context(), made); !errors.Is(err, bearer.ErrRefused) || !strings.Contains(err.Error(), "not active") {
			t.Errorf("made-up token %q: %v, want ErrRefused: not active", made, err)
		}
	}

	// A token the demo issued for another resource (its own MCP server)
	// is not for patchbay.
	_, other := demoToken(t, md.AuthorizationEndpoint, md.TokenEndpoint, md.RegistrationEndpoint, fmt.Sprintf("http://localhost:%d/mcp", mcpPort))
	if _, err := v.Verify(t.Context(), other); !errors.Is(err, bearer.ErrRefused) || !strings.Contains(err.Error(), "audience") {
		t.Errorf("a token for another resource: %v, want ErrRefused for its audience", err)
	}
	// Without introspection an opaque token is not checked at all.
	if _, err := newVerifier("").Verify(t.Context(), token); !errors.Is(err, bearer.ErrRefused) {
		t.Errorf("an opaque token without introspection: %v", err)
	}
}

// demoToken registers a public client with the demo and runs the
// authorization code flow with PKCE (S256) for resource, as a browser and
// an MCP client would, returning the client's id and the access token.
// The demo approves at once and redirects to the callback; the redirect
// is read, not followed.
func demoToken(t *testing.T, authorize, tokenURL, register, resource string) (string, string) {
	t.Helper()
	const redirect = "http://127.0.0.1:9/callback"
	var client struct {
		ClientID string `json:"client_id"`
	}
	postJSON(t, register, map[string]any{
		"client_name": "patchbay bearer test", "redirect_uris": []string{redirect},
		"grant_types": []string{"authorization_code"}, "response_types": []string{"code"},
		"token_endpoint_auth_method": "none",
	}, &client)
	if client.ClientID == "" {
		t.Fatal("registration gave no client_id")
	}

	verifier := randomString(t)
	sum := sha256.Sum256([]byte(verifier))
	state := randomString(t)
	q := url.Values{
		"response_type": {"code"}, "client_id": {client.ClientID}, "redirect_uri": {redirect},
		"code_challenge": {base64.RawURLEncoding.EncodeToString(sum[:])}, "code_challenge_method": {"S256"},
		"state": {state}, "scope": {"mcp:tools"}, "resource": {resource},
	}
	noFollow := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(authorize + "?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, err := resp.Location()
	if err != nil {
		t.Fatalf("authorize = %d without a redirect: %v", resp.StatusCode, err)
	}
	if loc.Query().Get("state") != state || loc.Query().Get("code") == "" {
		t.Fatalf("authorize redirected to %s", loc)
	}

	form := url.Values{
		"grant_type": {"authorization_code"}, "code": {loc.Query().Get("code")}, "code_verifier": {verifier},
		"client_id": {client.ClientID}, "redirect_uri": {redirect}, "resource": {resource},
	}
	resp, err = http.PostForm(tokenURL, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var tok struct {
		AccessToken string `json:"access_token"`
		TokenType   string `json:"token_type"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil || resp.StatusCode != 200 || tok.AccessToken == "" {
		t.Fatalf("token = %d %+v %v", resp.StatusCode, tok, err)
	}
	if !strings.EqualFold(tok.TokenType, "bearer") {
		t.Errorf("token_type = %q", tok.TokenType)
	}
	return client.ClientID, tok.AccessToken
}

func randomString(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func getJSON(t *testing.T, u string, v any) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s = %d, %v", u, resp.StatusCode, err)
	}
}

func postJSON(t *testing.T, u string, body, v any) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(u, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("POST %s = %d, %v", u, resp.StatusCode, err)
	}
}
