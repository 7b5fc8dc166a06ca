package api

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness"
)

type allowlistList struct {
	Items []*harness.Allowlist `json:"items"`
}

type allowlistDetail struct {
	*harness.Allowlist
	History []harness.Change `json:"history"`
}

type allowlistDescription struct {
	Name        string                         `json:"name"`
	Connections map[string][]harness.Operation `json:"connections"`
}

func allowlistProblem(err error) error {
	if errors.Is(err, harness.ErrAllowlistNotFound) {
		return problem(http.StatusNotFound, "ALLOWLIST_NOT_FOUND", "no allowlist with that name")
	}
	return err
}

func (h *handlers) listAllowlists(c echo.Context) error {
	items, err := h.Allowlists.List(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, allowlistList{Items: items})
}

func (h *handlers) getAllowlist(c echo.Context) error {
	ctx := c.Request().Context()
	al, err := h.Allowlists.Get(ctx, c.Param("name"))
	if err != nil {
		return allowlistProblem(err)
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
	al, err := harness.ParseAllowlist(c.Param("name"), body)
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
	al, err := h.Allowlists.Get(c.Request().Context(), c.Param("name"))
	if err != nil {
		return allowlistProblem(err)
	}
	return c.JSON(http.StatusOK, allowlistDescription{Name: al.Name, Connections: harness.Describe(h.Registry, al)})
}
