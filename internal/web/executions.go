package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/eventstream"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

type executionsData struct {
	Filter string
	Items  []*harness.Execution
	Next   string
}

func (h *handler) executions(c echo.Context) error {
	d := executionsData{Filter: c.QueryParam("status")}
	opts := harness.ListOptions{Cursor: c.QueryParam("cursor"), Limit: 50}
	if who := h.principal(c); !who.SeesAll() {
		opts.Principal = who.Name
	}
	if harness.ValidExecState(d.Filter) {
		opts.Status = harness.ExecState(d.Filter)
	} else {
		d.Filter = ""
	}
	pg, err := h.Executions.List(bg(c), opts)
	if errors.Is(err, harness.ErrBadCursor) {
		pg, err = h.Executions.List(bg(c), harness.ListOptions{Status: opts.Status, Limit: 50, Principal: opts.Principal})
	}
	if err != nil {
		return err
	}
	d.Items, d.Next = pg.Items, pg.Next
	return h.render(c, http.StatusOK, executionsPage(h.page(c, "Executions", "executions"), d))
}

type executionData struct {
	Ex        *harness.Execution
	Approvals []*gates.Approval // pending approvals of this execution
	Events    []harness.Event
	// Agents is what the acp-agent nodes reported in Events.
	Agents []agentView
	// TraceLink is the execution's trace in the tracing UI; empty without
	// a trace or a PATCHBAY_TRACE_URL.
	TraceLink string
}

func (d executionData) live() bool { return !d.Ex.Status.Terminal() }

// visible returns the execution if the session may see it (its own, or
// any with read); one it may not see is not found, as in the API.
func (h *handler) visible(c echo.Context, id string) (*harness.Execution, error) {
	ex, err := h.Executions.Get(bg(c), id)
	if errors.Is(err, fault.ErrNotFound) || (err == nil && !h.principal(c).Sees(ex.Principal)) {
		return nil, &notFound{"No execution has that id (it may have expired)."}
	}
	return ex, err
}

// actable returns the execution if the session may cancel or resume it:
// its owner with run, or admin.
func (h *handler) actable(c echo.Context, id string) (*harness.Execution, error) {
	ex, err := h.visible(c, id)
	if err == nil && !h.principal(c).Acts(ex.Principal) {
		return nil, &refused{"Only whoever started this execution, or an admin, may change it."}
	}
	return ex, err
}

func (h *handler) loadExecution(c echo.Context) (executionData, error) {
	ctx := bg(c)
	ex, err := h.visible(c, c.Param("id"))
	if err != nil {
		return executionData{}, err
	}
	d := executionData{Ex: ex, TraceLink: traceLink(h.TraceURL, ex.TraceID)}
	for _, st := range ex.Steps {
		if st.ApprovalID == "" || st.Status != harness.StepWaiting {
			continue
		}
		if ap, err := h.Executions.Approvals().Get(ctx, st.ApprovalID); err == nil && ap.State == gates.ApprovalPending {
			d.Approvals = append(d.Approvals, ap)
		}
	}
	after := ""
	for range 10 { // at most the last 1000 events (the stream keeps about that many)
		evs, err := h.Executions.Events(ctx, ex.ID, after, 0)
		if err != nil || len(evs) == 0 {
			break
		}
		d.Events = append(d.Events, evs...)
		after = evs[len(evs)-1].ID
	}
	d.Agents = agentViews(d.Events)
	return d, nil
}

func (h *handler) execution(c echo.Context) error {
	d, err := h.loadExecution(c)
	if err != nil {
		return err
	}
	return h.render(c, http.StatusOK, executionPage(h.page(c, "Execution "+d.Ex.ID, "executions"), d))
}

// executionBody is the live part of the execution page, fetched by htmx
// each time the event stream moves.
func (h *handler) executionBody(c echo.Context) error {
	d, err := h.loadExecution(c)
	if err != nil {
		return err
	}
	return h.render(c, http.StatusOK, executionBody(h.page(c, "", "executions"), d))
}

// executionStream relays the execution's event stream as SSE: "update"
// for every event, then "finished" once it ends (the page closes the
// stream on it). It is the API's /v1/executions/{id}/events under the
// session instead of an API key, served by the same Streams and counted
// against the same caps.
func (h *handler) executionStream(c echo.Context) error {
	id := c.Param("id")
	if _, err := h.visible(c, id); err != nil {
		return err
	}
	err := h.Streams.Serve(bg(c), c.Response(), h.principal(c).Name, id, c.Request().Header.Get("Last-Event-ID"), updateFormat)
	switch {
	case errors.Is(err, harness.ErrInvalidEventID):
		return echo.NewHTTPError(http.StatusBadRequest)
	case errors.Is(err, fault.ErrNotFound):
		return &notFound{"No execution has that id."}
	}
	return err
}

// updateFormat tells the page that something changed ("update", with the
// event), and that nothing more will ("finished").
var updateFormat = eventstream.Format{
	Event: func(w io.Writer, ev harness.Event) error {
		data, _ := json.Marshal(map[string]any{"type": ev.Type, "data": ev.Data})
		_, err := fmt.Fprintf(w, "id: %s\nevent: update\ndata: %s\n\n", ev.ID, data)
		return err
	},
	End: func(w io.Writer, last *harness.Event) error {
		data := []byte("{}")
		if last != nil {
			data, _ = json.Marshal(map[string]any{"type": last.Type, "data": last.Data})
		}
		_, err := fmt.Fprintf(w, "event: finished\ndata: %s\n\n", data)
		return err
	},
}

