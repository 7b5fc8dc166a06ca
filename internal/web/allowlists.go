package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// grantRow is one connection's grant as the form edits it: one glob per
// line for ops and events, "<field>: <pattern>, <pattern>" lines for
// setup, "<secret> = <op>.<field>" lines for secrets.
type grantRow struct {
	Index   int
	Conn    string
	Ops     string
	Events  string
	Setup   string
	Secrets string
	// Errors holds the messages for each field of the row ("conn", "ops",
	// "events", "setup", "secrets"), as gates.ParseAllowlist words them.
	Errors map[string][]string
}

func (r grantRow) errs(field string) []string { return r.Errors[field] }

func (r grantRow) empty() bool {
	return strings.TrimSpace(r.Conn+r.Ops+r.Events+r.Setup+r.Secrets) == ""
}

type allowlistForm struct {
	Name       string
	IsNew      bool
	Rows       []grantRow
	NameErrors []string
	FormErrors []string
	History    []historyEntry
}

type historyEntry struct {
	gates.Change
	Summary []string
}

func rowsOf(al *gates.Allowlist) []grantRow {
	var rows []grantRow
	for _, conn := range slices.Sorted(maps.Keys(al.Connections)) {
		g := al.Connections[conn]
		var setup, secrets []string
		for _, f := range slices.Sorted(maps.Keys(g.Setup)) {
			setup = append(setup, f+": "+strings.Join(g.Setup[f], ", "))
		}
		for _, s := range slices.Sorted(maps.Keys(g.Secrets)) {
			secrets = append(secrets, s+" = "+g.Secrets[s])
		}
		rows = append(rows, grantRow{Index: len(rows), Conn: conn, Ops: strings.Join(g.Ops, "\n"), Events: strings.Join(g.Events, "\n"),
			Setup: strings.Join(setup, "\n"), Secrets: strings.Join(secrets, "\n")})
	}
	return withBlankRow(rows)
}

// withBlankRow adds an empty grant so a connection can be added without
// JavaScript.
func withBlankRow(rows []grantRow) []grantRow {
	return append(rows, grantRow{Index: len(rows)})
}

func lines(s string) []string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// formRows reads the grant rows a form posted.
func formRows(c echo.Context) []grantRow {
	f, _ := c.FormParams()
	at := func(key string, i int) string {
		if v := f[key]; i < len(v) {
			return strings.ReplaceAll(v[i], "\r\n", "\n")
		}
		return ""
	}
	var rows []grantRow
	for i := range len(f["conn"]) {
		r := grantRow{Conn: strings.TrimSpace(at("conn", i)), Ops: at("ops", i), Events: at("events", i), Setup: at("setup", i), Secrets: at("secrets", i)}
		if r.empty() {
			continue
		}
		r.Index = len(rows)
		rows = append(rows, r)
	}
	return rows
}

// parseForm turns the rows into the allowlist body the API takes and
// validates it with gates.ParseAllowlist, so the messages are the API's.
// Problems the form itself can have (a line without ':' in setup, a
// connection named twice) are reported on their fields too.
func parseForm(name string, rows []grantRow) (*gates.Allowlist, *allowlistForm) {
	form := &allowlistForm{Name: name, Rows: rows}
	grants := map[string]gates.Grant{}
	rowOf := map[string]int{}
	uiErr := false
	for i := range rows {
		r := &rows[i]
		r.Errors = map[string][]string{}
		g := gates.Grant{Ops: lines(r.Ops), Events: lines(r.Events)}
		for _, l := range lines(r.Setup) {
			field, pats, ok := strings.Cut(l, ":")
			if !ok || strings.TrimSpace(field) == "" {
				r.Errors["setup"] = append(r.Errors["setup"], fmt.Sprintf("%q: each line is \"<field>: <pattern>, <pattern>\"", l))
				uiErr = true
				continue
			}
			if g.Setup == nil {
				g.Setup = map[string][]string{}
			}
			for p := range strings.SplitSeq(pats, ",") {
				g.Setup[strings.TrimSpace(field)] = append(g.Setup[strings.TrimSpace(field)], strings.TrimSpace(p))
			}
		}
		for _, l := range lines(r.Secrets) {
			secret, binding, _ := strings.Cut(l, "=")
			if g.Secrets == nil {
				g.Secrets = map[string]string{}
			}
			g.Secrets[strings.TrimSpace(secret)] = strings.TrimSpace(binding)
		}
		if _, dup := rowOf[r.Conn]; dup {
			r.Errors["conn"] = append(r.Errors["conn"], fmt.Sprintf("connection %q is granted twice; merge the two", r.Conn))
			uiErr = true
			continue
		}
		rowOf[r.Conn] = i
		grants[r.Conn] = g
	}
	raw, _ := json.Marshal(map[string]any{"connections": grants})
	al, err := gates.ParseAllowlist(name, raw)
	var ve *fault.ValidationError
	if errors.As(err, &ve) {
		for _, p := range ve.Problems {
			placeError(form, rows, rowOf, p)
		}
	} else if err != nil {
		form.FormErrors = append(form.FormErrors, err.Error())
	}
	if err != nil || uiErr {
		form.Rows = withBlankRow(rows)
		return nil, form
	}
	return al, nil
}

