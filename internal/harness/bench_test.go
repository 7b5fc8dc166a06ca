package harness

import (
	"context"
	"testing"
)

// BenchmarkCallStep measures one call step through the harness against the
// in-memory connection: argument expressions evaluated, the registry looked
// up, the call sent and its result taken; storage is left out.
func BenchmarkCallStep(b *testing.B) {
	reg, _ := testRegistry(b)
	doc, err := ParseDocument([]byte(`{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":{"$expr":"$input.x"},"b":2}}}`), reg, "")
	if err != nil {
		b.Fatal(err)
	}
	r := &run{e: &Executions{reg: reg}, rec: &record{Execution: Execution{ID: "ex_bench", Input: map[string]any{"x": 1.0}}}, steps: map[string]any{}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.send(ctx, doc.Root); err != nil {
			b.Fatal(err)
		}
	}
}
