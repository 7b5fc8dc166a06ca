package gates

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// slowBuild stands in a compile that blocks until released, counting how
// often it ran.
type slowBuild struct {
	runs    atomic.Int64
	started chan struct{}
	release chan struct{}
}

func newSlowBuild() *slowBuild {
	return &slowBuild{started: make(chan struct{}, 16), release: make(chan struct{})}
}

func (b *slowBuild) build(string, connect.Operation) compiled {
	b.runs.Add(1)
	b.started <- struct{}{}
	<-b.release
	return compiled{}
}

// A call waits for its schema no longer than its context or the compile
// timeout; calls waiting meanwhile share the one compile, and once it
// finishes every later call gets it from the cache at once.
func TestSchemaWaitIsBounded(t *testing.T) {
	t.Parallel()
	b := newSlowBuild()
	s := &schemas{timeout: 200 * time.Millisecond, build: b.build}
	op := connect.Operation{Name: "op", InputSchema: json.RawMessage(`{}`)}

	ctx, cancel := context.WithCancel(t.Context())
	errs := make(chan error, 1)
	start := time.Now()
	go func() { _, err := s.get(ctx, "c", "i", op); errs <- err }()
	<-b.started
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}

	_, err := s.get(t.Context(), "c", "i", op)
	if !errors.Is(err, errSchemaTimeout) || !strings.Contains(err.Error(), "PATCHBAY_SCHEMA_COMPILE_TIMEOUT") {
		t.Fatalf("timed-out wait: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("two bounded waits took %s", took)
	}
	if n := b.runs.Load(); n != 1 {
		t.Fatalf("the schema was compiled %d times while one compile ran", n)
	}

	close(b.release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := s.get(t.Context(), "c", "i", op)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the finished compile is not used: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := b.runs.Load(); n != 1 {
		t.Fatalf("compiled %d times", n)
	}
}

// inlinedFanOut is what inlining refs makes of width properties that
// each $ref width properties … levels deep: width^levels leaves.
func inlinedFanOut(levels, width int) any {
	var s any = map[string]any{"type": "string", "minLength": json.Number("1")}
	for range levels {
		props := map[string]any{}
		for i := range width {
			props[fmt.Sprintf("p%d", i)] = s
		}
		s = map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	}
	return s
}

// Sharing repeated subschemas keeps what a schema accepts and refuses
// (checked on instances that pass, fail deep inside, and fail at the
// top), shrinks an inlined fan-out to a few values, and leaves alone what
// it cannot safely touch.
func TestShareSubschemas(t *testing.T) {
	t.Parallel()
	fan := roundTrip(t, inlinedFanOut(3, 12))
	shared, n, ok := shareSubschemas(fan)
	if !ok || n > 150 {
		t.Fatalf("shared = %v, %d values (from %d)", ok, n, countValues(fan))
	}
	instances := []string{
		`{"p0":{"p1":{"p2":"x"}}}`,
		`{"p0":{"p1":{"p2":""}}}`,
		`{"p0":{"p1":{"p2":5}}}`,
		`{"p0":{"p1":{"zz":"x"}}}`,
		`{"p11":{"p11":{"p11":"y"}},"p3":{}}`,
		`{"q":1}`,
		`[]`,
	}
	for _, in := range instances {
		want, got := validates(t, fan, in), validates(t, shared, in)
		if want != got {
			t.Errorf("%s: shared says %v, the schema as given %v", in, got, want)
		}
	}
	// Combinators and tuples share too, and still judge alike.
	combo := roundTrip(t, map[string]any{
		"anyOf":       []any{inlinedFanOut(2, 4), inlinedFanOut(2, 4), map[string]any{"type": "integer"}},
		"prefixItems": []any{inlinedFanOut(1, 3), inlinedFanOut(1, 3)},
		"$defs":       map[string]any{"kept": map[string]any{"type": "null"}},
	})
	sharedCombo, _, ok := shareSubschemas(combo)
	if !ok {
		t.Fatal("combinators not shared")
	}
	if _, kept := sharedCombo.(map[string]any)["$defs"].(map[string]any)["kept"]; !kept {
		t.Fatal("the schema's own $defs were dropped")
	}
	for _, in := range []string{`{"p0":{"p0":"a"}}`, `{"p0":{"p0":""}}`, `7`, `"s"`, `[{"p0":"a"},{"p1":"b"}]`, `[{"p0":1}]`} {
		if want, got := validates(t, combo, in), validates(t, sharedCombo, in); want != got {
			t.Errorf("%s: shared says %v, the schema as given %v", in, got, want)
		}
	}
	for name, s := range map[string]any{
		"a $ref inside":     map[string]any{"properties": map[string]any{"a": map[string]any{"$ref": "#/$defs/x"}, "b": inlinedFanOut(2, 3)}, "$defs": map[string]any{"x": map[string]any{}}},
		"an older $schema":  map[string]any{"$schema": "http://json-schema.org/draft-07/schema#", "properties": map[string]any{"a": inlinedFanOut(2, 3), "b": inlinedFanOut(2, 3)}},
		"an $id below":      map[string]any{"properties": map[string]any{"a": map[string]any{"$id": "x", "properties": map[string]any{"b": inlinedFanOut(2, 3), "c": inlinedFanOut(2, 3)}}}},
		"nothing repeated":  map[string]any{"properties": map[string]any{"a": map[string]any{"type": "string"}}},
		"not an object":     true,
		"$defs not a map":   map[string]any{"$defs": 1, "properties": map[string]any{"a": inlinedFanOut(2, 3), "b": inlinedFanOut(2, 3)}},
		"a name like ours":  map[string]any{"$defs": map[string]any{sharedPrefix + "0": true}, "properties": map[string]any{"a": inlinedFanOut(2, 3), "b": inlinedFanOut(2, 3)}},
		"$anchor somewhere": map[string]any{"properties": map[string]any{"a": inlinedFanOut(2, 3), "b": inlinedFanOut(2, 3), "c": map[string]any{"$anchor": "c"}}},
	} {
		if _, _, ok := shareSubschemas(roundTrip(t, s)); ok {
			t.Errorf("%s: shared", name)
		}
	}
}

// roundTrip turns v into what the compiler reads (json.Number numbers).
func roundTrip(t *testing.T, v any) any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func validates(t *testing.T, schema any, instance string) bool {
	t.Helper()
	c := jsonschema.NewCompiler()
	if err := c.AddResource("mem://s", schema); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("mem://s")
	if err != nil {
		t.Fatal(err)
	}
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(instance))
	if err != nil {
		t.Fatal(err)
	}
	return sch.Validate(v) == nil
}
