package config

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// MCPSection is the config file's mcp: what /mcp, patchbay's own MCP
// face, accepts besides API keys.
type MCPSection struct {
	// OAuth lets /mcp callers present an OAuth access token from one
	// authorization server instead of an API key; nil: API keys only.
	OAuth *MCPOAuth `yaml:"oauth"`
}

// MCPOAuth makes /mcp an OAuth 2.0 protected resource (RFC 9728): an
// access token issued by Issuer for this resource names a principal
// through Principals (or Default). See package bearer.
type MCPOAuth struct {
	// Issuer is the authorization server, exactly as its tokens' iss and
	// its metadata name it (https, or http on a loopback host).
	Issuer string `yaml:"issuer"`
	// JWKSURL is where the issuer publishes its signing keys; empty:
	// the jwks_uri of its metadata (RFC 8414, then OpenID discovery).
	JWKSURL string `yaml:"jwksUrl"`
	// IntrospectionURL is the issuer's RFC 7662 endpoint, for access
	// tokens that are not JWTs (opaque ones); empty: JWTs only.
	IntrospectionURL string `yaml:"introspectionUrl"`
	// ClientID and ClientSecret authenticate patchbay to the
	// introspection endpoint (HTTP Basic), where it asks for that.
	ClientID     string `yaml:"clientId"`
	ClientSecret string `yaml:"clientSecret" json:"-"`
	// Audience is what a token's aud must contain; empty: the resource,
	// <PATCHBAY_PUBLIC_URL>/mcp.
	Audience string `yaml:"audience"`
	// Claim names the caller (default sub); client_id suits servers whose
	// tokens name only the client.
	Claim string `yaml:"claim"`
	// Scopes are advertised in the resource's metadata
	// (scopes_supported); what a caller may do comes from its principal.
	Scopes []string `yaml:"scopes"`
	// Principals map a claim value to the principal it stands for. A
	// token whose value has no entry is refused, unless Default is set.
	Principals map[string]MCPPrincipal `yaml:"principals"`
	// Default, when set, is the allowlist and roles of a caller with a
	// valid token but no entry of its own; each such caller is still its
	// own principal, oauth:<claim value>. Nil: such tokens are refused.
	Default *MCPPrincipal `yaml:"default"`
}

// MCPPrincipal is who a token stands for: a name (default
// oauth:<claim value>), the allowlist that bounds what it may use, and its
// roles (none: run).
type MCPPrincipal struct {
	// Name is the principal the token stands for in approvals and audit
	// records; default oauth:<claim value>. Not allowed in the default
	// entry, whose callers are each their own oauth:<claim value>.
	Name string `yaml:"name"`
	// Allowlist names the allowlist that bounds what the caller may use;
	// required.
	Allowlist string `yaml:"allowlist"`
	// Roles say what the caller may do beyond running its own work (run,
	// read, approve, admin, or roles of your own); none means run.
	Roles []string `yaml:"roles"`
}

// MCPPrincipalPrefix starts the name of a token's principal that names
// none of its own.
const MCPPrincipalPrefix = "oauth:"

// MCPResourcePath is /mcp's path below PATCHBAY_PUBLIC_URL: the default
// audience and the resource of its metadata.
const MCPResourcePath = "/mcp"

// MCPResource is the URL /mcp is reached at: PATCHBAY_PUBLIC_URL (default
// http://<PATCHBAY_ADDR>) and /mcp.
func (c *Config) MCPResource() string {
	return c.PublicBase() + MCPResourcePath
}

// PublicBase is PATCHBAY_PUBLIC_URL without a trailing slash, or
// http://<PATCHBAY_ADDR> when it is not set.
func (c *Config) PublicBase() string {
	if c.PublicURL == "" {
		return "http://" + c.Addr
	}
	return strings.TrimSuffix(c.PublicURL, "/")
}

// claimRE is a claim name patchbay can read a caller from.
var claimRE = regexp.MustCompile(`^[A-Za-z0-9_.:/-]{1,64}$`)

// substituteMCP replaces ${env:NAME} in the mcp.oauth strings that may
// hold a deployment's values or a credential.
func (f *File) substituteMCP(getenv func(string) string, ps *problems) {
	o := f.MCP.OAuth
	if o == nil {
		return
	}
	const path = "mcp.oauth"
	for _, s := range []struct {
		field string
		v     *string
	}{
		{"issuer", &o.Issuer}, {"jwksUrl", &o.JWKSURL}, {"introspectionUrl", &o.IntrospectionURL},
		{"clientId", &o.ClientID}, {"clientSecret", &o.ClientSecret}, {"audience", &o.Audience},
	} {
		*s.v = substituteString(*s.v, path+"."+s.field, getenv, ps)
	}
}

