package api_test

import "testing"

// exerciseMCP drives /mcp's HTTP surface (the protocol itself is package
// mcpserver's to test): a 2025-era session opened and ended, a GET without
// a session, another key's use of the session.
func exerciseMCP(t *testing.T, b *bundle) {
	t.Helper()
	accept := "application/json, text/event-stream"
	r := b.do(t, "POST", "/mcp", "application/json", mcpInitialize, "Accept", accept)
	sid := r.header.Get("Mcp-Session-Id")
	if r.status != 200 || sid == "" {
		t.Fatalf("initialize = %d (session %q) %s", r.status, sid, r.body)
	}
	if r = b.do(t, "GET", "/mcp", "", "", "Accept", accept); r.status != 405 || r.json(t)["code"] != "METHOD_NOT_ALLOWED" {
		t.Fatalf("GET without a session = %d %s", r.status, r.body)
	}
	if r = b.do(t, "DELETE", "/mcp", "", "", "Mcp-Session-Id", sid, "Authorization", "Bearer alice-key"); r.status != 404 || r.json(t)["code"] != "SESSION_NOT_FOUND" {
		t.Fatalf("DELETE of another key's session = %d %s", r.status, r.body)
	}
	if r = b.do(t, "DELETE", "/mcp", "", "", "Mcp-Session-Id", sid, "Mcp-Protocol-Version", "2025-11-25"); r.status != 200 {
		t.Fatalf("DELETE = %d %s", r.status, r.body)
	}
	if r = b.do(t, "POST", "/mcp", "application/json", mcpInitialize, "Accept", accept, "Authorization", ""); r.status != 401 {
		t.Fatalf("initialize without a key = %d %s", r.status, r.body)
	}
}
