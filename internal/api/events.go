package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness"
)

// heartbeat keeps idle event streams open through proxies.
const heartbeat = 15 * time.Second

// streamEvents serves an execution's events as Server-Sent Events. A client
// that reconnects with Last-Event-ID (or ?after=) gets every event after
// that one, none twice. The stream ends after execution.finished.
func (h *handlers) streamEvents(c echo.Context) error {
	ctx := c.Request().Context()
	id := c.Param("id")
	after := c.Request().Header.Get("Last-Event-ID")
	if after == "" {
		after = c.QueryParam("after")
	}
	if _, err := h.visible(c, id); err != nil {
		return err
	}
	// The first read answers 404 before any stream headers are sent.
	events, err := h.Executions.Events(ctx, id, after, 0)
	if err != nil {
		return err
	}
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, "text/event-stream")
	w.Header().Set(echo.HeaderCacheControl, "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	w.Flush()
	for {
		for _, ev := range events {
			data, _ := json.Marshal(ev.Data)
			fmt.Fprintf(w, "id: %s\nevent: %s\ndata: %s\n\n", ev.ID, ev.Type, data)
			after = ev.ID
			if ev.Type == harness.EventFinished {
				w.Flush()
				return nil
			}
		}
		if len(events) == 0 {
			// Resumed after the last event of a finished execution: nothing
			// more will come.
			if ex, err := h.Executions.Get(ctx, id); err == nil && ex.Status.Terminal() {
				return nil
			}
			fmt.Fprint(w, ": keep-alive\n\n")
		}
		w.Flush()
		if events, err = h.Executions.Events(ctx, id, after, heartbeat); err != nil {
			if ctx.Err() != nil || errors.Is(err, harness.ErrNotFound) {
				return nil
			}
			return nil // headers are sent: end the stream, the client reconnects
		}
	}
}

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
		if !harness.ValidName(name) {
			return fieldProblem(harness.CodeValidationFailed, fmt.Sprintf("/rerun/%d", i), "must be a connection name")
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
