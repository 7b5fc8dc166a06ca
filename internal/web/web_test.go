package web_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/web"
)

const adminToken = "test-admin-token"

// guardedDoc runs one call that the memory connection's policy sends to
// the approver.
const guardedDoc = `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"main","steps":[
 {"kind":"call","id":"ship","connection":"mem","op":"guarded","args":{"target":"prod","ticket":42}}]}}`

type bundle struct {
	url    string
	execs  *harness.Executions
	als    *gates.Allowlists
	routes []*echo.Route // every route the UI has
}

// setup mounts the UI; users are API keys that may sign in as themselves.
func setup(t testing.TB, users ...web.User) *bundle {
	t.Helper()
	return setupWith(t, nil, users...)
}

// setupWith is setup with edit applied to the UI's options.
func setupWith(t testing.TB, edit func(*web.Options), users ...web.User) *bundle {
	t.Helper()
	return setupConns(t, edit, nil, users...)
}

// setupConns is setupWith with add registering more connections beside
// mem before the registry starts.
func setupConns(t testing.TB, edit func(*web.Options), add func(*registry.Registry), users ...web.User) *bundle {
	t.Helper()
	mem := connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "echo", Description: "answers with its arguments",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`),
			Annotations: connect.Annotations{ReadOnlyHint: ptr(true)}}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "guarded", Annotations: connect.Annotations{DestructiveHint: ptr(true)}}},
	)
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("mem", mem))
	must(t, reg.SetPolicy("mem", registry.Policy{Approve: []string{"guard*"}}))
	if add != nil {
		add(reg)
	}
	must(t, reg.Start(context.Background()))
	st := storetest.New(t)
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("ops", []byte(`{"connections":{"mem":{"ops":["*"]}}}`))
	must(t, err)
	_, err = als.Put(context.Background(), al, "setup")
	must(t, err)
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: als})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 2); close(done) }()
	e := echo.New()
	o := web.Options{AdminToken: adminToken, Store: st, Executions: execs, Registry: reg, Allowlists: als, PollInterval: 100 * time.Millisecond, Users: users}
	if edit != nil {
		edit(&o)
	}
	must(t, web.Mount(e, o))
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close(); cancel(); <-done; _ = reg.Close() })
	return &bundle{url: srv.URL, execs: execs, als: als, routes: e.Routes()}
}

func ptr[T any](v T) *T { return &v }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// client is a browser-like HTTP client: a cookie jar, no automatic
// redirects, so tests see each 303.
type client struct {
	t    testing.TB
	base string
	http *http.Client
	csrf string
}

func newClient(t testing.TB, base string) *client {
	jar, _ := cookiejar.New(nil)
	return &client{t: t, base: base, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	status int
	header http.Header
	doc    *goquery.Document
}

func (c *client) do(method, path string, form url.Values, headers ...string) page {
	c.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.base+path, body)
	must(c.t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.http.Do(req)
	must(c.t, err)
	defer resp.Body.Close()
	doc, err := goquery.NewDocumentFromReader(resp.Body)
	must(c.t, err)
	if v, ok := doc.Find(`input[name="_csrf"]`).First().Attr("value"); ok && resp.StatusCode < 400 {
		c.csrf = v
	}
	return page{status: resp.StatusCode, header: resp.Header, doc: doc}
}

func (c *client) get(path string) page { return c.do(http.MethodGet, path, nil) }

// post sends a form with the session's CSRF token.
func (c *client) post(path string, form url.Values) page {
	if form == nil {
		form = url.Values{}
	}
	form.Set("_csrf", c.csrf)
	return c.do(http.MethodPost, path, form)
}

func signIn(t testing.TB, b *bundle) *client {
	t.Helper()
	c := newClient(t, b.url)
	c.get("/admin/sign-in")
	p := c.do(http.MethodPost, "/admin/sign-in", url.Values{"_csrf": {c.csrf}, "token": {adminToken}, "next": {"/admin"}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/admin" {
		t.Fatalf("sign-in: %d %s", p.status, p.header.Get("Location"))
	}
	if p := c.get("/admin"); p.status != http.StatusOK {
		t.Fatalf("overview after sign-in: %d", p.status)
	}
	return c
}

func text(s *goquery.Selection) string { return strings.Join(strings.Fields(s.Text()), " ") }

func TestSignIn(t *testing.T) {
	t.Parallel()
	b := setup(t)

	t.Run("pages need a session", func(t *testing.T) {
		c := newClient(t, b.url)
		p := c.get("/admin/approvals?state=denied")
		if p.status != http.StatusSeeOther || p.header.Get("Location") != "/admin/sign-in?next="+url.QueryEscape("/admin/approvals?state=denied") {
			t.Fatalf("got %d %q", p.status, p.header.Get("Location"))
		}
	})
	t.Run("wrong token", func(t *testing.T) {
		c := newClient(t, b.url)
		c.get("/admin/sign-in")
		p := c.do(http.MethodPost, "/admin/sign-in", url.Values{"_csrf": {c.csrf}, "token": {"nope"}})
		if p.status != http.StatusUnauthorized {
			t.Fatalf("status %d", p.status)
		}
		if got := text(p.doc.Find("#signin-error")); got != "That admin token is not valid." {
			t.Fatalf("error %q", got)
		}
		if _, ok := p.doc.Find("#token").Attr("aria-invalid"); !ok {
			t.Fatal("token field not marked invalid")
		}
	})
	t.Run("sign-in form without its token is refused", func(t *testing.T) {
		c := newClient(t, b.url)
		p := c.do(http.MethodPost, "/admin/sign-in", url.Values{"token": {adminToken}})
		if p.status != http.StatusForbidden {
			t.Fatalf("status %d", p.status)
		}
	})
	t.Run("cookie", func(t *testing.T) {
		c := newClient(t, b.url)
		c.get("/admin/sign-in")
		req, _ := http.NewRequest(http.MethodPost, b.url+"/admin/sign-in", strings.NewReader(url.Values{"_csrf": {c.csrf}, "token": {adminToken}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Forwarded-Proto", "https")
		resp, err := c.http.Do(req)
		must(t, err)
		resp.Body.Close()
		var found bool
		for _, ck := range resp.Cookies() {
			if ck.Name != "pb_admin" {
				continue
			}
			found = true
			if !ck.HttpOnly || !ck.Secure || ck.SameSite != http.SameSiteLaxMode || ck.Path != "/" || ck.MaxAge != 12*3600 {
				t.Fatalf("cookie %+v", ck)
			}
			if strings.Contains(ck.Value, adminToken) {
				t.Fatal("the cookie carries the admin token")
			}
		}
		if !found {
			t.Fatal("no session cookie")
		}
	})
	t.Run("overview and sign-out", func(t *testing.T) {
		c := signIn(t, b)
		p := c.get("/admin")
		row := p.doc.Find(`#connections tr[data-connection="mem"]`)
		if row.Length() != 1 || text(row.Find(".badge")) != "ready" {
			t.Fatalf("connection row: %q", text(row))
		}
		if got := text(row.Find("td").Eq(4)); got != "2" {
			t.Fatalf("tool count %q", got)
		}
		if p.doc.Find("h1").Length() != 1 || p.doc.Find(`nav a[aria-current="page"]`).Text() != "Overview" {
			t.Fatal("heading or current nav missing")
		}
		if strings.Contains(p.doc.Text(), adminToken) {
			t.Fatal("the page shows the admin token")
		}
		if p := c.post("/admin/sign-out", nil); p.status != http.StatusSeeOther {
			t.Fatalf("sign-out: %d", p.status)
		}
		if p := c.get("/admin"); p.status != http.StatusSeeOther {
			t.Fatalf("after sign-out: %d", p.status)
		}
	})
}

func TestCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := signIn(t, b)
	form := url.Values{"conn": {"mem"}, "ops": {"*"}, "events": {""}, "setup": {""}, "secrets": {""}}
	for name, p := range map[string]page{
		"none":  c.do(http.MethodPost, "/admin/allowlists/ops/delete", url.Values{}),
		"wrong": c.do(http.MethodPost, "/admin/allowlists/ops", url.Values{"_csrf": {strings.Repeat("0", 64)}, "conn": form["conn"], "ops": form["ops"]}),
		"cross-site": c.do(http.MethodPost, "/admin/allowlists/ops/delete", url.Values{"_csrf": {c.csrf}},
			"Sec-Fetch-Site", "cross-site"),
		"no session": newClient(t, b.url).do(http.MethodPost, "/admin/approvals/ap_x/approve", url.Values{"_csrf": {c.csrf}}),
	} {
		if p.status != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", name, p.status)
		}
	}
	if _, err := b.als.Get(context.Background(), "ops"); err != nil {
		t.Fatalf("a refused POST changed the allowlist: %v", err)
	}
	// The htmx header carries the token as well as the form field does.
	p := c.do(http.MethodPost, "/admin/allowlists/ops", form, "X-CSRF-Token", c.csrf)
	if p.status != http.StatusSeeOther {
		t.Fatalf("with the header: %d", p.status)
	}
}

