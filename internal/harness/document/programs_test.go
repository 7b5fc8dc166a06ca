package document

import (
	"context"
	"fmt"
	"testing"
)

// TestCompiledOnce: an expression is compiled once and its program shared
// by every document and run; failures are not kept; the cache stays
// within its bound.
func TestCompiledOnce(t *testing.T) {
	src := "$input.a + 1 // TestCompiledOnce"
	a, err := compile(src)
	if err != nil {
		t.Fatal(err)
	}
	b, err := compile(src)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatal("the same source compiled twice")
	}
	for _, in := range []float64{1, 41} {
		got, err := b.Run(context.Background(), map[string]any{"$input": map[string]any{"a": in}})
		if err != nil || got != in+1 {
			t.Fatalf("shared program run on %v = %v, %v", in, got, err)
		}
	}

	if _, err := compile("$input.a +"); err == nil {
		t.Fatal("a broken expression compiled")
	}
	programs.RLock()
	_, kept := programs.m["$input.a +"]
	programs.RUnlock()
	if kept {
		t.Fatal("a failed compile was kept")
	}

	for i := range maxPrograms + 10 {
		if _, err := compile(fmt.Sprintf("%d + 1", i)); err != nil {
			t.Fatal(err)
		}
	}
	programs.RLock()
	n := len(programs.m)
	programs.RUnlock()
	if n > maxPrograms {
		t.Fatalf("%d programs kept, bound %d", n, maxPrograms)
	}
}
