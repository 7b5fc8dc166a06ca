package oauth_test

import (
	"testing"

	"github.com/patchbay-dev/patchbay/internal/oauth"
)

// TestConfiguredIssuer: a connection naming its issuer (an API that
// publishes no protected resource metadata, such as Google's) signs in
// there without sending anything to the resource, and its AuthParams ride
// on the authorization request.
func TestConfiguredIssuer(t *testing.T) {
	t.Parallel()
	// The resource answers nothing at all: discovery through it would
	// fail the sign-in.
	b := setup(t, nil, nil, func(c *oauth.Connection) {
		c.ResourceURL = "http://127.0.0.1:9/never-contacted"
		c.AuthParams = map[string]string{"access_type": "offline", "prompt": "consent"}
	})
	b.conn.Issuer = b.as.issuer()
	b.svc, b.redactor = b.replica(t)
	b.signIn(t, b.svc, "alice")
	q := b.as.lastAuthRequest()
	if q.Get("access_type") != "offline" || q.Get("prompt") != "consent" || q.Get("code_challenge_method") != "S256" {
		t.Fatalf("authorization request = %v", q)
	}
	if tok := bearer(t, b.svc, "alice"); tok == "" {
		t.Fatal("no token after the sign-in")
	}
}
