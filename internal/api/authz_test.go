package api_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The principals of the authorization matrix, in the order of its columns.
// owner is alice, who starts every execution the rows act on; other is
// bob, another key with run.
var matrixWho = []struct{ name, key string }{
	{"none", ""},
	{"owner", "alice-key"},
	{"other", "bob-key"},
	{"read", "auditor-key"},
	{"approve", "approver-key"},
	{"admin", testKey},
	{"pusher", "pusher-key"},
}

// fixture is what a row's path refers to, made fresh for every cell whose
// request changes state, so the cells do not depend on one another.
type fixture struct {
	exec     string // alice's execution, waiting for the approval of a guarded call
	approval string // that call's approval
	done     string // alice's execution that has finished
	question string // a question put to alice's waiting execution
}

// mcpInitialize opens a 2025-era MCP session.
const mcpInitialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"matrix","version":"1"}}}`

const guardedDoc = `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"g","connection":"mem","op":"guarded","args":{"x":1}}}`

// submitAs starts doc as the key and returns the execution's id.
func (b *bundle) submitAs(t *testing.T, key, body string) string {
	t.Helper()
	r := b.do(t, "POST", "/v1/executions", "application/json", body, "Authorization", "Bearer "+key)
	if r.status != 202 && r.status != 200 {
		t.Fatalf("POST as %s = %d %s", key, r.status, r.body)
	}
	return r.json(t)["id"].(string)
}

// pendingApproval waits for the approval exec asks for.
func (b *bundle) pendingApproval(t *testing.T, exec string) string {
	t.Helper()
	for range 500 {
		r := b.do(t, "GET", "/v1/approvals?state=pending&limit=200", "", "")
		for _, it := range r.json(t)["items"].([]any) {
			if ap := it.(map[string]any); ap["execution"] == exec {
				return ap["id"].(string)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no pending approval for %s", exec)
	return ""
}

func (b *bundle) newFixture(t *testing.T) fixture {
	t.Helper()
	var f fixture
	f.exec = b.submitAs(t, "alice-key", `{"workflow":`+guardedDoc+`}`)
	f.approval = b.pendingApproval(t, f.exec)
	f.done = b.submitAs(t, "alice-key", `{"workflow":`+hello+`,"input":{"x":1},"wait":"10s"}`)
	return f
}

// TestAuthorizationMatrix drives every route as every kind of principal
// and checks the status, from one table. A route the server has that the
// table does not cover fails the test, so a new route must say who may
// use it.
func TestAuthorizationMatrix(t *testing.T) {
	t.Parallel()
	qq := newQuestionQueue(t)
	b := setup(t, withMCPTokens(t, newOAuthIssuer(t)), withQuestions(qq))
	const other = "/v1/allowlists/other" // an allowlist no test key is bound to
	if r := b.do(t, "PUT", other, "application/json", `{"connections":{}}`); r.status != 201 {
		t.Fatalf("PUT other = %d %s", r.status, r.body)
	}
	shared := b.newFixture(t)
	shared.question = qq.ask(t, freshKey(), shared.exec, "alice", "mem")
	push := `{"id":"{uniq}","type":"deploy.failed","payload":{"service":"api"}}`

	// want: none, owner, other, read, approve, admin, pusher.
	rows := []struct {
		method, path, body string
		fresh              bool // a fixture per cell: the request changes state
		want               [7]int
	}{
		{"GET", "/healthz", "", false, [7]int{200, 200, 200, 200, 200, 200, 200}},
		{"GET", "/readyz", "", false, [7]int{200, 200, 200, 200, 200, 200, 200}},
		{"GET", "/metrics", "", false, [7]int{200, 200, 200, 200, 200, 200, 200}},
		// Public: where an MCP client learns which issuer's tokens /mcp takes.
		{"GET", "/.well-known/oauth-protected-resource/mcp", "", false, [7]int{200, 200, 200, 200, 200, 200, 200}},
		{"POST", "/v1/executions", `{"workflow":` + hello + `,"input":{"x":1}}`, false, [7]int{401, 202, 202, 403, 403, 202, 202}},
		{"GET", "/v1/executions", "", false, [7]int{401, 200, 200, 200, 200, 200, 200}},
		{"GET", "/v1/executions/{exec}", "", false, [7]int{401, 200, 404, 200, 404, 200, 404}},
		{"GET", "/v1/executions/{done}/events", "", false, [7]int{401, 200, 404, 200, 404, 200, 404}},
		{"POST", "/v1/executions/{exec}/cancel", "", true, [7]int{401, 200, 404, 403, 404, 200, 404}},
		{"POST", "/v1/executions/{done}/resume", "", false, [7]int{401, 409, 404, 403, 404, 409, 404}},
		{"GET", "/v1/connections", "", false, [7]int{401, 200, 200, 200, 200, 200, 200}},
		{"GET", "/v1/connections/mem", "", false, [7]int{401, 200, 200, 200, 200, 200, 200}},
		{"GET", "/v1/connections/mem/operations/echo", "", false, [7]int{401, 200, 200, 200, 200, 200, 200}},
		{"PUT", "/v1/secrets/app.token", `{"value":"a-long-enough-value"}`, false, [7]int{401, 403, 403, 403, 403, 501, 403}},
		{"POST", "/hooks/deploys", push, false, [7]int{400, 400, 400, 400, 400, 400, 400}}, // signed, not keyed
		{"POST", "/hooks/tickets", push, false, [7]int{400, 400, 400, 400, 400, 400, 400}}, // an MCP server's deliveries: signed with the subscription's secret, not keyed
		{"POST", "/v1/sources/deploys/events", push, false, [7]int{401, 403, 403, 403, 403, 202, 202}},
		{"POST", "/v1/harness/start", "", false, [7]int{401, 403, 403, 403, 403, 200, 403}},
		{"GET", "/v1/harness/status", "", false, [7]int{401, 403, 403, 200, 403, 200, 403}},
		{"GET", "/v1/deadletters", "", false, [7]int{401, 403, 403, 200, 403, 200, 403}},
		{"POST", "/v1/deadletters/dl_nope/redeliver", "", false, [7]int{401, 403, 403, 403, 403, 404, 403}},
		{"GET", "/v1/allowlists", "", false, [7]int{401, 200, 200, 200, 200, 200, 200}},
		{"GET", "/v1/allowlists/test", "", false, [7]int{401, 200, 200, 200, 200, 200, 200}},
		{"GET", other, "", false, [7]int{401, 404, 404, 200, 404, 200, 404}},
		{"PUT", other, `{"connections":{"mem":{"ops":["echo"]}}}`, false, [7]int{401, 403, 403, 403, 403, 200, 403}},
		{"DELETE", "/v1/allowlists/{scratch}", "", true, [7]int{401, 403, 403, 403, 403, 204, 403}},
		{"GET", other + "/describe", "", false, [7]int{401, 404, 404, 200, 404, 200, 404}},
		{"GET", "/v1/approvals", "", false, [7]int{401, 200, 200, 200, 200, 200, 200}},
		{"GET", "/v1/approvals/{approval}", "", false, [7]int{401, 200, 404, 200, 200, 200, 404}},
		{"POST", "/v1/approvals/{approval}/approve", "", true, [7]int{401, 409, 404, 403, 200, 200, 404}},
		{"POST", "/v1/approvals/{approval}/deny", "", true, [7]int{401, 409, 404, 403, 200, 200, 404}},
		// Questions as approvals: the asker sees its own but may not
		// answer (its connection names no answerers), read sees all.
		{"GET", "/v1/questions", "", false, [7]int{401, 200, 200, 200, 200, 200, 200}},
		{"GET", "/v1/questions/{question}", "", false, [7]int{401, 200, 404, 200, 200, 200, 404}},
		{"POST", "/v1/questions/{question}/answer", goodAnswer, true, [7]int{401, 409, 404, 403, 200, 200, 404}},
		{"POST", "/v1/questions/{question}/decline", `{"reason":"no"}`, true, [7]int{401, 409, 404, 403, 200, 200, 404}},
		{"POST", "/v1/questions/{question}/cancel", `{}`, true, [7]int{401, 409, 404, 403, 200, 200, 404}},
		// The MCP face: any key that may run; the tools it lists are what
		// the key's allowlist grants (package mcpserver tests that).
		{"POST", "/mcp", mcpInitialize, false, [7]int{401, 200, 200, 403, 403, 200, 200}},
		{"GET", "/mcp", "", false, [7]int{401, 405, 405, 403, 403, 405, 405}},
		{"DELETE", "/mcp", "", false, [7]int{401, 405, 405, 403, 403, 405, 405}},
	}

	covered := map[string]bool{}
	for _, row := range rows {
		covered[row.method+" "+routeOf(row.path)] = true
		for i, who := range matrixWho {
			t.Run(fmt.Sprintf("%s %s as %s", row.method, row.path, who.name), func(t *testing.T) {
				f := shared
				if row.fresh {
					if strings.Contains(row.path, "{question}") {
						// A question needs no run of its own: a fresh
						// one on the shared execution.
						f.question = qq.ask(t, freshKey(), shared.exec, "alice", "mem")
					} else {
						f = b.newFixture(t)
					}
				}
				path := strings.NewReplacer("{exec}", f.exec, "{done}", f.done, "{approval}", f.approval, "{question}", f.question).Replace(row.path)
				if strings.Contains(path, "{scratch}") {
					path = strings.ReplaceAll(path, "{scratch}", b.scratchAllowlist(t))
				}
				body := strings.ReplaceAll(row.body, "{uniq}", fmt.Sprintf("evt-%d", scratchN.Add(1)))
				ct := ""
				if row.body != "" {
					ct = "application/json"
				}
				r := b.do(t, row.method, path, ct, body, "Authorization", bearer(who.key))
				if r.status != row.want[i] {
					t.Errorf("%s %s as %s = %d, want %d: %s", row.method, path, who.name, r.status, row.want[i], r.body)
				}
			})
		}
	}
	for _, rt := range b.routes {
		if !covered[rt.Method+" "+rt.Path] {
			t.Errorf("route %s %s is not in the authorization matrix: add a row saying who may use it", rt.Method, rt.Path)
		}
	}
}

func bearer(key string) string {
	if key == "" {
		return ""
	}
	return "Bearer " + key
}

var scratchN atomic.Int64

// scratchAllowlist makes an allowlist a cell may delete.
func (b *bundle) scratchAllowlist(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("scratch%d", scratchN.Add(1))
	if r := b.do(t, "PUT", "/v1/allowlists/"+name, "application/json", `{"connections":{}}`); r.status != 201 {
		t.Fatalf("PUT %s = %d %s", name, r.status, r.body)
	}
	return name
}

// routeOf turns a row's path into the echo route it hits.
func routeOf(p string) string {
	known := map[string]string{
		"/v1/executions/{exec}":               "/v1/executions/:id",
		"/v1/executions/{done}/events":        "/v1/executions/:id/events",
		"/v1/executions/{exec}/cancel":        "/v1/executions/:id/cancel",
		"/v1/executions/{done}/resume":        "/v1/executions/:id/resume",
		"/v1/connections/mem":                 "/v1/connections/:name",
		"/v1/connections/mem/operations/echo": "/v1/connections/:name/operations/*",
		"/v1/secrets/app.token":               "/v1/secrets/:name",
		"/hooks/deploys":                      "/hooks/:connection",
		"/hooks/tickets":                      "/hooks/:connection",
		"/v1/sources/deploys/events":          "/v1/sources/:name/events",
		"/v1/deadletters/dl_nope/redeliver":   "/v1/deadletters/:id/redeliver",
		"/v1/allowlists/test":                 "/v1/allowlists/:name",
		"/v1/allowlists/other":                "/v1/allowlists/:name",
		"/v1/allowlists/{scratch}":            "/v1/allowlists/:name",
		"/v1/allowlists/other/describe":       "/v1/allowlists/:name/describe",
		"/v1/approvals/{approval}":            "/v1/approvals/:id",
		"/v1/approvals/{approval}/approve":    "/v1/approvals/:id/approve",
		"/v1/approvals/{approval}/deny":       "/v1/approvals/:id/deny",
		"/v1/questions/{question}":            "/v1/questions/:id",
		"/v1/questions/{question}/answer":     "/v1/questions/:id/answer",
		"/v1/questions/{question}/decline":    "/v1/questions/:id/decline",
		"/v1/questions/{question}/cancel":     "/v1/questions/:id/cancel",
	}
	if r, ok := known[p]; ok {
		return r
	}
	return p
}

// TestEveryOperationSaysWhoMayUseIt: openapi.yaml states, for every
// operation that takes a key, the role or ownership it needs
// (x-patchbay-access); the open ones say they are (security: []).
func TestEveryOperationSaysWhoMayUseIt(t *testing.T) {
	t.Parallel()
	spec := loadSpec(t)
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			access, _ := op.Extensions["x-patchbay-access"].(string)
			open := op.Security != nil && len(*op.Security) == 0
			if strings.TrimSpace(access) == "" && !open {
				t.Errorf("%s %s: no x-patchbay-access saying who may use it", method, path)
			}
		}
	}
}
