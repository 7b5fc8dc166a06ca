package harness

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// FuzzParseDocument: any bytes parse or fail with a ValidationError, never
// a panic, in bounded time.
func FuzzParseDocument(f *testing.F) {
	for _, seed := range []string{
		`{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":{"$expr":"$input.x"}}}}`,
		`{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"m","steps":[{"add":{"a":1}},{"kind":"verify","id":"v","of":"@/root/steps/0","claims":[{"equals":1,"at":"sum"}]}]}}`,
		`{"version":1,"connections":{"mem":{}},"root":{"kind":"parallel","id":"p","over":["mem"],"steps":[{"echo":{"x":{"$secret":"s"}}}],"merge":"$results"}}`,
		`{"version":1,"root":{"kind":"parallel","id":"p","paths":[[{"kind":"call"}]]}}`,
		`[]`, `{`, `null`,
	} {
		f.Add([]byte(seed))
	}
	reg, _ := testRegistry(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		doc, err := document.ParseDocument(data, reg, "")
		if err == nil && doc == nil {
			t.Fatal("nil document without an error")
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("parsing took %s", d)
		}
	})
}

// FuzzExpression: any expression compiles or is refused, and evaluates or
// fails, without a panic and within the sandbox's bounds: at most
// sandbox.MaxDuration (plus scheduling slack) and fuzzAllocBound bytes
// allocated, garbage included, per input. The seeds are the hostile
// expressions of sandbox's tests, so mutations start from the attacks.
func FuzzExpression(f *testing.F) {
	for _, seed := range []string{
		`$input.a + 1`, `map($steps.a.tags, # + "x")`, `$input[0]`, `repeat("x", 1000000)`, `1..1000000`, `$item + $subject`,
		`string(len(repeat($input.a, 1000000)))`, `repeat(repeat(repeat("ab", 1000), 1000), 1000)`,
		`reduce(1..64, #acc + #acc, $input.a)`, `let r = 1..2000; sum(r, sum(r, sum(r, 1)))`,
		`let r = 1..20000; count(r, # in r)`, `len(join(map(1..1000, repeat("x", 100000)), ","))`,
		`toJSON(map(1..100, repeat("x", 100000)))`, `replace(repeat("x", 100000), "", "yy")`,
		`len(reduce(1..40, concat(#acc, #acc), [1]))`, `$input.a matches repeat("(a|b)*", 20)`,
		`count(1..100000, repeat("01", 100000) matches "(a|b)*c")`, `fromJSON("[" + repeat("[", 100) + "]")`,
	} {
		f.Add(seed, `{"a": 2, "tags": ["x"]}`)
	}
	reg, _ := testRegistry(f)
	f.Fuzz(func(t *testing.T, src, input string) {
		doc := []byte(`{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"echo","args":{"v":{"$expr":` + quote(src) + `}}}}`)
		parsed, err := document.ParseDocument(doc, reg, "")
		if err != nil {
			return
		}
		r := &run{e: &Executions{}, rec: &record{Execution: Execution{Input: map[string]any{"a": input}}}}
		bound := sandbox.MaxDuration + time.Second
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = document.Object(parsed.Root.Args).Eval(r.scope(&frame{steps: map[string]any{"a": map[string]any{"tags": []any{"x"}}}}))
		}()
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatalf("expression %q ran longer than %s", src, bound)
		}
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > fuzzAllocBound {
			t.Fatalf("expression %q allocated %d MiB, bound %d MiB", src, n>>20, fuzzAllocBound>>20)
		}
	})
}

// fuzzAllocBound is what one evaluation may allocate in all, garbage
// included: the sandbox's 32 MiB of strings and 500,000 elements, charged
// before they are allocated, and what a million steps cost the VM.
const fuzzAllocBound = 256 << 20

func quote(s string) string {
	out := []byte{'"'}
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			out = append(out, '\\', byte(r))
		case r < 0x20:
			out = append(out, []byte(`\u00`)...)
			out = append(out, "0123456789abcdef"[r>>4], "0123456789abcdef"[r&15])
		default:
			out = append(out, string(r)...)
		}
	}
	return string(append(out, '"'))
}
