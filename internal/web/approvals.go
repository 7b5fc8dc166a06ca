package web

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/eventstream"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// maxNote matches the API's bound on a decision's note.
const maxNote = 2000

var approvalStates = []gates.ApprovalState{gates.ApprovalPending, gates.ApprovalApproved, gates.ApprovalDenied, gates.ApprovalExpired}

type approvalsData struct {
	Pending []*gates.Approval
	// Version fingerprints the pending list, so the live stream only
	// signals real changes.
	Version string
	Filter  string
	History []*gates.Approval
}

func fingerprint(aps []*gates.Approval) string {
	ids := make([]string, len(aps))
	for i, ap := range aps {
		ids[i] = ap.ID
	}
	return fmt.Sprintf("%d-%x", len(ids), hashString(strings.Join(ids, ",")))
}

func hashString(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

// pending lists the pending approvals this session may decide.
func (h *handler) pending(c echo.Context) ([]*gates.Approval, error) {
	who := h.principal(c)
	return h.Executions.Approvals().ListWhere(bg(c), gates.ApprovalPending, 200, func(ap *gates.Approval) bool {
		return h.Executions.Approvals().MayDecide(ap, who)
	})
}

// seen lists the approvals this session may see: those its own runs asked
// for, those it may decide, or all with read.
func (h *handler) seen(c echo.Context, state gates.ApprovalState, limit int) ([]*gates.Approval, error) {
	who := h.principal(c)
	return h.Executions.Approvals().ListWhere(bg(c), state, limit, func(ap *gates.Approval) bool {
		return who.SeesApproval(ap.RequestedBy, ap.Connection, ap.Op)
	})
}

func (h *handler) approvals(c echo.Context) error {
	pending, err := h.pending(c)
	if err != nil {
		return err
	}
	d := approvalsData{Pending: pending, Version: fingerprint(pending), Filter: c.QueryParam("state")}
	state := gates.ApprovalState(d.Filter)
	switch state {
	case "", gates.ApprovalApproved, gates.ApprovalDenied, gates.ApprovalExpired, gates.ApprovalPending:
	default:
		state, d.Filter = "", ""
	}
	if d.History, err = h.seen(c, state, 100); err != nil {
		return err
	}
	return h.render(c, http.StatusOK, approvalsPage(h.page(c, "Approvals", "approvals"), d))
}

// pendingFragment is the pending list alone, fetched by htmx when the
// stream says it changed.
func (h *handler) pendingFragment(c echo.Context) error {
	pending, err := h.pending(c)
	if err != nil {
		return err
	}
	return h.render(c, http.StatusOK, pendingList(sessionOf(c).CSRF, pending, fingerprint(pending)))
}

// approvalsStream is a Server-Sent Events stream with one "changed" event
// whenever the set of pending approvals differs from the version the page
// was rendered with (?v=). It looks every PollInterval: approvals are
// written by any replica, and a short poll of one sorted set is cheaper
// than a second notification path through Redis.
//
// It counts against the same caps as the execution streams.
func (h *handler) approvalsStream(c echo.Context) error {
	return h.changedStream(c, func() (string, int, error) {
		pending, err := h.pending(c)
		return fingerprint(pending), len(pending), err
	})
}

// changedStream serves a pending list's Server-Sent Events stream: look
// returns the list's version and length, every PollInterval; a version
// other than the last one sent (at first the page's ?v=) is one "changed"
// event with the length, and a comment keeps the connection alive every
// 15 s. It holds one of the principal's stream slots while it runs.
func (h *handler) changedStream(c echo.Context, look func() (version string, n int, err error)) error {
	release, err := h.Streams.Hold(h.principal(c).Name)
	if err != nil {
		return err
	}
	defer release()
	ctx := bg(c)
	last := c.QueryParam("v")
	w := c.Response()
	eventstream.Start(w)
	fmt.Fprint(w, "retry: 2000\n\n")
	w.Flush()
	tick := time.NewTicker(h.PollInterval)
	defer tick.Stop()
	idle := 0
	for {
		if v, n, err := look(); err == nil && v != last {
			last = v
			fmt.Fprintf(w, "event: changed\ndata: %d\n\n", n)
			w.Flush()
			idle = 0
		}
		if idle++; time.Duration(idle)*h.PollInterval >= 15*time.Second {
			fmt.Fprint(w, ": keep-alive\n\n")
			w.Flush()
			idle = 0
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (h *handler) approve(c echo.Context) error { return h.decide(c, gates.ApprovalApproved) }
func (h *handler) deny(c echo.Context) error    { return h.decide(c, gates.ApprovalDenied) }

func (h *handler) decide(c echo.Context, state gates.ApprovalState) error {
	note := strings.TrimSpace(c.FormValue("note"))
	if len(note) > maxNote {
		note = note[:maxNote]
	}
	back := "/admin/approvals"
	if next := c.FormValue("next"); strings.HasPrefix(next, "/admin/executions/") {
		back = safeNext(next)
	}
	sep := "?"
	if strings.Contains(back, "?") {
		sep = "&"
	}
	if ap, err := h.Executions.Approvals().Get(bg(c), c.Param("id")); err == nil && !h.principal(c).SeesApproval(ap.RequestedBy, ap.Connection, ap.Op) {
		return c.Redirect(http.StatusSeeOther, back+sep+"flash=gone")
	}
	_, err := h.Executions.Approvals().DecideAs(bg(c), c.Param("id"), state, h.principal(c), note)
	switch {
	case errors.Is(err, gates.ErrApprovalNotFound):
		return c.Redirect(http.StatusSeeOther, back+sep+"flash=gone")
	case errors.Is(err, gates.ErrSelfApproval):
		return c.Redirect(http.StatusSeeOther, back+sep+"flash=self")
	case errors.Is(err, gates.ErrNotApprover):
		return &refused{"You may not decide this approval: it needs the approve role for this connection and operation, and the connection's policy may name its approvers."}
	case errors.Is(err, gates.ErrApprovalDecided):
		return c.Redirect(http.StatusSeeOther, back+sep+"flash=decided")
	case err != nil:
		return err
	}
	return c.Redirect(http.StatusSeeOther, back+sep+"flash="+url.QueryEscape(string(state)))
}
