package web

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

var execStates = []harness.ExecState{harness.ExecQueued, harness.ExecRunning, harness.ExecWaiting, harness.ExecSucceeded, harness.ExecFailed, harness.ExecCancelled}

type stateCount struct {
	State harness.ExecState
	Count string
}

type overviewData struct {
	Connections []registry.Status
	Executions  []stateCount
	Pending     int
	Triggers    *triggers.Status
}

func (h *handler) overview(c echo.Context) error {
	ctx := bg(c)
	d := overviewData{}
	for _, conn := range h.Registry.List() {
		d.Connections = append(d.Connections, conn.Status())
	}
	who := h.principal(c)
	owner := ""
	if !who.SeesAll() {
		owner = who.Name
	}
	for _, s := range execStates {
		// One page of up to 100 per state: "100+" says there are more.
		pg, err := h.Executions.List(ctx, harness.ListOptions{Status: s, Limit: 100, Principal: owner})
		if err != nil {
			return err
		}
		n := itoa(int64(len(pg.Items)))
		if pg.Next != "" {
			n += "+"
		}
		d.Executions = append(d.Executions, stateCount{State: s, Count: n})
	}
	pending, err := h.pending(c)
	if err != nil {
		return err
	}
	d.Pending = len(pending)
	if h.Triggers != nil && who.SeesAll() {
		st, err := h.Triggers.Status(ctx)
		if err != nil {
			return err
		}
		d.Triggers = st
	}
	return h.render(c, http.StatusOK, overviewPage(h.page(c, "Overview", "overview"), d))
}

type connectionData struct {
	Status     registry.Status
	Operations []connect.Operation
	Policy     registry.Policy
	Deliveries []triggers.Receipt
	HasSource  bool
	// Events are the event types an MCP server offers; Subscriptions
	// patchbay's subscriptions to them.
	Events        []connect.EventType
	Subscriptions []triggers.SubscriptionStatus
	SignIn        *signInPanel
	Profiles      []registry.SpokenProfile
}

func (h *handler) connection(c echo.Context) error {
	conn, err := h.Registry.Get(c.Param("name"))
	if err != nil {
		return &notFound{"No connection is named " + c.Param("name") + "."}
	}
	st := conn.Status()
	st.Pool = h.Executions.PoolStatusFor(bg(c), st.Pool, h.principal(c))
	d := connectionData{Status: st, Operations: conn.Manifest().Operations, Policy: conn.Policy(), SignIn: h.signInPanel(c, conn),
		Profiles: conn.Profiles()}
	d.Events = conn.EventTypes()
	if h.Triggers != nil && h.Triggers.HasSource(conn.Name()) {
		d.HasSource = true
		if d.Deliveries, err = h.Triggers.Deliveries(bg(c), conn.Name(), 50); err != nil {
			return err
		}
		if d.Subscriptions, err = h.Triggers.Subscriptions(bg(c), conn.Name()); err != nil {
			return err
		}
	}
	return h.render(c, http.StatusOK, connectionPage(h.page(c, "Connection "+conn.Name(), "overview"), d))
}