// validateMCP checks mcp.oauth, and that the resource URL it defaults its
// audience to is one a client can reach.
func (c *Config) validateMCP(ps *problems) {
	o := c.File.MCP.OAuth
	if o == nil {
		return
	}
	const path = "mcp.oauth"
	// URL values may have come from ${env:…}: messages never quote them.
	switch {
	case o.Issuer == "":
		ps.add(path+".issuer", "is required: the authorization server whose tokens /mcp accepts")
	case !secureURL(o.Issuer):
		ps.add(path+".issuer", "must be an https URL (http only on a loopback host) without credentials, query or fragment")
	}
	for _, u := range []struct{ field, v string }{{"jwksUrl", o.JWKSURL}, {"introspectionUrl", o.IntrospectionURL}} {
		if u.v != "" && !secureURL(u.v) {
			ps.add(path+"."+u.field, "must be an https URL (http only on a loopback host) without credentials, query or fragment")
		}
	}
	if o.IntrospectionURL == "" {
		if o.ClientID != "" {
			ps.add(path+".clientId", "authenticates patchbay to introspectionUrl, which is not set")
		}
		if o.ClientSecret != "" {
			ps.add(path+".clientSecret", "authenticates patchbay to introspectionUrl, which is not set")
		}
	} else if o.ClientSecret != "" && o.ClientID == "" {
		ps.add(path+".clientSecret", "needs clientId")
	}
	if strings.TrimSpace(o.Audience) != o.Audience || strings.ContainsAny(o.Audience, "\r\n\x00") {
		ps.add(path+".audience", "must not have surrounding spaces or line breaks")
	}
	switch {
	case o.Claim == "":
	case !claimRE.MatchString(o.Claim):
		ps.add(path+".claim", "must be a claim name such as sub or client_id")
	case slices.Contains([]string{"iss", "aud", "exp", "nbf", "iat", "jti", "scope", "token_type", "active"}, o.Claim):
		ps.add(path+".claim", "%q says nothing about who the caller is; use sub (the default), client_id or a claim of your issuer's that names the user", o.Claim)
	}
	for i, s := range o.Scopes {
		if s == "" || strings.ContainsAny(s, " \t\r\n\"\\") {
			ps.add(fmt.Sprintf("%s.scopes[%d]", path, i), "must be a scope name, without spaces or quotes")
		}
	}
	if len(o.Principals) == 0 && o.Default == nil {
		ps.add(path+".principals", "names no principal, and there is no default: no token could be used; add the callers' %s values", o.claim())
	}
	for _, value := range slices.Sorted(maps.Keys(o.Principals)) {
		p := path + ".principals." + value
		if value == "" || strings.ContainsAny(value, "\r\n\x00") {
			ps.add(p, "must be a %s value", o.claim())
		}
		o.Principals[value].validate(ps, p)
	}
	if o.Default != nil {
		if o.Default.Name != "" {
			ps.add(path+".default.name", "is not allowed: each caller without an entry is its own principal, %s<%s>, so callers never share their executions", MCPPrincipalPrefix, o.claim())
		}
		o.Default.validate(ps, path+".default")
	}
	if o.Audience == "" && c.PublicURL == "" && !reachableAddr(c.Addr) {
		ps.add("PATCHBAY_PUBLIC_URL", "is required with mcp.oauth when PATCHBAY_ADDR (%s) names no host: a token's audience is <PATCHBAY_PUBLIC_URL>/mcp", c.Addr)
	}
}

func (o *MCPOAuth) claim() string {
	if o.Claim == "" {
		return "sub"
	}
	return o.Claim
}

func (p MCPPrincipal) validate(ps *problems, path string) {
	if p.Name != "" {
		if strings.TrimSpace(p.Name) != p.Name || strings.ContainsAny(p.Name, "\r\n\x00") {
			ps.add(path+".name", "must not have surrounding spaces or line breaks")
		} else if why := authz.Reserved(p.Name); why != "" {
			ps.add(path+".name", "%q is reserved: %s", p.Name, why)
		}
	}
	switch {
	case p.Allowlist == "":
		ps.add(path+".allowlist", "is required: the allowlist that bounds what this caller may use")
	case !ValidName(p.Allowlist):
		ps.add(path+".allowlist", "must be an allowlist name: a letter followed by letters, digits, '_' or '-'")
	}
	for i, r := range p.Roles {
		if !authz.ValidRole(r) {
			ps.add(fmt.Sprintf("%s.roles[%d]", path, i), "%q is not a role name (run, read, approve, admin, or your own: lowercase letters, digits, '_', '-')", r)
		}
	}
}

// secureURL accepts an absolute https URL, or http to a loopback host,
// without userinfo, query or fragment.
func secureURL(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return false
	}
	return credhttp.Secure(u)
}

// reachableAddr reports whether http://<addr> names a host a client could
// use: not empty and not an unspecified address (0.0.0.0, ::).
func reachableAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.IsUnspecified()
}
