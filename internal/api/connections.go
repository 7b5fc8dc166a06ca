package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

type connectionList struct {
	Items []registry.Status `json:"items"`
}

// A connection's detail carries its operations' input schemas while they
// are small: a document can describe operations whose schemas add up to
// tens of megabytes, and the detail is what a client (or the admin UI's
// user) asks for to see what a connection offers. A schema left out is
// at GET /v1/connections/{name}/operations/{op}.
const (
	detailSchemaBytes  = 64 << 10 // one operation's
	detailSchemasBytes = 1 << 20  // all of them together
)

// operationSummary is an operation in a connection's detail.
type operationSummary struct {
	connect.Operation
	// InputSchemaBytes is the size of an input schema left out of the
	// detail.
	InputSchemaBytes int `json:"inputSchemaBytes,omitempty"`
}

type connectionDetail struct {
	registry.Status
	Operations []operationSummary `json:"operations"`
	// Events are the event types the server offers (MCP events/list),
	// which triggers and wait nodes may name.
	Events []connect.EventType `json:"events,omitempty"`
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
	if errors.Is(err, gates.ErrAllowlistNotFound) {
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
	out := connectionList{Items: []registry.Status{}}
	for _, conn := range h.Registry.List() {
		if sees(conn.Name()) {
			out.Items = append(out.Items, h.statusFor(c, conn))
		}
	}
	return c.JSON(http.StatusOK, out)
}

// statusFor is conn's status as the request's key may see it: a pool's
// leases held by others' executions without their holders.
func (h *handlers) statusFor(c echo.Context, conn *registry.Connection) registry.Status {
	st := conn.Status()
	st.Pool = h.Executions.PoolStatusFor(c.Request().Context(), st.Pool, principal(c))
	return st
}

// visibleConnection is the connection the path names, when the request's
// key may see it; CONNECTION_UNKNOWN otherwise, as if it did not exist.
func (h *handlers) visibleConnection(c echo.Context) (*registry.Connection, error) {
	sees, err := h.connectionFilter(c)
	if err != nil {
		return nil, err
	}
	name := c.Param("name")
	if !sees(name) {
		return nil, &fault.Error{Code: fault.CodeConnectionUnknown, Message: fmt.Sprintf("no connection named %q", name)}
	}
	return h.Registry.Get(name)
}

func (h *handlers) getConnection(c echo.Context) error {
	conn, err := h.visibleConnection(c)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, connectionDetail{Status: h.statusFor(c, conn), Operations: summaries(conn.Manifest().Operations), Events: conn.EventTypes()})
}

// summaries lists ops with their input schemas while each is at most
// detailSchemaBytes and all together at most detailSchemasBytes, in
// manifest order; the others give their size instead.
func summaries(ops []connect.Operation) []operationSummary {
	out := make([]operationSummary, len(ops))
	total := 0
	for i, op := range ops {
		out[i].Operation = op
		n := len(op.InputSchema)
		if n > detailSchemaBytes || total+n > detailSchemasBytes {
			out[i].InputSchema, out[i].InputSchemaBytes = nil, n
			continue
		}
		total += n
	}
	return out
}

// getOperation answers one operation of a connection, its input schema
// whole. The operation's name is the rest of the path, slashes included
// (issues/create).
func (h *handlers) getOperation(c echo.Context) error {
	conn, err := h.visibleConnection(c)
	if err != nil {
		return err
	}
	op := c.Param("*")
	if c.Request().URL.RawPath != "" {
		// The router matched the escaped path: its values are escaped.
		if u, err := url.PathUnescape(op); err == nil {
			op = u
		}
	}
	found, ok := conn.Manifest().Operation(op)
	if !ok {
		return problem(http.StatusNotFound, string(fault.CodeOperationUnknown), fmt.Sprintf("connection %s has no operation %q", conn.Name(), strings.ToValidUTF8(op, "?")))
	}
	return c.JSON(http.StatusOK, found)
}