// placeError shows a FieldError next to the field its JSON Pointer names.
func placeError(form *allowlistForm, rows []grantRow, rowOf map[string]int, p fault.FieldError) {
	if p.Path == "name" {
		form.NameErrors = append(form.NameErrors, p.Message)
		return
	}
	parts := strings.Split(p.Path, "/")
	if len(parts) < 3 || parts[1] != "connections" {
		form.FormErrors = append(form.FormErrors, p.Message)
		return
	}
	conn := strings.NewReplacer("~1", "/", "~0", "~").Replace(parts[2])
	i, ok := rowOf[conn]
	if !ok {
		form.FormErrors = append(form.FormErrors, p.Message)
		return
	}
	field := "conn"
	if len(parts) > 3 {
		field = parts[3]
	}
	rows[i].Errors[field] = append(rows[i].Errors[field], p.Message)
}

func allowlistNotFound(name string) error {
	return &notFound{"No allowlist is named " + name + "."}
}

func (h *handler) allowlists(c echo.Context) error {
	items, err := h.Allowlists.List(bg(c))
	if err != nil {
		return err
	}
	return h.render(c, http.StatusOK, allowlistsPage(h.page(c, "Allowlists", "allowlists"), items))
}

func (h *handler) newAllowlist(c echo.Context) error {
	return h.render(c, http.StatusOK, allowlistPage(h.page(c, "New allowlist", "allowlists"), allowlistForm{IsNew: true, Rows: withBlankRow(nil)}))
}

func (h *handler) createAllowlist(c echo.Context) error {
	name := strings.TrimSpace(c.FormValue("name"))
	al, form := parseForm(name, formRows(c))
	if form == nil {
		if _, err := h.Allowlists.Get(bg(c), name); err == nil {
			form = &allowlistForm{Name: name, Rows: withBlankRow(formRows(c)), NameErrors: []string{"an allowlist with this name exists; edit it instead"}}
		} else if !errors.Is(err, gates.ErrAllowlistNotFound) {
			return err
		}
	}
	if form != nil {
		form.IsNew = true
		return h.render(c, http.StatusUnprocessableEntity, allowlistPage(h.page(c, "New allowlist", "allowlists"), *form))
	}
	if _, err := h.Allowlists.Put(bg(c), al, by(c)); err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, "/admin/allowlists/"+url.PathEscape(name)+"?flash=created")
}

func (h *handler) editAllowlist(c echo.Context) error {
	name := c.Param("name")
	al, err := h.Allowlists.Get(bg(c), name)
	if errors.Is(err, gates.ErrAllowlistNotFound) {
		return allowlistNotFound(name)
	}
	if err != nil {
		return err
	}
	form := allowlistForm{Name: name, Rows: rowsOf(al)}
	if form.History, err = h.history(c, name); err != nil {
		return err
	}
	return h.render(c, http.StatusOK, allowlistPage(h.page(c, "Allowlist "+name, "allowlists"), form))
}

func (h *handler) saveAllowlist(c echo.Context) error {
	name := c.Param("name")
	al, form := parseForm(name, formRows(c))
	if form != nil {
		var err error
		if form.History, err = h.history(c, name); err != nil {
			return err
		}
		return h.render(c, http.StatusUnprocessableEntity, allowlistPage(h.page(c, "Allowlist "+name, "allowlists"), *form))
	}
	if _, err := h.Allowlists.Put(bg(c), al, by(c)); err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, "/admin/allowlists/"+url.PathEscape(name)+"?flash=saved")
}

func (h *handler) confirmDeleteAllowlist(c echo.Context) error {
	name := c.Param("name")
	if _, err := h.Allowlists.Get(bg(c), name); errors.Is(err, gates.ErrAllowlistNotFound) {
		return allowlistNotFound(name)
	} else if err != nil {
		return err
	}
	return h.render(c, http.StatusOK, confirmDeletePage(h.page(c, "Delete allowlist "+name, "allowlists"), name))
}

func (h *handler) deleteAllowlist(c echo.Context) error {
	err := h.Allowlists.Delete(bg(c), c.Param("name"), by(c))
	if errors.Is(err, gates.ErrAllowlistNotFound) {
		return c.Redirect(http.StatusSeeOther, "/admin/allowlists?flash=gone")
	}
	if err != nil {
		return err
	}
	return c.Redirect(http.StatusSeeOther, "/admin/allowlists?flash=deleted")
}

// history returns the allowlist's changes, each with a summary of what it
// changed against the one before.
func (h *handler) history(c echo.Context, name string) ([]historyEntry, error) {
	changes, err := h.Allowlists.History(bg(c), name)
	if err != nil {
		return nil, err
	}
	out := make([]historyEntry, len(changes))
	for i, ch := range changes {
		var before *gates.Allowlist
		if i+1 < len(changes) {
			before = changes[i+1].After
		}
		out[i] = historyEntry{Change: ch, Summary: summarize(before, ch.After)}
	}
	return out, nil
}

func summarize(before, after *gates.Allowlist) []string {
	grants := func(al *gates.Allowlist) map[string]gates.Grant {
		if al == nil {
			return nil
		}
		return al.Connections
	}
	b, a := grants(before), grants(after)
	var out []string
	for _, conn := range slices.Sorted(maps.Keys(a)) {
		old, had := b[conn]
		switch {
		case !had:
			out = append(out, "granted "+conn+" (ops: "+strings.Join(a[conn].Ops, ", ")+")")
		case !reflect.DeepEqual(old, a[conn]):
			out = append(out, "changed "+conn+" (ops: "+strings.Join(a[conn].Ops, ", ")+")")
		}
	}
	for _, conn := range slices.Sorted(maps.Keys(b)) {
		if _, still := a[conn]; !still && after != nil {
			out = append(out, "removed "+conn)
		}
	}
	return out
}
