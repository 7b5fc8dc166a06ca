package harness

import (
	"context"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// BenchmarkCallStep measures one call step through the harness against the
// in-memory connection: argument expressions evaluated, the registry looked
// up, gates 1–6 passed, the ledger entry written (miniredis) and the call
// sent.
func BenchmarkCallStep(b *testing.B) {
	reg, _ := testRegistry(b)
	doc, err := document.ParseDocument([]byte(`{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":{"$expr":"$input.x"},"b":2}}}`), reg, "")
	if err != nil {
		b.Fatal(err)
	}
	// On the real Redis when PATCHBAY_TEST_REDIS_URL is set: the ledger's
	// cost per step (the pending and done writes) is what this measures.
	e := NewExecutions(storetest.New(b), reg, nil)
	ctx := context.Background()
	epoch, err := e.claim(ctx, "ex_bench", "bench")
	if err != nil {
		b.Fatal(err)
	}
	r := &run{e: e, rec: &record{Execution: Execution{ID: "ex_bench", Input: map[string]any{"x": 1.0}}}, epoch: epoch}
	f := &frame{steps: map[string]any{}}
	b.ReportAllocs()
	for b.Loop() {
		r.rec.Steps = r.rec.Steps[:0]
		if _, err := r.call(ctx, f, doc.Root); err != nil {
			b.Fatal(err)
		}
	}
}
