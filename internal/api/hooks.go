package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/webhooks"
)

// Codes of the trigger routes.
const (
	codeDeadLetterNotFound = "DEADLETTER_NOT_FOUND"
)

type eventAnswer struct {
	// Status is accepted or duplicate.
	Status     string   `json:"status"`
	Connection string   `json:"connection"`
	Type       string   `json:"type"`
	ID         string   `json:"id"`
	Triggers   []string `json:"triggers"`
}

// receiveWebhook is POST /hooks/{connection}: no API key, the Standard
// Webhooks signature is the authentication. The body is read raw, as
// signed.
func (h *handlers) receiveWebhook(c echo.Context) error {
	name := c.Param("connection")
	if h.Webhooks == nil || !h.Webhooks.Has(name) {
		return problem(http.StatusNotFound, codeConnectionNotFound, fmt.Sprintf("no connection %q takes webhooks", name))
	}
	ctx := c.Request().Context()
	limit := h.Webhooks.MaxBodyBytes(name)
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, limit+1))
	if err != nil {
		var he *echo.HTTPError
		if errors.As(err, &he) && he.Code == http.StatusRequestEntityTooLarge {
			return webhookAnswer(c, h.Webhooks.TooLarge(ctx, name, c.Request().Header))
		}
		return problem(http.StatusBadRequest, webhooks.CodeMalformed, "could not read the request body")
	}
	if int64(len(body)) > limit {
		return webhookAnswer(c, h.Webhooks.TooLarge(ctx, name, c.Request().Header))
	}
	return webhookAnswer(c, h.Webhooks.Receive(ctx, name, c.Request().Header, body))
}

func webhookAnswer(c echo.Context, o webhooks.Outcome) error {
	switch {
	case o.Status == http.StatusNoContent:
		return c.NoContent(http.StatusNoContent)
	case o.Challenge != "":
		// An MCP server's verification request: the echo proves this
		// deployment asked for the deliveries.
		return c.JSON(http.StatusOK, map[string]string{"challenge": o.Challenge})
	case o.Status < 300:
		return c.JSON(o.Status, eventAnswer{Status: "duplicate", Connection: o.Event.Connection, Type: o.Event.Type, ID: o.Event.ID, Triggers: []string{}})
	}
	return problem(o.Status, o.Code, o.Detail, fieldErrors(o.Problems)...)
}

func fieldErrors(ps []triggers.FieldProblem) []fault.FieldError {
	out := make([]fault.FieldError, len(ps))
	for i, p := range ps {
		out[i] = fault.FieldError{Path: p.Path, Code: fault.CodeValidationFailed, Message: p.Message}
	}
	return out
}

// pushEvent is POST /v1/sources/{name}/events: host code pushing an event
// {type, id, payload}; the payload is validated against the event's schema.
func (h *handlers) pushEvent(c echo.Context) error {
	if h.Triggers == nil {
		return problem(http.StatusServiceUnavailable, codeNotReady, "triggers are not configured")
	}
	name := c.Param("name")
	if !principal(c).MayPush(name) {
		// Checked before the source's existence, so that a key without
		// the grant learns nothing about which sources exist.
		return forbidden("this API key may not push events into %q (the key's push grant names the sources it may)", name)
	}
	if !h.Triggers.HasSource(name) {
		return problem(http.StatusNotFound, codeConnectionNotFound, fmt.Sprintf("no source named %q", name))
	}
	body, err := readJSONBody(c)
	if err != nil {
		return err
	}
	if err := numbersProblem(body); err != nil {
		return err
	}
	key, err := idempotencyKey(c)
	if err != nil {
		return err
	}
	if key != "" {
		return h.pushOnce(c, name, key, body)
	}
	status, ans, err := h.push(c.Request().Context(), name, body, "")
	if err != nil {
		return err
	}
	return c.JSON(status, ans)
}

// push emits the event of body to the source and returns the status and
// answer of the push. A body without an id takes defaultID ("": the id
// is required).
func (h *handlers) push(ctx context.Context, name string, body []byte, defaultID string) (int, eventAnswer, error) {
	ev, err := triggers.DecodeEvent(body, defaultID)
	if err == nil {
		var res triggers.Result
		res, err = h.Triggers.Emit(ctx, name, ev, triggers.Via{Kind: "api"})
		if err == nil {
			ans := eventAnswer{Status: "accepted", Connection: name, Type: ev.Type, ID: ev.ID, Triggers: res.Triggers}
			if ans.Triggers == nil {
				ans.Triggers = []string{}
			}
			if res.Duplicate {
				ans.Status = "duplicate"
				return http.StatusOK, ans, nil
			}
			return http.StatusAccepted, ans, nil
		}
	}
	var ee *triggers.EventError
	switch {
	case errors.As(err, &ee):
		h.Triggers.Reject(ctx, name, triggers.Receipt{Via: "api", Status: http.StatusUnprocessableEntity, Reason: codeValidationFailed + ": " + ee.Error(), EventID: ev.ID, Type: ev.Type})
		return 0, eventAnswer{}, problem(http.StatusUnprocessableEntity, codeValidationFailed, ee.Error(), fieldErrors(ee.Problems)...)
	case errors.Is(err, triggers.ErrUnknownSource):
		return 0, eventAnswer{}, problem(http.StatusNotFound, codeConnectionNotFound, fmt.Sprintf("no source named %q", name))
	}
	return 0, eventAnswer{}, err
}

// startHarness is POST /v1/harness/start: starts trigger delivery and cron
// (idempotent) and answers with the status.
func (h *handlers) startHarness(c echo.Context) error {
	if h.Triggers == nil {
		return problem(http.StatusServiceUnavailable, codeNotReady, "triggers are not configured")
	}
	if err := h.Triggers.Start(c.Request().Context()); err != nil {
		return err
	}
	return h.harnessStatus(c)
}

// harnessStatus is GET /v1/harness/status.
func (h *handlers) harnessStatus(c echo.Context) error {
	if h.Triggers == nil {
		return problem(http.StatusServiceUnavailable, codeNotReady, "triggers are not configured")
	}
	st, err := h.Triggers.Status(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, st)
}

type deadLetterList struct {
	Items []triggers.DeadLetter `json:"items"`
}

// listDeadLetters is GET /v1/deadletters.
func (h *handlers) listDeadLetters(c echo.Context) error {
	if h.Triggers == nil {
		return problem(http.StatusServiceUnavailable, codeNotReady, "triggers are not configured")
	}
	dls, err := h.Triggers.DeadLetters(c.Request().Context())
	if err != nil {
		return err
	}
	if dls == nil {
		dls = []triggers.DeadLetter{}
	}
	return c.JSON(http.StatusOK, deadLetterList{Items: dls})
}

type redelivered struct {
	ID    string `json:"id"`
	Entry string `json:"entry"`
}

// redeliverDeadLetter is POST /v1/deadletters/{id}/redeliver.
func (h *handlers) redeliverDeadLetter(c echo.Context) error {
	if h.Triggers == nil {
		return problem(http.StatusServiceUnavailable, codeNotReady, "triggers are not configured")
	}
	id := c.Param("id")
	entry, err := h.Triggers.Redeliver(c.Request().Context(), id)
	if errors.Is(err, triggers.ErrDeadLetterNotFound) {
		return problem(http.StatusNotFound, codeDeadLetterNotFound, fmt.Sprintf("no dead letter %q", id))
	}
	if err != nil {
		return err
	}
	return c.JSON(http.StatusAccepted, redelivered{ID: id, Entry: entry})
}
