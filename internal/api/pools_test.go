package api_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
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
		prov, err := pools.NewProvider(pool, pools.ProviderOptions{Provision: func(context.Context, map[string]any) (connect.Conn, error) {
			return connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "browser_navigate"}}), nil
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

// TestPoolHoldersFollowOwnership: a pool's status names a lease's holder
// (an execution) only to a key that may see that execution — the key that
// started it, or one with read; to other keys the lease shows as held,
// with its slot and ages and no holder. Both connection routes agree.
func TestPoolHoldersFollowOwnership(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var pool *pools.Pool
	b := setup(t, func(o *api.Options) {
		var err error
		pool, err = pools.New(storetest.New(t), "browsers", 4, nil)
		must(t, err)
		prov, err := pools.NewProvider(pool, pools.ProviderOptions{RefreshEvery: 20 * time.Millisecond,
			Provision: func(context.Context, map[string]any) (connect.Conn, error) {
				return connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "browser_navigate"}}), nil
			}})
		must(t, err)
		must(t, o.Registry.Add("browsers", prov))
		must(t, o.Registry.Start(ctx))
		t.Cleanup(func() { _ = o.Registry.Close() })
	})
	// The keys' allowlist grants the pool, so every key sees the connection.
	if r := b.do(t, "PUT", "/v1/allowlists/test", "application/json", `{"connections":{"mem":{"ops":["*"]},"browsers":{"ops":["*"]}}}`); r.status != 200 {
		t.Fatalf("PUT allowlist = %d %s", r.status, r.body)
	}
	run := `{"workflow":` + hello + `,"input":{"x":1},"wait":"10s"}`
	alices := b.submitAs(t, "alice-key", run) + "/app"
	bobs := b.submitAs(t, "bob-key", run) + "/app"
	gone := "ex_gone/app" // an execution that no longer exists: no one's
	slot := map[string]int{}
	for _, holder := range []string{alices, bobs, gone} {
		l, err := pool.Acquire(ctx, holder, 0)
		if err != nil {
			t.Fatal(err)
		}
		slot[holder] = l.Slot
	}
	// shown is what a key should see: each lease by its slot, with its
	// holder where visible and "" where it is only held.
	shown := func(visible ...string) map[int]string {
		m := map[int]string{}
		for holder, s := range slot {
			m[s] = ""
			if slices.Contains(visible, holder) {
				m[s] = holder
			}
		}
		return m
	}

	cases := []struct {
		who, key string
		want     map[int]string
	}{
		{"owner", "alice-key", shown(alices)},
		{"other", "bob-key", shown(bobs)},
		{"read", "auditor-key", shown(alices, bobs, gone)},
		{"approve", "approver-key", shown()},
		{"admin", testKey, shown(alices, bobs, gone)},
	}
	for _, tc := range cases {
		t.Run(tc.who, func(t *testing.T) {
			got := map[string]map[int]string{}
			waitUntil(t, "three leases in the pool's status", func() bool {
				one := b.do(t, "GET", "/v1/connections/browsers", "", "", "Authorization", "Bearer "+tc.key)
				list := b.do(t, "GET", "/v1/connections", "", "", "Authorization", "Bearer "+tc.key)
				if one.status != 200 || list.status != 200 {
					t.Fatalf("GET as %s = %d, %d: %s %s", tc.who, one.status, list.status, one.body, list.body)
				}
				got["GET /v1/connections/browsers"] = holders(t, one.json(t)["pool"])
				for _, it := range list.json(t)["items"].([]any) {
					if c := it.(map[string]any); c["name"] == "browsers" {
						got["GET /v1/connections"] = holders(t, c["pool"])
					}
				}
				return len(got["GET /v1/connections/browsers"]) == 3 && len(got["GET /v1/connections"]) == 3
			})
			for route, hs := range got {
				if !maps.Equal(hs, tc.want) {
					t.Errorf("%s as %s shows holders by slot %v, want %v", route, tc.who, hs, tc.want)
				}
			}
		})
	}
}

// holders are the holder of each lease of a pool status by its slot, ""
// where none is shown.
func holders(t *testing.T, pool any) map[int]string {
	t.Helper()
	p, ok := pool.(map[string]any)
	if !ok {
		t.Fatalf("pool = %v", pool)
	}
	out := map[int]string{}
	for _, l := range p["leases"].([]any) {
		lease := l.(map[string]any)
		s, ok := lease["slot"].(float64)
		if !ok {
			t.Fatalf("a lease without its slot: %v", lease)
		}
		h, _ := lease["holder"].(string)
		out[int(s)] = h
	}
	return out
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
