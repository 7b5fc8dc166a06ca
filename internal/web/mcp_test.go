package web_test

import (
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"

	"github.com/patchbay-dev/patchbay/internal/mcpserver"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// fakeMCP is an MCP face whose live clients are fixed, their times
// counted back from each listing so the page's relative times hold.
type fakeMCP func(now time.Time) []mcpserver.Session

func (f fakeMCP) Sessions() []mcpserver.Session { return f(time.Now()) }

// Session ids of the fake clients: the page shows only their last 8
// characters, and another principal's not at all.
const (
	aliceSession = "mcp-session-0a1b2c3d-0000-4000-8000-0000a11ce001"
	bobSession   = "mcp-session-0a1b2c3d-0000-4000-8000-00000b0b0002"
)

func mcpClients(now time.Time) []mcpserver.Session {
	opened := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	return []mcpserver.Session{
		{ID: aliceSession, Principal: "alice", Client: "claude-code", Version: "2.1.0", Era: "2025-11-25",
			Opened: opened, Calls: 3, LastCall: now.Add(-65 * time.Second)},
		{Principal: "alice", Client: "cursor", Version: "1.4", Era: "2026-07-28",
			Opened: opened, Calls: 1, LastCall: now.Add(-2 * time.Minute)},
		{ID: bobSession, Principal: "bob", Client: "sdk-app", Era: "2025-06-18", Opened: opened},
	}
}

// The MCP clients page lists the live clients of the MCP face: all of
// them to read and the operator; to a run user, only their own
// principal's, with nothing of another's (session ids included); none to
// a user whose role cannot use /mcp.
func TestMCPClientsPage(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(o *web.Options) { o.MCP = fakeMCP(mcpClients) }, roleUsers()...)
	aliceRow := "alice | claude-code 2.1.0 | 2025-11-25 | …a11ce001 | 2026-03-01 09:30:00 UTC | 3 | 1m5s ago"
	aliceModern := "alice | cursor 1.4 | 2026-07-28 | — | 2026-03-01 09:30:00 UTC | 1 | 2m0s ago"
	bobRow := "bob | sdk-app | 2025-06-18 | …0b0b0002 | 2026-03-01 09:30:00 UTC | 0 | —"
	for _, tc := range []struct {
		who   string
		cl    *client
		want  []string
		never []string // text that must not be on the page
	}{
		{"the operator", signIn(t, b), []string{aliceRow, aliceModern, bobRow}, nil},
		{"auditor", signInWith(t, b, "auditor-key"), []string{aliceRow, aliceModern, bobRow}, nil},
		{"alice", signInWith(t, b, "alice-key"), []string{aliceRow, aliceModern}, []string{"bob", "sdk-app", "0b0b0002"}},
		{"bob", signInWith(t, b, "bob-key"), []string{bobRow}, []string{"alice", "claude-code", "cursor", "a11ce001"}},
		{"approver", signInWith(t, b, "approver-key"), nil, []string{"alice", "bob", "a11ce001", "0b0b0002"}},
	} {
		t.Run(tc.who, func(t *testing.T) {
			p := tc.cl.get("/admin/mcp")
			if p.status != 200 {
				t.Fatalf("status %d", p.status)
			}
			var rows []string
			p.doc.Find("#mcp-sessions tbody tr[data-principal]").Each(func(_ int, tr *goquery.Selection) {
				var cells []string
				tr.Find("td").Each(func(_ int, td *goquery.Selection) { cells = append(cells, text(td)) })
				rows = append(rows, strings.Join(cells, " | "))
			})
			if strings.Join(rows, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(tc.want, "\n"))
			}
			if len(tc.want) == 0 && !strings.Contains(text(p.doc.Find("#mcp-sessions tbody")), "No live MCP clients.") {
				t.Error("an empty list does not say so")
			}
			html, err := p.doc.Html()
			must(t, err)
			// The whole id is nobody's to copy from the page, not even
			// the operator's.
			for _, s := range append(tc.never, aliceSession, bobSession, "mcp-session-") {
				if strings.Contains(html, s) {
					t.Errorf("the page holds %q", s)
				}
			}
		})
	}
	// The navigation offers the page to those who can use /mcp (run) or
	// see everyone's (read).
	for key, want := range map[string]bool{"alice-key": true, "auditor-key": true, "approver-key": false} {
		if got := strings.Contains(text(signInWith(t, b, key).get("/admin").doc.Find("nav")), "MCP clients"); got != want {
			t.Errorf("%s: navigation offers MCP clients = %v, want %v", key, got, want)
		}
	}
}

// Without an MCP face the page says /mcp is not served.
func TestMCPClientsPageWithoutMCP(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := signIn(t, b).get("/admin/mcp")
	if p.status != 200 {
		t.Fatalf("status %d", p.status)
	}
	if got := text(p.doc.Find("#mcp-off")); got != "The MCP face (/mcp) is not served by this server." {
		t.Errorf("off message %q", got)
	}
	if p.doc.Find("#mcp-sessions").Length() != 0 {
		t.Error("a table of clients without an MCP face")
	}
}
