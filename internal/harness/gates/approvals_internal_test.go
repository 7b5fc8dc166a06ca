package gates

import (
	"fmt"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// One key's approval older than 250 of another key's must still be in its
// list: the filter runs before the limit, not on everyone's newest.
func TestListWhereFiltersBeforeTheLimit(t *testing.T) {
	t.Parallel()
	a := &Approvals{store: storetest.NewEmbedded(t)}
	start := time.Now().Add(-time.Hour)
	add := func(id, by string, at time.Time) {
		t.Helper()
		ap := &Approval{ID: id, State: ApprovalPending, Execution: "ex_" + id, Connection: "c", Op: "op",
			RequestedBy: by, CreatedAt: at, ExpiresAt: at.Add(24 * time.Hour)}
		if _, err := a.Request(t.Context(), ap); err != nil {
			t.Fatal(err)
		}
	}
	add("ap_alice", "alice", start)
	for i := range 250 {
		add(fmt.Sprintf("ap_bob%03d", i), "bob", start.Add(time.Duration(i+1)*time.Second))
	}
	byAlice := func(ap *Approval) bool { return ap.RequestedBy == "alice" }
	got, err := a.ListWhere(t.Context(), ApprovalPending, 200, byAlice)
	if err != nil || len(got) != 1 || got[0].ID != "ap_alice" {
		t.Fatalf("alice's list = %v, %v; want her one approval", got, err)
	}
	all, err := a.ListWhere(t.Context(), "", 200, nil)
	if err != nil || len(all) != 200 || all[0].ID != "ap_bob249" {
		t.Fatalf("unfiltered list: %d items, %v; want the newest 200", len(all), err)
	}
}
