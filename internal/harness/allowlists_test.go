package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestAllowlistChangesApplyAtOnce: submits are checked against copies of
// their allowlist, and a change drops the copies — at once in the process
// that made it, and in another process as soon as the change's
// announcement arrives, well before the copies' own time bound.
func TestAllowlistChangesApplyAtOnce(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		reg := registry.NewRegistry(nil)
		must(t, reg.Add("x", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})))
		must(t, reg.Start(context.Background()))
		// Two processes over one Redis, each with its own allowlist store.
		var procs [2]struct {
			lists *gates.Allowlists
			execs *harness.Executions
		}
		for i := range procs {
			procs[i].lists = gates.NewAllowlists(st)
			procs[i].execs = harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: procs[i].lists})
		}
		put := func(p int, body string) {
			t.Helper()
			al, err := gates.ParseAllowlist("team", []byte(body))
			must(t, err)
			_, err = procs[p].lists.Put(context.Background(), al, "tester")
			must(t, err)
		}
		doc := json.RawMessage(`{"version":1,"connections":{"x":{}},"root":{"kind":"call","id":"c","connection":"x","op":"echo","args":{}}}`)
		submit := func(p int) error {
			_, err := procs[p].execs.Submit(mark(context.Background()), harness.Request{Workflow: doc, Allowlist: "team"})
			return err
		}
		refused := func(err error) bool {
			var ve *fault.ValidationError
			return errors.As(err, &ve) && ve.Code() == gates.CodeConnectionNotAllowed
		}
		const grant, revoke = `{"connections":{"x":{"ops":["*"]}}}`, `{"connections":{}}`

		reads := &readsOf{id: "allowlist:team"}
		st.Client.AddHook(reads)
		copied := func(p int) func() bool { // p's submits stop reading the allowlist
			return func() bool {
				must(t, submit(p))
				n := len(reads.seen())
				must(t, submit(p))
				return len(reads.seen()) == n
			}
		}
		put(0, grant)
		waitFor(t, "the first process to keep a copy", copied(0))
		waitFor(t, "the second process to keep a copy", copied(1))

		put(0, revoke)
		if err := submit(0); !refused(err) {
			t.Fatalf("right after its own change, the process that made it submitted with %v, want a refusal", err)
		}
		changed := time.Now()
		waitFor(t, "the other process to hear of the change", func() bool { return refused(submit(1)) })
		if took := time.Since(changed); took > 500*time.Millisecond {
			t.Errorf("the other process kept its copy for %s after the change, want it dropped by the announcement", took)
		}

		put(1, grant)
		must(t, submit(1))
		waitFor(t, "the first process to hear of the grant", func() bool { return submit(0) == nil })
	})
}
