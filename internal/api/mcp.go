package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/authz"
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
