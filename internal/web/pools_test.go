package web_test

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// fakePool is a pool provider whose usage is fixed; it leases nothing.
type fakePool struct {
	*connecttest.Memory
	usage *connect.PoolStatus
}

func (f *fakePool) CheckSetup(map[string]any) error { return nil }
func (f *fakePool) Lease(context.Context, connect.LeaseRequest) (connect.Lease, error) {
	return nil, errors.New("not in this test")
}
func (f *fakePool) PoolStatus() *connect.PoolStatus { return f.usage }

// The connection page of a pool shows its usage: leased of max, queued,
// and each lease's holder and age.
func TestConnectionPageShowsPoolUsage(t *testing.T) {
	t.Parallel()
	reg := registry.NewRegistry(nil)
	pool := &fakePool{Memory: connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "browser_navigate"}}),
		usage: &connect.PoolStatus{Max: 4, Leased: 1, Queued: 2, Leases: []connect.PoolLease{
			{Holder: "ex_abc/app/p0", Slot: 3, AgeMs: 65_000, SinceRenewMs: 4_000}}}}
	must(t, reg.Add("browsers", pool))
	must(t, reg.Start(context.Background()))
	st := storetest.New(t)
	als := gates.NewAllowlists(st)
	e := echo.New()
	must(t, web.Mount(e, web.Options{AdminToken: adminToken, Store: st, Executions: harness.NewExecutions(st, reg, nil), Registry: reg, Allowlists: als}))
	srv := httptest.NewServer(e)
	t.Cleanup(func() { srv.Close(); _ = reg.Close() })

	c := signIn(t, &bundle{url: srv.URL})
	p := c.get("/admin/connections/browsers")
	text := func(sel string) string { return strings.Join(strings.Fields(p.doc.Find(sel).Text()), " ") }
	if got := text("#pool-leased"); got != "1 of 4" {
		t.Errorf("leased %q", got)
	}
	if got := text("#pool-queued"); got != "2" {
		t.Errorf("queued %q", got)
	}
	var cells []string
	p.doc.Find("#pool-leases tbody tr td").Each(func(_ int, s *goquery.Selection) { cells = append(cells, strings.TrimSpace(s.Text())) })
	if got := strings.Join(cells, " | "); got != "ex_abc/app/p0 | 3 | 1m5s | 4s ago" {
		t.Errorf("lease row %q", got)
	}
	if p := c.get("/admin/connections/browsers"); p.doc.Find("#h-signin").Length() != 0 {
		t.Error("a pool without OAuth shows a sign-in panel")
	}
}

// A lease's holder names an execution: the connection page shows it to
// the execution's owner, to read and to the operator; to another user the
// lease shows as held, without the holder.
func TestConnectionPageHidesOthersLeaseHolders(t *testing.T) {
	t.Parallel()
	const holder = "ex_alices/app"
	pool := &fakePool{Memory: connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "browser_navigate"}}),
		usage: &connect.PoolStatus{Max: 2, Leased: 1, Leases: []connect.PoolLease{{Holder: holder, Slot: 1, AgeMs: 2_000, SinceRenewMs: 1_000}}}}
	b := setupConns(t, nil, func(reg *registry.Registry) { must(t, reg.Add("browsers", pool)) }, roleUsers()...)
	_, err := b.execs.Submit(context.Background(), harness.Request{ID: "ex_alices", Workflow: json.RawMessage(`{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"e","connection":"mem","op":"echo","args":{}}}`), Principal: "alice", Allowlist: "ops"})
	must(t, err)

	for _, tc := range []struct {
		who  string
		cl   *client
		want string
	}{
		{"alice", signInWith(t, b, "alice-key"), holder},
		{"auditor", signInWith(t, b, "auditor-key"), holder},
		{"the operator", signIn(t, b), holder},
		{"bob", signInWith(t, b, "bob-key"), "held by another principal's run"},
		{"approver", signInWith(t, b, "approver-key"), "held by another principal's run"},
	} {
		p := tc.cl.get("/admin/connections/browsers")
		if got := text(p.doc.Find("#pool-leases tbody tr td").First()); got != tc.want {
			t.Errorf("%s sees the lease held by %q, want %q", tc.who, got, tc.want)
		}
		if tc.want != holder && strings.Contains(p.doc.Text(), holder) {
			t.Errorf("%s's page names the holder %s", tc.who, holder)
		}
	}
}
