package mcpserver_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// setupPool serves /mcp over one pool, "browsers", whose every lease is a
// new connection answering whoami with its own number.
func setupPool(t *testing.T) (*bundle, *pools.Pool) {
	t.Helper()
	st := storetest.New(t)
	pool, err := pools.New(st, "browsers", 4, &pools.Options{ReclaimAfter: 2 * time.Second})
	must(t, err)
	var made atomic.Int64
	provision := func(context.Context, map[string]any) (connect.Conn, error) {
		n := made.Add(1)
		return connecttest.NewMemory(connecttest.MemoryOp{
			Operation: connect.Operation{Name: "whoami", InputSchema: json.RawMessage(`{"type":"object"}`)},
			Fn:        func(context.Context, map[string]any) (any, error) { return fmt.Sprintf("browser %d", n), nil },
		}), nil
	}
	prov, err := pools.NewProvider(pool, pools.ProviderOptions{Wait: 5 * time.Second, Provision: provision, RefreshEvery: 50 * time.Millisecond})
	must(t, err)
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("browsers", prov))
	must(t, reg.Start(context.Background()))
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("wide", []byte(`{"connections":{"browsers":{"ops":["*"]}}}`))
	must(t, err)
	_, err = als.Put(context.Background(), al, "setup")
	must(t, err)
	b := &bundle{als: als}
	b.execs = harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: als})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = b.execs.Run(ctx, 4); close(done) }()
	b.face = mcpserver.New(mcpserver.Options{Engine: b.execs, ListCheck: 100 * time.Millisecond})
	go b.face.Watch(ctx)
	keys := []api.Key{{SHA256: sha256.Sum256([]byte(aliceKey)), Principal: authz.Principal{Name: "alice", Allowlist: "wide"}}}
	srv := httptest.NewServer(api.New(api.Options{Executions: b.execs, Registry: reg, Allowlists: als, APIKeys: keys, MCP: b.face}))
	t.Cleanup(func() {
		srv.Close()
		cancel()
		<-done
		_ = reg.Close()
	})
	b.url = srv.URL
	return b, pool
}

func whoami(t *testing.T, cs *sdk.ClientSession) string {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "browsers_whoami", Arguments: map[string]any{}})
	must(t, err)
	if res.IsError {
		t.Fatalf("whoami = %s", text(res))
	}
	return text(res)
}

func leased(t *testing.T, pool *pools.Pool) int {
	t.Helper()
	u, err := pool.Status(t.Context())
	must(t, err)
	return u.Leased
}

// TestASessionHoldsItsLease: a 2025-era session's calls land on one
// leased connection, held (renewed) between them past the reclaim window
// and never shared with another session, and given back when the session
// ends; a 2026-era caller, without a session, leases per call.
func TestASessionHoldsItsLease(t *testing.T) {
	t.Parallel()
	b, pool := setupPool(t)

	one := dial(t, b, aliceKey, "2025-11-25", nil)
	first := whoami(t, one)
	time.Sleep(3 * time.Second) // past the 2 s reclaim window: renewed by the session
	if again := whoami(t, one); again != first {
		t.Errorf("the session's second call ran on %q, its first on %q: want one lease", again, first)
	}
	two := dial(t, b, aliceKey, "2025-11-25", nil)
	if other := whoami(t, two); other == first {
		t.Errorf("another session got the first session's connection (%s)", other)
	}
	if n := leased(t, pool); n != 2 {
		t.Errorf("leased = %d with two sessions between calls, want 2", n)
	}
	must(t, one.Close()) // DELETE /mcp ends the session
	must(t, two.Close())
	deadline := time.Now().Add(5 * time.Second)
	for leased(t, pool) != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := leased(t, pool); n != 0 {
		t.Errorf("leased = %d after the sessions ended, want 0", n)
	}

	modern := dial(t, b, aliceKey, "2026-07-28", nil)
	a, c := whoami(t, modern), whoami(t, modern)
	if a == c || !strings.HasPrefix(a, "browser ") {
		t.Errorf("2026-era calls ran on %q and %q: want a fresh lease each", a, c)
	}
	if n := leased(t, pool); n != 0 {
		t.Errorf("leased = %d after 2026-era calls, want 0 (given back per call)", n)
	}
}
