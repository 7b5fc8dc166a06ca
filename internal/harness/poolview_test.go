package harness_test

import (
	"context"
	"maps"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// PoolStatusFor names a lease's holder only to a principal that may see
// its execution; it leaves the shared status alone, and when owners
// cannot be read it names no one's.
func TestPoolStatusForHidesOthersHolders(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		reg := startRegistry(t, map[string]connect.Provider{"mem": connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})}, nil)
		execs := startWorkers(t, st, reg, 1, "test", `{"connections":{"mem":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		mine := submitAs(t, execs, "test", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"e","connection":"mem","op":"echo","args":{}}}`) + "/app"
		pool := &connect.PoolStatus{Max: 2, Leased: 2, Leases: []connect.PoolLease{{Holder: mine, Slot: 0}, {Holder: "ex_gone/app/0", Slot: 1}}}

		cases := []struct {
			name string
			ctx  context.Context
			p    authz.Principal
			want map[int]string
		}{
			{"its owner", context.Background(), authz.Principal{Name: "tester"}, map[int]string{0: mine, 1: ""}},
			{"another key", context.Background(), authz.Principal{Name: "bob"}, map[int]string{0: "", 1: ""}},
			{"read", context.Background(), authz.Principal{Name: "aud", Roles: []authz.Role{authz.Read}}, map[int]string{0: mine, 1: "ex_gone/app/0"}},
			{"owners unreadable", cancelled(), authz.Principal{Name: "tester"}, map[int]string{0: "", 1: ""}},
		}
		for _, tc := range cases {
			got := execs.PoolStatusFor(tc.ctx, pool, tc.p)
			seen := map[int]string{}
			for _, l := range got.Leases {
				seen[l.Slot] = l.Holder
			}
			if !maps.Equal(seen, tc.want) || got.Leased != 2 || got.Max != 2 {
				t.Errorf("%s sees %+v, want holders %v", tc.name, got, tc.want)
			}
		}
		if pool.Leases[0].Holder != mine || pool.Leases[1].Holder != "ex_gone/app/0" {
			t.Errorf("the shared status was changed: %+v", pool.Leases)
		}
	})
}

func cancelled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
