package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

type approvalList struct {
	Items []*gates.Approval `json:"items"`
}

// maxNote bounds the note a person leaves with a decision.
const maxNote = 2000

func approvalProblem(err error) error {
	switch {
	case errors.Is(err, gates.ErrApprovalNotFound):
		return problem(http.StatusNotFound, "APPROVAL_NOT_FOUND", "no approval with that id")
	case errors.Is(err, gates.ErrApprovalDecided):
		return problem(http.StatusConflict, "APPROVAL_DECIDED", err.Error())
	case errors.Is(err, gates.ErrSelfApproval):
		return problem(http.StatusConflict, "APPROVAL_SELF", "the key that requested this call cannot decide it; another approver must")
	case errors.Is(err, gates.ErrNotApprover):
		return forbidden("%s", err.Error())
	}
	return err
}

// seen returns the approval if the request's key may see it: one its own
// executions asked for, one it may decide, or any with read. Others are
// not found.
func (h *handlers) seenApproval(c echo.Context, id string) (*gates.Approval, error) {
	ap, err := h.Executions.Approvals().Get(c.Request().Context(), id)
	if err != nil {
		return nil, err
	}
	if !principal(c).SeesApproval(ap.RequestedBy, ap.Connection, ap.Op) {
		return nil, fmt.Errorf("approval %s: %w", id, gates.ErrApprovalNotFound)
	}
	return ap, nil
}

func (h *handlers) listApprovals(c echo.Context) error {
	state := gates.ApprovalState(c.QueryParam("state"))
	switch state {
	case "", gates.ApprovalPending, gates.ApprovalApproved, gates.ApprovalDenied, gates.ApprovalExpired:
	default:
		return fieldProblem(fault.CodeValidationFailed, "state", "must be one of pending, approved, denied, expired")
	}
	limit := 50
	if l := c.QueryParam("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 200 {
			return fieldProblem(fault.CodeValidationFailed, "limit", "must be a whole number from 1 to 200")
		}
		limit = n
	}
	p := principal(c)
	out, err := h.Executions.Approvals().ListWhere(c.Request().Context(), state, limit, func(ap *gates.Approval) bool {
		return p.SeesApproval(ap.RequestedBy, ap.Connection, ap.Op)
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, approvalList{Items: out})
}

func (h *handlers) getApproval(c echo.Context) error {
	ap, err := h.seenApproval(c, c.Param("id"))
	if err != nil {
		return approvalProblem(err)
	}
	return c.JSON(http.StatusOK, ap)
}

func (h *handlers) approve(c echo.Context) error { return h.decide(c, gates.ApprovalApproved) }
func (h *handlers) deny(c echo.Context) error    { return h.decide(c, gates.ApprovalDenied) }

// decide records a person's decision. The body is optional: {"note": "..."}.
func (h *handlers) decide(c echo.Context, state gates.ApprovalState) error {
	var body struct {
		Note string `json:"note"`
	}
	if c.Request().ContentLength != 0 {
		raw, err := readJSONBody(c)
		if err != nil {
			return err
		}
		if len(raw) > 0 {
			if err := decodeClosed(raw, &body); err != nil {
				return err
			}
		}
	}
	if len(body.Note) > maxNote {
		return fieldProblem(fault.CodeValidationFailed, "/note", "must be at most 2000 characters")
	}
	if _, err := h.seenApproval(c, c.Param("id")); err != nil {
		return approvalProblem(err)
	}
	ap, err := h.Executions.Approvals().DecideAs(c.Request().Context(), c.Param("id"), state, principal(c), body.Note)
	if err != nil {
		return approvalProblem(err)
	}
	return c.JSON(http.StatusOK, ap)
}