func TestAllowlistEdit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := signIn(t, b)

	p := c.get("/admin/allowlists")
	if p.doc.Find(`#allowlists tr[data-allowlist="ops"]`).Length() != 1 {
		t.Fatal("allowlist ops not listed")
	}
	p = c.get("/admin/allowlists/ops")
	if v, _ := p.doc.Find("#conn-0").Attr("value"); v != "mem" || text(p.doc.Find("#ops-0")) != "*" {
		t.Fatalf("form not filled: conn %q ops %q", v, text(p.doc.Find("#ops-0")))
	}

	bad := url.Values{"conn": {"mem", "ghost host"}, "ops": {"echo\nui.[", "x"}, "events": {"", ""}, "setup": {"", ""}, "secrets": {"pw = nodot", ""}}
	p = c.post("/admin/allowlists/ops", bad)
	if p.status != http.StatusUnprocessableEntity {
		t.Fatalf("status %d", p.status)
	}
	// The messages are the API's: those of gates.ParseAllowlist on the
	// same body.
	_, err := gates.ParseAllowlist("ops", []byte(`{"connections":{"mem":{"ops":["echo","ui.["],"secrets":{"pw":"nodot"}},"ghost host":{"ops":["x"]}}}`))
	want := map[string]string{}
	for _, fe := range err.(*fault.ValidationError).Problems {
		want[fe.Path] = fe.Message
	}
	for sel, path := range map[string]string{
		"#ops-0-err":     "/connections/mem/ops/1",
		"#secrets-0-err": "/connections/mem/secrets/pw",
		"#conn-1-err":    "/connections/ghost host",
	} {
		if got := text(p.doc.Find(sel + " .field-error")); got != want[path] || got == "" {
			t.Errorf("%s: %q, want %q", sel, got, want[path])
		}
	}
	if v, _ := p.doc.Find("#ops-0").Attr("aria-invalid"); v != "true" {
		t.Error("ops field not marked invalid")
	}
	if d, _ := p.doc.Find("#ops-0").Attr("aria-describedby"); d != "ops-0-err" {
		t.Errorf("ops field described by %q", d)
	}
	if text(p.doc.Find("#ops-0")) != "echo ui.[" {
		t.Errorf("the typed value was lost: %q", text(p.doc.Find("#ops-0")))
	}

	good := url.Values{"conn": {"mem", ""}, "ops": {"echo\nguard*", ""}, "events": {"", ""}, "setup": {"", ""}, "secrets": {"", ""}}
	p = c.post("/admin/allowlists/ops", good)
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/admin/allowlists/ops?flash=saved" {
		t.Fatalf("save: %d %s", p.status, p.header.Get("Location"))
	}
	al, err := b.als.Get(context.Background(), "ops")
	must(t, err)
	if got := al.Connections["mem"].Ops; len(got) != 2 || got[1] != "guard*" || al.UpdatedBy != "admin" {
		t.Fatalf("stored %+v by %s", al.Connections, al.UpdatedBy)
	}
	p = c.get("/admin/allowlists/ops?flash=saved")
	if text(p.doc.Find(".flash")) != "Allowlist saved." {
		t.Error("no flash")
	}
	first := p.doc.Find("#history tbody tr").First()
	if text(first.Find("td").Eq(1)) != "admin" || text(first.Find("td").Eq(2)) != "updated" || !strings.Contains(text(first.Find("td").Eq(3)), "changed mem (ops: echo, guard*)") {
		t.Errorf("history row %q", text(first))
	}

	t.Run("create and delete", func(t *testing.T) {
		p := c.post("/admin/allowlists", url.Values{"name": {"9bad"}, "conn": {""}, "ops": {""}, "events": {""}, "setup": {""}, "secrets": {""}})
		if p.status != http.StatusUnprocessableEntity || text(p.doc.Find("#name-err .field-error")) == "" {
			t.Fatalf("bad name: %d %q", p.status, text(p.doc.Find("#name-err")))
		}
		p = c.post("/admin/allowlists", url.Values{"name": {"readers"}, "conn": {"mem"}, "ops": {"echo"}, "events": {""}, "setup": {""}, "secrets": {""}})
		if p.status != http.StatusSeeOther {
			t.Fatalf("create: %d", p.status)
		}
		p = c.get("/admin/allowlists/readers/delete")
		if p.doc.Find(`form[action="/admin/allowlists/readers/delete"] button`).Length() != 1 {
			t.Fatal("no confirmation form")
		}
		if p := c.post("/admin/allowlists/readers/delete", nil); p.status != http.StatusSeeOther {
			t.Fatalf("delete: %d", p.status)
		}
		if _, err := b.als.Get(context.Background(), "readers"); err == nil {
			t.Fatal("not deleted")
		}
	})
}

