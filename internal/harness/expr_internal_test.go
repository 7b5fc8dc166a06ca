package harness

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// TestExpressionStopsWithItsPath: an argument expression evaluated in a
// frame whose context is cancelled (a parallel path that lost an "any"
// race, or an execution cancelled) stops within milliseconds; one past
// its limits fails naming the limit.
func TestExpressionStopsWithItsPath(t *testing.T) {
	t.Parallel()
	reg, _ := testRegistry(t)
	parse := func(src string) document.Value {
		doc := []byte(`{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"echo","args":{"v":{"$expr":` + quote(src) + `}}}}`)
		parsed, err := document.ParseDocument(doc, reg, "")
		if err != nil {
			t.Fatal(err)
		}
		return document.Object(parsed.Root.Args)
	}
	r := &run{e: &Executions{}, rec: &record{Execution: Execution{Input: map[string]any{"s": strings.Repeat("x", 600_000)}}}}

	ctx, cancel := context.WithCancel(context.Background())
	f := (&frame{steps: map[string]any{}}).child("")
	f.ctx = ctx
	time.AfterFunc(10*time.Millisecond, cancel)
	start := time.Now()
	_, err := parse(`let r = 1..2000; sum(r, sum(r, sum(r, 1)))`).Eval(r.scope(f))
	if took := time.Since(start); !errors.Is(err, context.Canceled) || took > 500*time.Millisecond { // generous for -race on a loaded machine; the time limit is 1 s
		t.Fatalf("cancelled at 10ms: stopped after %s with %v", took, err)
	}

	_, err = parse(`string(len(repeat($input.s, 1000000)))`).Eval(r.scope(&frame{steps: map[string]any{}}))
	var ee *document.ExprError
	if !errors.As(err, &ee) || !errors.Is(err, sandbox.ErrLimit) || !strings.Contains(err.Error(), "memory limit") {
		t.Fatalf("the report's attack: %v", err)
	}
}
