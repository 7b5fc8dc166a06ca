package api_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunKeyCannotTakeTheHost replays the attack an ordinary key made on
// an earlier version: rewrite its own allowlist to grant itself a shell,
// bring that shell in a document, approve its own guarded call, and read
// another key's work. Each step is refused, and the shell never runs.
func TestRunKeyCannotTakeTheHost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const jsonCT = "application/json"
	marker := filepath.Join(t.TempDir(), "pwned")
	shell := `{"name":"sh","command":"/bin/sh","args":["-c","touch ` + marker + `"],"ops":["*"]}`
	as := func(key string) []string { return []string{"Authorization", "Bearer " + key} }

	// 1. A run key cannot change the allowlist that bounds it, or another.
	if r := b.do(t, "PUT", "/v1/allowlists/test", jsonCT, `{"connections":{"mem":{"ops":["*"]}},"mcp":[`+shell+`]}`, as("alice-key")...); r.status != 403 {
		t.Fatalf("run key PUT own allowlist = %d %s", r.status, r.body)
	}
	if r := b.do(t, "DELETE", "/v1/allowlists/test", "", "", as("bob-key")...); r.status != 403 {
		t.Fatalf("run key DELETE allowlist = %d %s", r.status, r.body)
	}

	// 2. Not even an admin can grant a command line through the API: the
	// config file is the one place a command is trusted.
	r := b.do(t, "PUT", "/v1/allowlists/test", jsonCT, `{"connections":{"mem":{"ops":["*"]}},"mcp":[`+shell+`]}`)
	if r.status != 422 || r.json(t)["code"] != "HOST_GRANT_REFUSED" || !strings.Contains(string(r.body), `"/mcp/0/command"`) {
		t.Fatalf("admin PUT command grant = %d %s", r.status, r.body)
	}
	// An admin may still grant a server by URL.
	if r := b.do(t, "PUT", "/v1/allowlists/urls", jsonCT, `{"connections":{},"mcp":[{"name":"remote","url":"https://mcp.example.test/mcp","ops":["*"]}]}`); r.status != 201 {
		t.Fatalf("admin PUT url grant = %d %s", r.status, r.body)
	}

	// 3. A document bringing the shell is refused before anything runs.
	doc := `{"version":1,"connections":{"sh":{"mcp":{"name":"sh","command":"/bin/sh","args":["-c","touch ` + marker + `"]}}},"root":{"kind":"call","id":"x","connection":"sh","op":"run"}}`
	if r := b.do(t, "POST", "/v1/executions", jsonCT, `{"workflow":`+doc+`}`, as("alice-key")...); r.status != 422 || r.json(t)["code"] != "CONNECTION_NOT_ALLOWED" {
		t.Fatalf("document bringing a shell = %d %s", r.status, r.body)
	}

	// 4. A key cannot approve its own guarded call, nor can another run key.
	exec := b.submitAs(t, "alice-key", `{"workflow":`+guardedDoc+`}`)
	ap := b.pendingApproval(t, exec)
	if r := b.do(t, "POST", "/v1/approvals/"+ap+"/approve", "", "", as("alice-key")...); r.status != 409 || r.json(t)["code"] != "APPROVAL_SELF" {
		t.Fatalf("self approval = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/approvals/"+ap+"/approve", "", "", as("bob-key")...); r.status != 404 {
		t.Fatalf("approval by another run key = %d %s", r.status, r.body)
	}

	// 5. Another run key sees nothing of alice's: not the execution, its
	// events, its approval, nor a line of the list.
	for _, path := range []string{"/v1/executions/" + exec, "/v1/executions/" + exec + "/events", "/v1/approvals/" + ap} {
		if r := b.do(t, "GET", path, "", "", as("bob-key")...); r.status != 404 {
			t.Fatalf("bob GET %s = %d %s", path, r.status, r.body)
		}
	}
	for _, path := range []string{"/v1/executions", "/v1/approvals"} {
		if r := b.do(t, "GET", path, "", "", as("bob-key")...); strings.Contains(string(r.body), exec) {
			t.Fatalf("bob's %s lists alice's execution: %s", path, r.body)
		}
		if r := b.do(t, "GET", path, "", "", as("auditor-key")...); !strings.Contains(string(r.body), exec) {
			t.Fatalf("the auditor's %s lacks alice's execution: %s", path, r.body)
		}
	}
	for _, path := range []string{"/v1/executions/" + exec + "/cancel", "/v1/executions/" + exec + "/resume"} {
		if r := b.do(t, "POST", path, "", "", as("bob-key")...); r.status != 404 {
			t.Fatalf("bob POST %s = %d %s", path, r.status, r.body)
		}
	}

	// 6. Secrets and sources need their grants.
	if r := b.do(t, "PUT", "/v1/secrets/app.token", jsonCT, `{"value":"overwritten-value"}`, as("alice-key")...); r.status != 403 {
		t.Fatalf("run key PUT secret = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/sources/deploys/events", jsonCT, `{"id":"e1","type":"deploy.failed","payload":{"service":"x"}}`, as("alice-key")...); r.status != 403 {
		t.Fatalf("run key push = %d %s", r.status, r.body)
	}

	// The approver decides; the call runs once, and the shell never ran.
	if r := b.do(t, "POST", "/v1/approvals/"+ap+"/approve", "", "", as("approver-key")...); r.status != 200 {
		t.Fatalf("approve = %d %s", r.status, r.body)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the shell command ran: %v", err)
	}
}
