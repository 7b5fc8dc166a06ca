package web_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/profiles"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// chatServer is a Memory connection whose server declares chat@1.
type chatServer struct{ *connecttest.Memory }

func (c chatServer) Connect(context.Context) (connect.Conn, error) { return c, nil }
func (c chatServer) Manifest() connect.Manifest {
	m := c.Memory.Manifest()
	m.Profiles = map[string]string{"chat": "1.0.0"}
	return m
}

// The connection page shows the profiles a connection speaks: declared by
// its server, or given by a binding (a pool's too), with their versions
// and reads.
func TestConnectionPageShowsProfiles(t *testing.T) {
	t.Parallel()
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("chat", chatServer{connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "chat.post"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "chat.reply"}})}))
	must(t, reg.Add("web", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "browser_navigate"}})))
	must(t, reg.Add("plain", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})))
	b, _ := profiles.Builtin().Binding("playwright-browser")
	must(t, reg.SetBinding("web", b))
	// A pool bound to browser@1, each lease a server with the bound tools.
	st := storetest.New(t)
	pool, err := pools.New(st, "browsers", 1, nil)
	must(t, err)
	prov, err := pools.NewProvider(pool, pools.ProviderOptions{Provision: func(context.Context, map[string]any) (connect.Conn, error) {
		var ops []connecttest.MemoryOp
		for _, tool := range b.Tools() {
			ops = append(ops, connecttest.MemoryOp{Operation: connect.Operation{Name: tool}})
		}
		return connecttest.NewMemory(ops...), nil
	}})
	must(t, err)
	must(t, reg.Add("browsers", prov))
	must(t, reg.SetBinding("browsers", b))
	_ = reg.Start(context.Background()) // web lacks most playwright tools: unavailable, still bound
	e := echo.New()
	must(t, web.Mount(e, web.Options{AdminToken: adminToken, Store: st, Executions: harness.NewExecutions(st, reg, nil), Registry: reg, Allowlists: gates.NewAllowlists(st)}))
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.Close(); _ = reg.Close() })

	c := signIn(t, &bundle{url: srv.URL})
	rows := func(conn string) string {
		var out []string
		c.get("/admin/connections/" + conn).doc.Find("#profiles tbody tr").Each(func(_ int, row *goquery.Selection) {
			var cells []string
			row.Find("td").Each(func(_ int, s *goquery.Selection) { cells = append(cells, strings.Join(strings.Fields(s.Text()), " ")) })
			out = append(out, strings.Join(cells, " "))
		})
		return strings.Join(out, " | ")
	}
	const browserReads = "browser.page.summary (turn), screen.current (ask), ui.tree (effect)"
	for conn, want := range map[string]string{
		"chat":     "chat 1.0.0 declared by the server chat.thread.recent (turn)",
		"web":      "browser 1.0.0 binding playwright-browser " + browserReads,
		"browsers": "browser 1.0.0 binding playwright-browser " + browserReads,
	} {
		if got := rows(conn); got != want {
			t.Errorf("%s: %q, want %q", conn, got, want)
		}
	}
	if p := c.get("/admin/connections/plain"); p.doc.Find("#h-profiles").Length() != 0 {
		t.Error("a connection without profiles shows a profiles panel")
	}
}
