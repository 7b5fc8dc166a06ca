package api

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
)

// MCPFace serves /mcp (see package mcpserver) for an authenticated caller.
type MCPFace interface {
	ServeMCP(w http.ResponseWriter, r *http.Request, caller authz.Principal)
}

// mountMCP adds /mcp: every method an era uses (POST; GET and DELETE for
// 2025 sessions), each authenticated as the caller. No token, no tools: a
// request without a valid key or token is 401 before the face sees it.
// Calling tools runs executions, so the caller needs the run role, as
// for POST /v1/executions.
func mountMCP(e *echo.Echo, face MCPFace, auth echo.MiddlewareFunc) {
	run := need(authz.Run)
	serve := func(c echo.Context) error {
		face.ServeMCP(c.Response(), c.Request(), principal(c))
		return nil
	}
	for _, m := range []string{http.MethodPost, http.MethodGet, http.MethodDelete} {
		e.Add(m, "/mcp", serve, auth, run)
	}
}

// mcpResourceMetadataPath is where /mcp's Protected Resource Metadata
// (RFC 9728) is served: the well-known prefix before the resource's path.
const mcpResourceMetadataPath = "/.well-known/oauth-protected-resource/mcp"

// MCPTokens verifies access tokens for /mcp and serves the metadata
// document that names their issuer.
type MCPTokens interface {
	TokenVerifier
	MetadataHandler() http.Handler
}

// bridgeTokens admits, at /mcp, the credential minted for an acp-agent
// node run (harness.BridgeCredentialPrefix), besides what next (OAuth
// access tokens; nil for none) admits. The credential stands for the
// node's agent: /mcp offers it that node's tools and runs its calls as
// steps of the node's execution, as the execution's principal.
type bridgeTokens struct {
	execs *harness.Executions
	next  TokenVerifier
}

var errBridgeCredential = errors.New("the agent credential is not valid: its node run has ended, or it was never minted here")

func (b bridgeTokens) Accepts(token string) bool {
	return strings.HasPrefix(token, harness.BridgeCredentialPrefix) || (b.next != nil && b.next.Accepts(token))
}

func (b bridgeTokens) Verify(ctx context.Context, token string) (authz.Principal, error) {
	if !strings.HasPrefix(token, harness.BridgeCredentialPrefix) {
		return b.next.Verify(ctx, token)
	}
	bc, ok := b.execs.Bridge(token)
	if !ok {
		return authz.Principal{}, errBridgeCredential
	}
	return authz.Principal{Name: "agent:" + bc.Execution + "/" + bc.Node, Roles: []authz.Role{authz.Run}, Bridge: bc.Bridge}, nil
}

func (b bridgeTokens) Challenge() string {
	if b.next == nil {
		return ""
	}
	return b.next.Challenge()
}
