package mcpserver

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// Codes of the HTTP-level refusals /mcp answers before the protocol does,
// as problem+json like the rest of the API (see openapi.yaml).
const (
	codeSessionNotFound  = "SESSION_NOT_FOUND"
	codeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	codeTooManySessions  = "TOO_MANY_SESSIONS"
	codeTooManyCalls     = "TOO_MANY_CALLS"
	codeToolsUnavailable = "TOOLS_UNAVAILABLE"
	// codeBridgeClosed: an acp-agent node's credential whose node run
	// ended between authentication and the request.
	codeBridgeClosed = "BRIDGE_CLOSED"
)

// retryAfter is the Retry-After of a refusal a retry may fix, in seconds.
const retryAfter = 5

func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type":   "urn:patchbay:problem:" + strings.ToLower(strings.ReplaceAll(code, "_", "-")),
		"title":  http.StatusText(status),
		"status": status,
		"detail": detail,
		"code":   code,
	})
}
