package credhttp

import (
	"net"
	"net/url"
	"strings"
)

// Secure reports whether u may carry a credential: https to any host, or
// plain http only to this machine (a loopback host).
func Secure(u *url.URL) bool {
	switch u.Scheme {
	case "https":
		return u.Host != ""
	case "http":
		return Loopback(u.Hostname())
	}
	return false
}

// Loopback reports whether host names this machine: localhost or a
// loopback address.
func Loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// MetadataURLs are where an authorization server's metadata may be, in
// the order to try them: RFC 8414 §3 and OpenID Connect discovery, with
// the path-insertion forms for an issuer that has a path.
func MetadataURLs(issuer *url.URL) []string {
	origin := issuer.Scheme + "://" + issuer.Host
	p := strings.TrimSuffix(issuer.EscapedPath(), "/")
	if p == "" {
		return []string{origin + "/.well-known/oauth-authorization-server", origin + "/.well-known/openid-configuration"}
	}
	return []string{
		origin + "/.well-known/oauth-authorization-server" + p,
		origin + "/.well-known/openid-configuration" + p,
		origin + p + "/.well-known/openid-configuration",
	}
}
