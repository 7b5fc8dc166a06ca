package main

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/bearer"
	"github.com/patchbay-dev/patchbay/internal/config"
)

var _ api.MCPTokens = (*bearer.Verifier)(nil)

// mcpTokens builds the verifier of the OAuth access tokens /mcp accepts
// when the config file has mcp.oauth, and nil otherwise (API keys only).
// The resource is <PATCHBAY_PUBLIC_URL>/mcp and its metadata is served
// below the same base, where the 401's challenge points.
func mcpTokens(cfg *config.Config, logger *slog.Logger) (api.MCPTokens, error) {
	o := cfg.File.MCP.OAuth
	if o == nil {
		return nil, nil
	}
	principals := make(map[string]bearer.Principal, len(o.Principals))
	for _, value := range slices.Sorted(maps.Keys(o.Principals)) {
		principals[value] = bearerPrincipal(o.Principals[value])
	}
	var def *bearer.Principal
	if o.Default != nil {
		p := bearerPrincipal(*o.Default)
		def = &p
	}
	v, err := bearer.New(bearer.Options{
		Issuer:           o.Issuer,
		Resource:         cfg.MCPResource(),
		MetadataURL:      cfg.PublicBase() + "/.well-known/oauth-protected-resource" + config.MCPResourcePath,
		Audience:         o.Audience,
		JWKSURL:          o.JWKSURL,
		IntrospectionURL: o.IntrospectionURL,
		ClientID:         o.ClientID,
		ClientSecret:     o.ClientSecret,
		Claim:            o.Claim,
		Scopes:           o.Scopes,
		Principals:       principals,
		Default:          def,
		Logger:           logger,
	})
	if err != nil {
		return nil, fmt.Errorf("mcp.oauth: %w", err)
	}
	return v, nil
}

func bearerPrincipal(p config.MCPPrincipal) bearer.Principal {
	roles := make([]authz.Role, len(p.Roles))
	for i, r := range p.Roles {
		roles[i] = authz.Role(r)
	}
	return bearer.Principal{Name: p.Name, Allowlist: p.Allowlist, Roles: roles}
}
