package harness_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// fanOutSchema is an input schema as inlining $refs makes it: levels of
// width properties, each the same object below, width^levels leaves.
func fanOutSchema(levels, width int) json.RawMessage {
	s := `{"type":"string"}`
	for range levels {
		var b strings.Builder
		b.WriteString(`{"type":"object","properties":{`)
		for i := range width {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"p%d":%s`, i, s)
		}
		b.WriteString(`}}`)
		s = b.String()
	}
	return json.RawMessage(s)
}

// flatSchema has props distinct properties: nothing to share.
func flatSchema(props int) json.RawMessage {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range props {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"f%d":{"type":"integer","minimum":%d}`, i, i)
	}
	b.WriteString(`}}`)
	return json.RawMessage(b.String())
}

// Gate 2 with hostile schemas: an inlined fan-out of 3 levels of 40 (66 s
// to compile before its repeated subschemas were shared) checks calls, and
// a schema too large to check even so is refused at gate 2 naming the
// limit, within seconds, nothing sent.
func TestGate2HostileSchemas(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		mem := connecttest.NewMemory(
			connecttest.MemoryOp{Operation: connect.Operation{Name: "fan", InputSchema: fanOutSchema(3, 40)}},
			connecttest.MemoryOp{Operation: connect.Operation{Name: "flat", InputSchema: flatSchema(gates.DefaultSchemaMaxNodes)}},
		)
		reg := registry.NewRegistry(nil)
		must(t, reg.Add("svc", mem))
		must(t, reg.Start(context.Background()))
		execs := startWorkers(t, st, reg, 2, "ops", `{"connections":{"svc":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		g := gateBundle{execs: execs, mem: mem}

		start := time.Now()
		ex := g.run(t, callDoc("fan", `{"p0":{"p1":{"p2":"x"}}}`))
		if ex.Status != harness.ExecSucceeded {
			t.Fatalf("fan-out call: %s %+v", ex.Status, ex.Error)
		}
		t.Logf("3 levels of 40 inlined (%d bytes): checked and called in %s", len(fanOutSchema(3, 40)), time.Since(start))
		ex = g.run(t, callDoc("fan", `{"p0":{"p1":{"p2":5}}}`))
		if ex.Status != harness.ExecFailed || ex.Error.Gate != 2 || !strings.Contains(ex.Error.Message, "/p0/p1/p2") {
			t.Fatalf("a wrong leaf: %s %+v", ex.Status, ex.Error)
		}

		start = time.Now()
		ex = g.run(t, callDoc("flat", `{"f1":1}`))
		if ex.Status != harness.ExecFailed || ex.Error.Code != "steering_denied" || ex.Error.Gate != 2 ||
			!strings.Contains(ex.Error.Message, "too large to check") || !strings.Contains(ex.Error.Message, "PATCHBAY_SCHEMA_MAX_NODES") {
			t.Fatalf("a schema too large: %s %+v", ex.Status, ex.Error)
		}
		if took := time.Since(start); took > 6*time.Second {
			t.Fatalf("refused after %s", took)
		}
		if calls := mem.Calls(); len(calls) != 1 {
			t.Fatalf("the server got %d calls, want the one that passed", len(calls))
		}
	})
}
