package api_test

import (
	"context"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestPoolStatusConforms: a pool connection's status carries its usage,
// on GET /v1/connections/{name} and GET /v1/harness/status, as
// openapi.yaml describes it.
func TestPoolStatusConforms(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, func(o *api.Options) {
		pool, err := pools.New(storetest.New(t), "browsers", 2, nil)
		must(t, err)
		if _, err := pool.Acquire(ctx, "ex_1/app/suite/0", 0); err != nil {
			t.Fatal(err)
		}
		prov, err := pools.NewProvider(pool, pools.ProviderOptions{Provision: func(context.Context, map[string]any) (harness.Conn, error) {
			return harness.NewMemory(harness.MemoryOp{Operation: harness.Operation{Name: "browser_navigate"}}), nil
		}})
		must(t, err)
		must(t, o.Registry.Add("browsers", prov))
		must(t, o.Registry.Start(ctx))
		t.Cleanup(func() { _ = o.Registry.Close() })
	})
	r := b.do(t, "GET", "/v1/connections/browsers", "", "")
	if r.status != 200 {
		t.Fatalf("GET connection = %d %s", r.status, r.body)
	}
	p, _ := r.json(t)["pool"].(map[string]any)
	leases, _ := p["leases"].([]any)
	if p["max"] != 2.0 || p["leased"] != 1.0 || len(leases) != 1 || leases[0].(map[string]any)["holder"] != "ex_1/app/suite/0" {
		t.Fatalf("pool = %v", p)
	}
	if r := b.do(t, "GET", "/v1/harness/status", "", ""); r.status != 200 {
		t.Fatalf("status = %d %s", r.status, r.body)
	}
}
