package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/oauth"
	"github.com/patchbay-dev/patchbay/internal/web"
)

const echoDoc = `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"say","connection":"mem","op":"echo","args":{"text":"hi"}}}`

// TestAdminAuthorizationMatrix drives every admin UI route as every kind of
// session and checks the status, from one table; a route the UI has that
// the table does not cover fails the test. The columns: no session, alice
// (run, who started the executions), bob (another run key), an auditor
// (read), an approver (approve) and the operator (admin token).
func TestAdminAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	// With a sign-in service, so the OAuth routes are mounted and covered;
	// "shared" is signed in to by operators for everyone.
	signIns := &fakeSignIns{states: map[string][3]string{}, accounts: map[string]oauth.Account{}}
	b := setupConns(t, func(o *web.Options) { o.SignIns = signIns }, func(reg *registry.Registry) {
		must(t, reg.Add("shared", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "x"}})))
		must(t, reg.SetAccess("shared", registry.Access{SignIn: registry.SignInShared}))
	}, roleUsers()...)
	ctx := context.Background()
	var n atomic.Int64
	submit := func(t *testing.T, doc string) string {
		ex, err := b.execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Principal: "alice", Allowlist: "ops"})
		must(t, err)
		return ex.ID
	}
	waiting := func(t *testing.T) (exec, approval string) {
		exec = submit(t, guardedDoc)
		return exec, waitApprovalOf(t, b, exec)
	}
	done := submit(t, echoDoc)
	if _, err := b.execs.Wait(ctx, done, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	shared, sharedAp := waiting(t)
	sessions := []func(t *testing.T) *client{
		func(t *testing.T) *client { return newClient(t, b.url) },
		func(t *testing.T) *client { return signInWith(t, b, "alice-key") },
		func(t *testing.T) *client { return signInWith(t, b, "bob-key") },
		func(t *testing.T) *client { return signInWith(t, b, "auditor-key") },
		func(t *testing.T) *client { return signInWith(t, b, "approver-key") },
		func(t *testing.T) *client { return signInWith(t, b, adminToken) },
	}
	const (
		see = http.StatusSeeOther
		no  = http.StatusForbidden
		nf  = http.StatusNotFound
		ok  = http.StatusOK
		bad = http.StatusBadRequest
	)
	rows := []struct {
		method, route, path string
		fresh               bool // a fresh execution/approval/allowlist per cell
		want                [6]int
	}{
		{"GET", "/admin/static/*", "/admin/static/admin.css", false, [6]int{ok, ok, ok, ok, ok, ok}},
		{"GET", "/admin/sign-in", "/admin/sign-in", false, [6]int{ok, see, see, see, see, see}},
		{"POST", "/admin/sign-in", "/admin/sign-in", false, [6]int{no, no, no, no, no, no}}, // no sign-in form token
		{"GET", "/admin", "/admin", false, [6]int{see, ok, ok, ok, ok, ok}},
		{"GET", "/admin/", "/admin/", false, [6]int{see, ok, ok, ok, ok, ok}},
		{"POST", "/admin/sign-out", "/admin/sign-out", true, [6]int{no, see, see, see, see, see}},
		{"GET", "/admin/connections/:name", "/admin/connections/mem", false, [6]int{see, ok, ok, ok, ok, ok}},
		// A shared OAuth connection is signed in to and out of by the
		// operator only; a callback without a state this session started
		// is refused (400) whoever brings it.
		{"GET", "/oauth/client-metadata.json", "/oauth/client-metadata.json", false, [6]int{ok, ok, ok, ok, ok, ok}}, // public
		{"GET", "/oauth/:name/start", "/oauth/shared/start", false, [6]int{see, no, no, no, no, see}},
		{"GET", "/oauth/callback", "/oauth/callback?state=forged", false, [6]int{see, bad, bad, bad, bad, bad}},
		{"POST", "/admin/connections/:name/disconnect", "/admin/connections/shared/disconnect", false, [6]int{no, no, no, no, no, see}},
		{"GET", "/admin/allowlists", "/admin/allowlists", false, [6]int{see, no, no, ok, no, ok}},
		{"GET", "/admin/allowlists/new", "/admin/allowlists/new", false, [6]int{see, no, no, no, no, ok}},
		{"POST", "/admin/allowlists", "/admin/allowlists?name={new}", true, [6]int{no, no, no, no, no, see}},
		{"GET", "/admin/allowlists/:name", "/admin/allowlists/ops", false, [6]int{see, no, no, ok, no, ok}},
		{"POST", "/admin/allowlists/:name", "/admin/allowlists/{scratch}", true, [6]int{no, no, no, no, no, see}},
		{"GET", "/admin/allowlists/:name/delete", "/admin/allowlists/ops/delete", false, [6]int{see, no, no, no, no, ok}},
		{"POST", "/admin/allowlists/:name/delete", "/admin/allowlists/{scratch}/delete", true, [6]int{no, no, no, no, no, see}},
		{"GET", "/admin/approvals", "/admin/approvals", false, [6]int{see, ok, ok, ok, ok, ok}},
		{"GET", "/admin/approvals/pending", "/admin/approvals/pending", false, [6]int{see, ok, ok, ok, ok, ok}},
		{"GET", "/admin/approvals/stream", "/admin/approvals/stream", false, [6]int{see, ok, ok, ok, ok, ok}},
		// Deciding: alice asked (sent back with flash=self), bob may not see
		// it (flash=gone, as for a missing one), the auditor may see it but
		// not decide (403).
		{"POST", "/admin/approvals/:id/approve", "/admin/approvals/{approval}/approve", true, [6]int{no, see, see, no, see, see}},
		{"POST", "/admin/approvals/:id/deny", "/admin/approvals/{approval}/deny", true, [6]int{no, see, see, no, see, see}},
		// Questions: who may answer one is TestQuestionsAuthorization's; one
		// that does not exist is gone for every signed-in session.
		{"GET", "/admin/questions", "/admin/questions", false, [6]int{see, ok, ok, ok, ok, ok}},
		{"GET", "/admin/questions/pending", "/admin/questions/pending", false, [6]int{see, ok, ok, ok, ok, ok}},
		{"GET", "/admin/questions/stream", "/admin/questions/stream", false, [6]int{see, ok, ok, ok, ok, ok}},
		{"POST", "/admin/questions/:id/answer", "/admin/questions/qs_nope/answer", false, [6]int{no, see, see, see, see, see}},
		{"POST", "/admin/questions/:id/decline", "/admin/questions/qs_nope/decline", false, [6]int{no, see, see, see, see, see}},
		{"POST", "/admin/questions/:id/cancel", "/admin/questions/qs_nope/cancel", false, [6]int{no, see, see, see, see, see}},
		{"GET", "/admin/executions", "/admin/executions", false, [6]int{see, ok, ok, ok, ok, ok}},
		{"GET", "/admin/executions/:id", "/admin/executions/{exec}", false, [6]int{see, ok, nf, ok, nf, ok}},
		{"GET", "/admin/executions/:id/body", "/admin/executions/{exec}/body", false, [6]int{see, ok, nf, ok, nf, ok}},
		{"GET", "/admin/executions/:id/stream", "/admin/executions/{done}/stream", false, [6]int{see, ok, nf, ok, nf, ok}},
		{"POST", "/admin/executions/:id/cancel", "/admin/executions/{exec}/cancel", true, [6]int{no, see, nf, no, nf, see}},
		{"POST", "/admin/executions/:id/resume", "/admin/executions/{done}/resume", false, [6]int{no, see, nf, no, nf, see}},
		// MCP clients: each sees their own principal's (the approver has
		// none), the auditor and the operator everyone's.
		{"GET", "/admin/mcp", "/admin/mcp", false, [6]int{see, ok, ok, ok, ok, ok}},
		{"GET", "/admin/deadletters", "/admin/deadletters", false, [6]int{see, no, no, ok, no, ok}},
		{"POST", "/admin/deadletters/:id/redeliver", "/admin/deadletters/dl_nope/redeliver", false, [6]int{no, no, no, no, no, nf}},
	}
	clients := make([]*client, len(sessions))
	for i, s := range sessions {
		clients[i] = s(t)
	}
	covered := map[string]bool{}
	for _, row := range rows {
		covered[row.method+" "+row.route] = true
		for i := range sessions {
			t.Run(fmt.Sprintf("%s %s as %d", row.method, row.path, i), func(t *testing.T) {
				c := clients[i]
				exec, ap := shared, sharedAp
				if row.fresh {
					c = sessions[i](t)
					if strings.Contains(row.path, "{exec}") || strings.Contains(row.path, "{approval}") {
						exec, ap = waiting(t)
					}
				}
				path := strings.NewReplacer("{exec}", exec, "{approval}", ap, "{done}", done).Replace(row.path)
				path = strings.ReplaceAll(path, "{new}", fmt.Sprintf("fresh%d", n.Add(1)))
				if strings.Contains(path, "{scratch}") {
					name := fmt.Sprintf("scratch%d", n.Add(1))
					al, err := gates.ParseAllowlist(name, []byte(`{"connections":{"mem":{"ops":["echo"]}}}`))
					must(t, err)
					_, err = b.als.Put(ctx, al, "setup")
					must(t, err)
					path = strings.ReplaceAll(path, "{scratch}", name)
				}
				if got := c.status(row.method, path); got != row.want[i] {
					t.Errorf("%s %s as session %d = %d, want %d", row.method, path, i, got, row.want[i])
				}
			})
		}
	}
	for _, rt := range b.routes {
		if !covered[rt.Method+" "+rt.Path] {
			t.Errorf("route %s %s is not in the admin authorization matrix: add a row saying who may use it", rt.Method, rt.Path)
		}
	}
}

// status sends one request and returns its status without reading the
// body, so event streams do not hold the test. A POST carries the
// session's CSRF token, and a form for the allowlist routes.
func (c *client) status(method, path string) int {
	c.t.Helper()
	u, err := url.Parse(c.base + path)
	must(c.t, err)
	form := url.Values{"_csrf": {c.csrf}, "conn": {"mem"}, "ops": {"echo"}}
	if name := u.Query().Get("name"); name != "" {
		form.Set("name", name)
	}
	var req *http.Request
	if method == http.MethodPost {
		req, err = http.NewRequest(method, c.base+u.Path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req, err = http.NewRequest(method, c.base+path, nil)
	}
	must(c.t, err)
	resp, err := c.http.Do(req)
	must(c.t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// waitApprovalOf waits for the approval exec asks for.
func waitApprovalOf(t *testing.T, b *bundle, exec string) string {
	t.Helper()
	for range 500 {
		aps, err := b.execs.Approvals().List(context.Background(), gates.ApprovalPending, 200)
		must(t, err)
		for _, ap := range aps {
			if ap.Execution == exec {
				return ap.ID
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no approval for %s", exec)
	return ""
}
