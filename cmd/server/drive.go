package main

import (
	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/drive"
	"github.com/patchbay-dev/patchbay/internal/oauth"
)

// googleIssuer is Google's authorization server, where a drive entry's
// users sign in unless its oauth names another issuer.
const googleIssuer = "https://accounts.google.com"

// driveAPI is the Drive API base a drive entry calls.
func driveAPI(d config.Drive) string {
	if d.APIBaseURL != "" {
		return d.APIBaseURL
	}
	return drive.DefaultAPIBaseURL
}

// serviceAccount is the service account a drive entry acts as, or nil.
func serviceAccount(spec config.Connection) *config.ServiceAccount {
	if spec.Auth == nil {
		return nil
	}
	return spec.Auth.ServiceAccount
}

// driveSignIn completes the sign-in of a drive entry signed in to with
// OAuth: Google's APIs publish no protected resource metadata, so the
// sign-in goes to the issuer directly (the client's credentials go only
// there); the scope defaults to drive.file; and Google issues a refresh
// token only with access_type=offline, at every sign-in only with
// prompt=consent.
func driveSignIn(c *oauth.Connection, spec config.Connection) {
	c.Issuer = spec.Auth.OAuth.Issuer
	if c.Issuer == "" {
		c.Issuer = googleIssuer
	}
	c.ClientIssuer = c.Issuer
	if len(c.Scopes) == 0 {
		c.Scopes = []string{drive.DefaultScope}
	}
	c.AuthParams = map[string]string{"access_type": "offline", "prompt": "consent"}
}
