package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness"
)

type connectionList struct {
	Items []harness.Status `json:"items"`
}

type connectionDetail struct {
	harness.Status
	Operations []harness.Operation `json:"operations"`
	// Events are the event types the server offers (MCP events/list),
	// which triggers and wait nodes may name.
	Events []harness.EventType `json:"events,omitempty"`
}

// connectionFilter says which connections the request's key may see:
// every one with read, else those its allowlist grants (what its
// documents may use).
func (h *handlers) connectionFilter(c echo.Context) (func(name string) bool, error) {
	p := principal(c)
	if p.SeesAll() {
		return func(string) bool { return true }, nil
	}
	al, err := h.Allowlists.Get(c.Request().Context(), p.Allowlist)
	if errors.Is(err, harness.ErrAllowlistNotFound) {
		return func(string) bool { return false }, nil
	}
	if err != nil {
		return nil, err
	}
	return func(name string) bool { _, ok := al.Connections[name]; return ok }, nil
}

func (h *handlers) listConnections(c echo.Context) error {
	sees, err := h.connectionFilter(c)
	if err != nil {
		return err
	}
	out := connectionList{Items: []harness.Status{}}
	for _, conn := range h.Registry.List() {
		if sees(conn.Name()) {
			out.Items = append(out.Items, h.statusFor(c, conn))
		}
	}
	return c.JSON(http.StatusOK, out)
}

// statusFor is conn's status as the request's key may see it: a pool's
// leases held by others' executions without their holders.
func (h *handlers) statusFor(c echo.Context, conn *harness.Connection) harness.Status {
	st := conn.Status()
	st.Pool = h.Executions.PoolStatusFor(c.Request().Context(), st.Pool, principal(c))
	return st
}

func (h *handlers) getConnection(c echo.Context) error {
	sees, err := h.connectionFilter(c)
	if err != nil {
		return err
	}
	name := c.Param("name")
	if !sees(name) {
		return &harness.Error{Code: harness.CodeConnectionUnknown, Message: fmt.Sprintf("no connection named %q", name)}
	}
	conn, err := h.Registry.Get(name)
	if err != nil {
		return err
	}
	ops := conn.Manifest().Operations
	if ops == nil {
		ops = []harness.Operation{}
	}
	return c.JSON(http.StatusOK, connectionDetail{Status: h.statusFor(c, conn), Operations: ops, Events: conn.EventTypes()})
}
