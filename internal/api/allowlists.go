package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

type allowlistList struct {
	Items []*gates.Allowlist `json:"items"`
}

type allowlistDetail struct {
	*gates.Allowlist
	History []gates.Change `json:"history"`
}

type allowlistDescription struct {
	Name        string                         `json:"name"`
	Connections map[string][]connect.Operation `json:"connections"`
}

func allowlistProblem(err error) error {
	if errors.Is(err, gates.ErrAllowlistNotFound) {
		return problem(http.StatusNotFound, "ALLOWLIST_NOT_FOUND", "no allowlist with that name")
	}
	return err
}

// A key sees its own allowlist (what it may use); read sees them all.
func seesAllowlist(c echo.Context, name string) bool {
	p := principal(c)
	return p.SeesAll() || p.Allowlist == name
}

func (h *handlers) listAllowlists(c echo.Context) error {
	items, err := h.Allowlists.List(c.Request().Context())
	if err != nil {
		return err
	}
	out := []*gates.Allowlist{}
	for _, al := range items {
		if seesAllowlist(c, al.Name) {
			out = append(out, al)
		}
	}
	return c.JSON(http.StatusOK, allowlistList{Items: out})
}

// seenAllowlist returns the named allowlist if the key may see it; others
// are not found.
func (h *handlers) seenAllowlist(c echo.Context, name string) (*gates.Allowlist, error) {
	if !seesAllowlist(c, name) {
		return nil, allowlistProblem(fmt.Errorf("allowlist %s: %w", name, gates.ErrAllowlistNotFound))
	}
	al, err := h.Allowlists.Get(c.Request().Context(), name)
	if err != nil {
		return nil, allowlistProblem(err)
	}
	return al, nil
}

func (h *handlers) getAllowlist(c echo.Context) error {
	ctx := c.Request().Context()
	al, err := h.seenAllowlist(c, c.Param("name"))
	if err != nil {
		return err
	}
	hist, err := h.Allowlists.History(ctx, al.Name)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, allowlistDetail{Allowlist: al, History: hist})
}

func (h *handlers) putAllowlist(c echo.Context) error {
	body, err := readJSONBody(c)
	if err != nil {
		return err
	}
	al, err := gates.ParseAllowlist(c.Param("name"), body)
	if err != nil {
		return err
	}
	created, err := h.Allowlists.Put(c.Request().Context(), al, principal(c).Name)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return c.JSON(status, al)
}

func (h *handlers) deleteAllowlist(c echo.Context) error {
	if err := h.Allowlists.Delete(c.Request().Context(), c.Param("name"), principal(c).Name); err != nil {
		return allowlistProblem(err)
	}
	return c.NoContent(http.StatusNoContent)
}

func (h *handlers) describeAllowlist(c echo.Context) error {
	al, err := h.seenAllowlist(c, c.Param("name"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, allowlistDescription{Name: al.Name, Connections: gates.Describe(h.Registry, al)})
}
