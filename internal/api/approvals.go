package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness"
)

type approvalList struct {
	Items []*harness.Approval `json:"items"`
}

// maxNote bounds the note a person leaves with a decision.
const maxNote = 2000

func approvalProblem(err error) error {
	switch {
	case errors.Is(err, harness.ErrApprovalNotFound):
		return problem(http.StatusNotFound, "APPROVAL_NOT_FOUND", "no approval with that id")
	case errors.Is(err, harness.ErrApprovalDecided):
		return problem(http.StatusConflict, "APPROVAL_DECIDED", err.Error())
	}
	return err
}

func (h *handlers) listApprovals(c echo.Context) error {
	state := harness.ApprovalState(c.QueryParam("state"))
	switch state {
	case "", harness.ApprovalPending, harness.ApprovalApproved, harness.ApprovalDenied, harness.ApprovalExpired:
	default:
		return fieldProblem(harness.CodeValidationFailed, "state", "must be one of pending, approved, denied, expired")
	}
	limit := 50
	if l := c.QueryParam("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 200 {
			return fieldProblem(harness.CodeValidationFailed, "limit", "must be a whole number from 1 to 200")
		}
		limit = n
	}
	items, err := h.Executions.Approvals().List(c.Request().Context(), state, limit)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, approvalList{Items: items})
}

func (h *handlers) getApproval(c echo.Context) error {
	ap, err := h.Executions.Approvals().Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return approvalProblem(err)
	}
	return c.JSON(http.StatusOK, ap)
}

func (h *handlers) approve(c echo.Context) error { return h.decide(c, harness.ApprovalApproved) }
func (h *handlers) deny(c echo.Context) error    { return h.decide(c, harness.ApprovalDenied) }

// decide records a person's decision. The body is optional: {"note": "..."}.
func (h *handlers) decide(c echo.Context, state harness.ApprovalState) error {
	var body struct {
		Note string `json:"note"`
	}
	if c.Request().ContentLength != 0 {
		raw, err := readJSONBody(c)
		if err != nil {
			return err
		}
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &body); err != nil {
				return malformed(err)
			}
		}
	}
	if len(body.Note) > maxNote {
		return fieldProblem(harness.CodeValidationFailed, "/note", "must be at most 2000 characters")
	}
	ap, err := h.Executions.Approvals().Decide(c.Request().Context(), c.Param("id"), state, principal(c).Name, body.Note)
	if err != nil {
		return approvalProblem(err)
	}
	return c.JSON(http.StatusOK, ap)
}
