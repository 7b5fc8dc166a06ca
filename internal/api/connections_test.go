package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// bigSchema is an input schema of about n bytes.
func bigSchema(n int) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"type":"object","description":%q}`, strings.Repeat("d", n)))
}

// A connection's detail stays small whatever its operations' schemas: a
// schema over 64 KiB, or past 1 MiB for all, is left out with its size,
// and the operation's own route answers it whole, slashes in its name
// and all.
func TestConnectionDetailStaysSmall(t *testing.T) {
	t.Parallel()
	var ops []connecttest.MemoryOp
	ops = append(ops, connecttest.MemoryOp{Operation: connect.Operation{Name: "huge/one", InputSchema: bigSchema(2 << 20)}})
	for i := range 40 {
		ops = append(ops, connecttest.MemoryOp{Operation: connect.Operation{Name: fmt.Sprintf("mid/%d", i), InputSchema: bigSchema(60 << 10)}})
	}
	ops = append(ops, connecttest.MemoryOp{Operation: connect.Operation{Name: "small", InputSchema: json.RawMessage(`{"type":"object"}`)}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("wide", connecttest.NewMemory(ops...)))
	must(t, reg.Start(context.Background()))
	b := setup(t, func(o *api.Options) { o.Registry = reg })

	r := b.do(t, "GET", "/v1/connections/wide", "", "")
	if r.status != 200 {
		t.Fatalf("GET = %d %s", r.status, r.body)
	}
	if len(r.body) > 1<<20+64<<10 {
		t.Fatalf("the detail is %d bytes", len(r.body))
	}
	var detail struct {
		Operations []struct {
			Name             string          `json:"name"`
			InputSchema      json.RawMessage `json:"inputSchema"`
			InputSchemaBytes int             `json:"inputSchemaBytes"`
		} `json:"operations"`
	}
	must(t, json.Unmarshal(r.body, &detail))
	inlined, left := 0, 0
	for _, op := range detail.Operations {
		switch {
		case op.InputSchema != nil && op.InputSchemaBytes == 0:
			inlined++
		case op.InputSchema == nil && op.InputSchemaBytes > 0:
			left++
		default:
			t.Fatalf("%s: schema %d bytes and inputSchemaBytes %d", op.Name, len(op.InputSchema), op.InputSchemaBytes)
		}
	}
	// huge/one is over 64 KiB; 17 of the 60 KiB ones fit in 1 MiB, and
	// small after them.
	if detail.Operations[0].InputSchemaBytes != len(bigSchema(2<<20)) || inlined != 18 || left != 24 {
		t.Fatalf("inlined %d, left out %d (first: %d bytes)", inlined, left, detail.Operations[0].InputSchemaBytes)
	}
	t.Logf("detail of 42 operations with %d MiB of schemas: %d bytes", (2<<20+40*60<<10)>>20, len(r.body))

	// The spec's router takes no slash in {op}; the route does.
	req, _ := http.NewRequest("GET", b.url+"/v1/connections/wide/operations/huge/one", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	var op connect.Operation
	must(t, json.NewDecoder(resp.Body).Decode(&op))
	if resp.StatusCode != 200 || op.Name != "huge/one" || len(op.InputSchema) != len(bigSchema(2<<20)) {
		t.Fatalf("GET operation = %d, %s with %d bytes", resp.StatusCode, op.Name, len(op.InputSchema))
	}
	if r = b.do(t, "GET", "/v1/connections/wide/operations/mid%2F3", "", ""); r.status != 200 {
		t.Fatalf("GET an escaped name = %d %s", r.status, r.body)
	}
}
