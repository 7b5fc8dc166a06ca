package web_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// TestStoreDownPage: with Redis out of reach, an admin page says so with
// 503 and Retry-After instead of "something went wrong".
func TestStoreDownPage(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := ln.Addr().String()
	_ = ln.Close()
	st := &store.Store{
		Client: redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1}),
		Prefix: storetest.Prefix(),
	}
	t.Cleanup(func() { _ = st.Close() })
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("mem", connecttest.NewMemory()))
	must(t, reg.Start(context.Background()))
	als := gates.NewAllowlists(st)
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: als})
	e := echo.New()
	must(t, web.Mount(e, web.Options{AdminToken: adminToken, Store: st, Executions: execs, Registry: reg, Allowlists: als}))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)

	req, err := http.NewRequest(http.MethodGet, srv.URL+"/admin/executions", nil)
	must(t, err)
	req.AddCookie(&http.Cookie{Name: "pb_admin", Value: "some-session"})
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("status %d, Retry-After %q, Content-Type %q", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Content-Type"))
	}
}
