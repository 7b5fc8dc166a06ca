package web_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/web"
)

func user(key, name string, roles ...authz.Role) web.User {
	return web.User{SHA256: sha256.Sum256([]byte(key)), Principal: authz.Principal{Name: name, Roles: roles, Allowlist: "ops"}}
}

// roleUsers are the users of the role tests: alice and bob (run), an
// auditor (read) and an approver (approve), all bound to ops.
func roleUsers() []web.User {
	return []web.User{
		user("alice-key", "alice"),
		user("bob-key", "bob"),
		user("auditor-key", "auditor", authz.Read),
		user("approver-key", "approver", authz.Approve),
	}
}

// TestUsersSeeWhatTheirRolesAllow: a user signed in with an API key has
// the key's roles in the UI, as in the API.
func TestUsersSeeWhatTheirRolesAllow(t *testing.T) {
	t.Parallel()
	b := setup(t, roleUsers()...)
	ctx := context.Background()
	ex, err := b.execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(guardedDoc), Principal: "alice", Allowlist: "ops"})
	must(t, err)
	ap := waitPending(t, b)

	alice, bob := signInWith(t, b, "alice-key"), signInWith(t, b, "bob-key")
	auditor, approver := signInWith(t, b, "auditor-key"), signInWith(t, b, "approver-key")

	// Pages by role: 200 where the role allows, 403 where it does not, 404
	// for another's execution.
	for _, c := range []struct {
		who  string
		cl   *client
		path string
		want int
	}{
		{"alice", alice, "/admin/executions/" + ex.ID, 200},
		{"bob", bob, "/admin/executions/" + ex.ID, 404},
		{"bob", bob, "/admin/executions/" + ex.ID + "/stream", 404},
		{"auditor", auditor, "/admin/executions/" + ex.ID, 200},
		{"approver", approver, "/admin/executions/" + ex.ID, 404},
		{"alice", alice, "/admin/allowlists", 403},
		{"auditor", auditor, "/admin/allowlists", 200},
		{"auditor", auditor, "/admin/allowlists/new", 403},
		{"auditor", auditor, "/admin/deadletters", 200},
		{"bob", bob, "/admin/deadletters", 403},
		{"approver", approver, "/admin/approvals", 200},
	} {
		if p := c.cl.get(c.path); p.status != c.want {
			t.Errorf("%s GET %s = %d, want %d", c.who, c.path, p.status, c.want)
		}
	}
	// A resume point that is no event id is the client's error, not a 500.
	if p := alice.do(http.MethodGet, "/admin/executions/"+ex.ID+"/stream", nil, "Last-Event-ID", "garbage"); p.status != http.StatusBadRequest {
		t.Errorf("stream after a garbage Last-Event-ID = %d, want 400", p.status)
	}
	// Bob's list of executions lacks alice's; the auditor's has it.
	if p := bob.get("/admin/executions"); strings.Contains(p.doc.Text(), ex.ID) {
		t.Error("bob's executions page lists alice's execution")
	}
	if p := auditor.get("/admin/executions"); !strings.Contains(p.doc.Text(), ex.ID) {
		t.Error("the auditor's executions page lacks alice's execution")
	}
	// The navigation offers what the role may use.
	if nav := text(bob.get("/admin").doc.Find("nav")); strings.Contains(nav, "Allowlists") || strings.Contains(nav, "Approvals") {
		t.Errorf("bob's navigation: %s", nav)
	}

	// Only an approver who is not the requester decides; read cannot.
	if p := bob.post("/admin/executions/"+ex.ID+"/cancel", nil); p.status != http.StatusNotFound {
		t.Fatalf("bob cancels alice's execution: %d", p.status)
	}
	if p := auditor.post("/admin/approvals/"+ap.ID+"/approve", nil); p.status != http.StatusForbidden {
		t.Fatalf("the auditor approves: %d", p.status)
	}
	if p := alice.get("/admin/approvals"); p.doc.Find(`#pending article[data-approval="`+ap.ID+`"]`).Length() != 0 {
		t.Fatal("alice is offered her own call to decide")
	}
	if p := alice.post("/admin/approvals/"+ap.ID+"/approve", nil); p.status != http.StatusSeeOther || !strings.Contains(p.header.Get("Location"), "flash=self") {
		t.Fatalf("alice approves her own call: %d %s", p.status, p.header.Get("Location"))
	}
	if p := approver.get("/admin/approvals"); p.doc.Find(`#pending article[data-approval="`+ap.ID+`"]`).Length() != 1 {
		t.Fatal("the approver's page lacks the pending approval")
	}
	if p := approver.post("/admin/approvals/"+ap.ID+"/approve", nil); p.status != http.StatusSeeOther || !strings.Contains(p.header.Get("Location"), "flash=approved") {
		t.Fatalf("the approver approves: %d %s", p.status, p.header.Get("Location"))
	}
	got, err := b.execs.Approvals().Get(ctx, ap.ID)
	must(t, err)
	if got.State != gates.ApprovalApproved || got.DecidedBy != "approver" {
		t.Fatalf("approval = %s by %q", got.State, got.DecidedBy)
	}
}
