package web

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/mcpserver"
)

// MCPSessions lists the live clients of this process's MCP face (/mcp);
// *mcpserver.Server is one. Sessions live in the process that opened
// them, so each replica lists its own.
type MCPSessions interface {
	Sessions() []mcpserver.Session
}

type mcpData struct {
	// Enabled: this server serves /mcp.
	Enabled bool
	// All: the viewer sees every principal's clients (read), not only
	// their own.
	All   bool
	Items []mcpserver.Session
	Now   time.Time
}

// mcpSessions lists the live MCP clients the session may see: every
// principal's with read, else its own principal's, as for executions.
func (h *handler) mcpSessions(c echo.Context) error {
	who := h.principal(c)
	d := mcpData{Enabled: h.MCP != nil, All: who.SeesAll(), Now: time.Now()}
	if h.MCP != nil {
		for _, s := range h.MCP.Sessions() {
			if who.Sees(s.Principal) {
				d.Items = append(d.Items, s)
			}
		}
	}
	return h.render(c, http.StatusOK, mcpPage(h.page(c, "MCP clients", "mcp"), d))
}

// sessionTag is enough of a session id to tell a principal's sessions
// apart: its last 8 characters. The whole id never reaches the page:
// /mcp binds it to its caller, but it is the client's handle, not
// something to copy around. A 2026-era client has none.
func sessionTag(id string) string {
	switch {
	case id == "":
		return "—"
	case len(id) <= 8:
		return id
	}
	return "…" + id[len(id)-8:]
}

// clientText is a client's name and version as it announced them.
func clientText(s mcpserver.Session) string {
	switch {
	case s.Client == "":
		return "—"
	case s.Version == "":
		return s.Client
	}
	return s.Client + " " + s.Version
}

// ago is how long before now t was, to the second; a dash for never.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return max(now.Sub(t), 0).Round(time.Second).String() + " ago"
}
