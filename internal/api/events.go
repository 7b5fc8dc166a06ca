package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/eventstream"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// streamEvents serves an execution's events as Server-Sent Events. A client
// that reconnects with Last-Event-ID (or ?after=) gets every event after
// that one, none twice. The stream ends after execution.finished. Open
// streams are capped per key and per process (package eventstream).
func (h *handlers) streamEvents(c echo.Context) error {
	id := c.Param("id")
	after := c.Request().Header.Get("Last-Event-ID")
	if after == "" {
		after = c.QueryParam("after")
	}
	if _, err := h.visible(c, id); err != nil {
		return err
	}
	return h.Streams.Serve(c.Request().Context(), c.Response(), principal(c).Name, id, after, eventFormat)
}

// eventFormat names each message after its event's type, with the event's
// data as its data.
var eventFormat = eventstream.Format{Event: func(w io.Writer, ev harness.Event) error {
	data, _ := json.Marshal(ev.Data)
	_, err := fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", ev.ID, ev.Type, data)
	return err
}}

type resumeRequest struct {
	Rerun []string `json:"rerun"`
}

func (h *handlers) resumeExecution(c echo.Context) error {
	var req resumeRequest
	if c.Request().ContentLength != 0 {
		body, err := readJSONBody(c)
		if err != nil {
			return err
		}
		if err := decodeClosed(body, &req); err != nil {
			return err
		}
	}
	for i, name := range req.Rerun {
		if !registry.ValidName(name) {
			return fieldProblem(fault.CodeValidationFailed, fmt.Sprintf("/rerun/%d", i), "must be a connection name")
		}
	}
	if _, err := h.actable(c, c.Param("id")); err != nil {
		return err
	}
	ex, err := h.Executions.Resume(c.Request().Context(), c.Param("id"), req.Rerun)
	if errors.Is(err, harness.ErrNotResumable) {
		return problem(http.StatusConflict, "EXECUTION_NOT_RESUMABLE", err.Error())
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, acceptedResponse{ID: ex.ID, Status: ex.Status, Links: linksOf(ex.ID)})
}

func (h *handlers) cancelExecution(c echo.Context) error {
	if _, err := h.actable(c, c.Param("id")); err != nil {
		return err
	}
	ex, err := h.Executions.Cancel(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, executionResponse{Execution: ex, Links: linksOf(ex.ID)})
}
