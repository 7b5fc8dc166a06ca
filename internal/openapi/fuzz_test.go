package openapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/openapi/openapitest"
)

// fuzzBudget is small, so inputs the fuzzer grows hit it quickly.
var fuzzBudget = budget{nodes: 2000, bytes: 64 << 10, manifestBytes: 512 << 10, operations: 50}

// FuzzInline: any document is inlined within its budget or refused with a
// BudgetError, never a panic, in bounded time; every input schema it
// builds is within the budget, is JSON and compiles or is refused by the
// JSON Schema compiler (what gate 2 runs), without a panic.
func FuzzInline(f *testing.F) {
	for _, seed := range [][]byte{
		openapitest.FanOut(3, 6, 8),
		openapitest.FanOut(2, 40, 200),
		openapitest.Deep(12),
		openapitest.Flat(30),
		manyOps(3),
		[]byte(`{"openapi":"3.1.0","info":{"title":"t","version":"1"},"paths":{"/a":{"post":{"requestBody":{"content":{"application/json":{"schema":{"$ref":"#/components/schemas/A"}}}}}}},"components":{"schemas":{"A":{"$ref":"#/components/schemas/B"},"B":{"type":"object","nullable":true,"properties":{"a":{"$ref":"#/components/schemas/A","description":"again"},"b":{"items":[{"$ref":"#/components/schemas/B"}]},"c":{"allOf":[{"$ref":"#"},{"$ref":"other.json#/x"}]}}}}}}`),
		[]byte(`{"openapi":"3.0.3","info":{"title":"t","version":"1"},"paths":{"/p/{id}":{"parameters":[{"$ref":"#/components/parameters/id"}],"get":{"parameters":[{"name":"q","in":"query","content":{"application/json":{"schema":{"$ref":"#/components/schemas/Q"}}}}]}}},"components":{"parameters":{"id":{"name":"id","in":"path","schema":{"type":"integer","minimum":1,"exclusiveMinimum":true}}},"schemas":{"Q":{"oneOf":[{"type":"string"}],"nullable":true}}}}`),
	} {
		f.Add(seed)
	}
	for _, path := range []string{"testdata/shapes.yaml", "testdata/petstore3.yaml"} {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		start := time.Now()
		root, _, err := parseDocument(doc)
		if err != nil {
			return
		}
		ops, _, _, err := parseOperations(context.Background(), root, nil, fuzzBudget)
		var be *BudgetError
		if err != nil && !errors.As(err, &be) {
			return // a document the selector or paths refuse
		}
		for _, op := range ops {
			s := op.Spec.InputSchema
			if int64(len(s)) > fuzzBudget.bytes {
				t.Fatalf("%s: %d bytes, over the budget", op.Name, len(s))
			}
			v, err := jsonschema.UnmarshalJSON(bytes.NewReader(s))
			if err != nil {
				t.Fatalf("%s: not JSON: %v", op.Name, err)
			}
			var plain any
			_ = json.Unmarshal(s, &plain)
			if n := measure(plain); n > fuzzBudget.nodes {
				t.Fatalf("%s: %d values, over the budget", op.Name, n)
			}
			c := jsonschema.NewCompiler()
			if err := c.AddResource("mem://op", v); err != nil {
				t.Fatal(err)
			}
			_, _ = c.Compile("mem://op")
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("took %s", d)
		}
	})
}
