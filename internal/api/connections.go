package api

import (
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
}

func (h *handlers) listConnections(c echo.Context) error {
	out := connectionList{Items: []harness.Status{}}
	for _, conn := range h.Registry.List() {
		out.Items = append(out.Items, conn.Status())
	}
	return c.JSON(http.StatusOK, out)
}

func (h *handlers) getConnection(c echo.Context) error {
	conn, err := h.Registry.Get(c.Param("name"))
	if err != nil {
		return err
	}
	ops := conn.Manifest().Operations
	if ops == nil {
		ops = []harness.Operation{}
	}
	return c.JSON(http.StatusOK, connectionDetail{Status: conn.Status(), Operations: ops})
}