func (h *handler) cancel(c echo.Context) error {
	id := c.Param("id")
	if _, err := h.actable(c, id); err != nil {
		return err
	}
	if _, err := h.Executions.Cancel(bg(c), id); errors.Is(err, fault.ErrNotFound) {
		return &notFound{"No execution has that id."}
	} else if err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, "/admin/executions/"+id+"?flash=cancelled")
}

func (h *handler) resume(c echo.Context) error {
	id := c.Param("id")
	if _, err := h.actable(c, id); err != nil {
		return err
	}
	_, err := h.Executions.Resume(bg(c), id, nil)
	switch {
	case errors.Is(err, harness.ErrNotResumable):
		return c.Redirect(http.StatusSeeOther, "/admin/executions/"+id+"?flash=not-resumable")
	case errors.Is(err, fault.ErrNotFound):
		return &notFound{"No execution has that id."}
	case err != nil:
		return err
	}
	return c.Redirect(http.StatusSeeOther, "/admin/executions/"+id+"?flash=resumed")
}

// traceLink fills the trace URL template; the id is hex, so it needs no
// escaping.
func traceLink(template, traceID string) string {
	if template == "" || traceID == "" {
		return ""
	}
	return strings.ReplaceAll(template, "{traceId}", traceID)
}

// What the Agent section shows of one node run at most.
const (
	maxAgentTextShown  = 64 << 10
	maxAgentCallsShown = 200
)

// agentView is what one acp-agent node run reported: its message so far,
// its tool calls and its latest plan.
type agentView struct {
	Key, ID string // the ledger key (the node id, with an iteration's suffix) and the node id
	Text    string
	TextCut bool // the message goes on past Text, cut at maxAgentTextShown bytes
	Calls   []agentCall
	// MoreCalls counts the tool calls past the first maxAgentCallsShown,
	// which are not shown.
	MoreCalls int
	Plan      []agentPlanEntry
}

type agentCall struct{ ID, Title, Kind, Status string }

type agentPlanEntry struct{ Content, Priority, Status string }

// agentViews gathers the agent events among events by node run, in the
// order the runs first reported: the message pieces concatenated, each
// tool call with the latest of what was reported of it, and the last
// plan. Other events are ignored.
func agentViews(events []harness.Event) []agentView {
	type acc struct {
		view  agentView
		text  strings.Builder
		calls map[string]int // tool call id -> index in view.Calls, or -1 if not shown
	}
	var order []*acc
	runs := map[string]*acc{}
	for _, ev := range events {
		if ev.Type != harness.EventAgentMessage && ev.Type != harness.EventAgentToolCall && ev.Type != harness.EventAgentPlan {
			continue
		}
		id := eventString(ev.Data, "id")
		key := eventString(ev.Data, "key")
		if key == "" {
			key = id
		}
		if key == "" {
			continue
		}
		a := runs[key]
		if a == nil {
			if id == "" {
				id = key
			}
			a = &acc{view: agentView{Key: key, ID: id}, calls: map[string]int{}}
			runs[key] = a
			order = append(order, a)
		}
		switch ev.Type {
		case harness.EventAgentMessage:
			text := eventString(ev.Data, "text")
			if a.view.TextCut {
				continue
			}
			if room := maxAgentTextShown - a.text.Len(); len(text) > room {
				text = cutUTF8(text, room)
				a.view.TextCut = true
			}
			a.text.WriteString(text)
		case harness.EventAgentToolCall:
			callID := eventString(ev.Data, "toolCallId")
			if callID == "" {
				continue
			}
			i, seen := a.calls[callID]
			if !seen {
				i = -1
				if len(a.view.Calls) < maxAgentCallsShown {
					i = len(a.view.Calls)
					a.view.Calls = append(a.view.Calls, agentCall{ID: callID})
				} else {
					a.view.MoreCalls++
				}
				a.calls[callID] = i
			}
			if i < 0 {
				continue
			}
			c := &a.view.Calls[i]
			for _, f := range []struct {
				name string
				to   *string
			}{{"title", &c.Title}, {"kind", &c.Kind}, {"status", &c.Status}} {
				if s := eventString(ev.Data, f.name); s != "" {
					*f.to = s
				}
			}
		case harness.EventAgentPlan:
			entries, _ := ev.Data["entries"].([]any)
			a.view.Plan = make([]agentPlanEntry, 0, len(entries))
			for _, e := range entries {
				m, _ := e.(map[string]any)
				a.view.Plan = append(a.view.Plan, agentPlanEntry{Content: eventString(m, "content"), Priority: eventString(m, "priority"), Status: eventString(m, "status")})
			}
		}
	}
	views := make([]agentView, len(order))
	for i, a := range order {
		a.view.Text = a.text.String()
		views[i] = a.view
	}
	return views
}

// eventString is m[k] if it is a string, else "".
func eventString(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

// cutUTF8 is s cut to at most n bytes, not within a character.
func cutUTF8(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