func waitPending(t testing.TB, b *bundle) *gates.Approval {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		aps, err := b.execs.Approvals().List(context.Background(), gates.ApprovalPending, 10)
		must(t, err)
		if len(aps) > 0 {
			return aps[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no approval was requested")
	return nil
}

func TestApproveFlow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := signIn(t, b)
	ex, err := b.execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(guardedDoc), Principal: "ci-bot", Allowlist: "ops"})
	must(t, err)
	ap := waitPending(t, b)

	p := c.get("/admin/approvals")
	card := p.doc.Find(`#pending article[data-approval="` + ap.ID + `"]`)
	if card.Length() != 1 {
		t.Fatalf("pending card missing: %s", text(p.doc.Find("#pending")))
	}
	if text(card.Find("h3")) != "mem.guarded" || !strings.Contains(text(card.Find("dl")), ex.ID) || !strings.Contains(text(card.Find("dl")), "main") && !strings.Contains(text(card.Find("dl")), "ship") {
		t.Fatalf("card: %q", text(card))
	}
	if !strings.Contains(card.Find("pre").Text(), `"target": "prod"`) {
		t.Fatalf("arguments: %q", card.Find("pre").Text())
	}
	if _, ok := p.doc.Find("[sse-connect]").Attr("sse-connect"); !ok {
		t.Fatal("the pending list is not live")
	}

	p = c.get("/admin/executions/" + ex.ID)
	if v, _ := p.doc.Find("#execution-body").Attr("data-status"); v != "waiting" {
		t.Fatalf("execution page status %q", v)
	}
	if p.doc.Find(`#execution-body article[data-approval="`+ap.ID+`"]`).Length() != 1 {
		t.Fatal("the execution page does not offer its approval")
	}

	p = c.post("/admin/approvals/"+ap.ID+"/approve", url.Values{"note": {"looks right"}})
	if p.status != http.StatusSeeOther || p.header.Get("Location") != "/admin/approvals?flash=approved" {
		t.Fatalf("approve: %d %s", p.status, p.header.Get("Location"))
	}
	done, err := b.execs.Wait(context.Background(), ex.ID, 10*time.Second)
	must(t, err)
	if done.Status != harness.ExecSucceeded {
		t.Fatalf("execution %s", done.Status)
	}
	p = c.get("/admin/executions/" + ex.ID)
	if v, _ := p.doc.Find("#execution-body").Attr("data-status"); v != "succeeded" {
		t.Fatalf("status %q", v)
	}
	if st, _ := p.doc.Find(`#ledger li[data-step="ship"]`).Attr("data-status"); st != "done" {
		t.Fatalf("ledger step ship: %q", st)
	}
	if p.doc.Find("[sse-connect]").Length() != 0 {
		t.Error("a finished execution still streams")
	}
	p = c.get("/admin/approvals?state=approved")
	row := p.doc.Find(`#approval-history tr[data-approval="` + ap.ID + `"]`)
	if !strings.Contains(text(row), "admin") || !strings.Contains(text(row), "looks right") {
		t.Fatalf("history row %q", text(row))
	}
	// Deciding again the other way is refused, with a message.
	p = c.post("/admin/approvals/"+ap.ID+"/deny", nil)
	if p.header.Get("Location") != "/admin/approvals?flash=decided" {
		t.Fatalf("second decision: %s", p.header.Get("Location"))
	}
}

func TestCancelAndPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := signIn(t, b)
	ex, err := b.execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(guardedDoc), Principal: "ci-bot", Allowlist: "ops"})
	must(t, err)
	waitPending(t, b)
	p := c.post("/admin/executions/"+ex.ID+"/cancel", nil)
	if p.status != http.StatusSeeOther {
		t.Fatalf("cancel: %d", p.status)
	}
	done, err := b.execs.Wait(context.Background(), ex.ID, 10*time.Second)
	must(t, err)
	if done.Status != harness.ExecCancelled {
		t.Fatalf("status %s", done.Status)
	}
	p = c.get("/admin/executions?status=cancelled")
	if p.doc.Find(`#executions tr[data-execution="`+ex.ID+`"]`).Length() != 1 {
		t.Fatal("cancelled execution not listed under its filter")
	}
	p = c.get("/admin/executions?status=succeeded")
	if p.doc.Find(`#executions tr[data-execution="`+ex.ID+`"]`).Length() != 0 {
		t.Fatal("filter ignored")
	}
	p = c.get("/admin/connections/mem")
	if text(p.doc.Find(`#operations tr[data-op="echo"] .badge`)) != "read-only" {
		t.Errorf("echo hints: %q", text(p.doc.Find(`#operations tr[data-op="echo"]`)))
	}
	if !strings.Contains(p.doc.Find(`#operations tr[data-op="echo"] pre`).Text(), `"text"`) {
		t.Error("argument schema not shown")
	}
	for path, want := range map[string]int{"/admin/connections/nope": 404, "/admin/executions/ex_nope": 404, "/admin/allowlists/nope": 404, "/admin/deadletters": 200} {
		if p := c.get(path); p.status != want || p.doc.Find("h1").Length() != 1 {
			t.Errorf("%s: %d", path, p.status)
		}
	}
}

func TestStaticAssets(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, path := range []string{"/admin/static/admin.css", "/admin/static/htmx.min.js", "/admin/static/htmx-ext-sse.min.js"} {
		resp, err := http.Get(b.url + path)
		must(t, err)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d", path, resp.StatusCode)
		}
	}
}
