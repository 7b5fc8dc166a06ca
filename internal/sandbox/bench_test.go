package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/expr-lang/expr"
)

// BenchmarkRun: what the limits cost an ordinary expression, against
// expr-lang run bare.
func BenchmarkRun(b *testing.B) {
	const src = `$input.a + 1 > 2 && "x" + $input.s in $input.tags`
	env := map[string]any{"$input": map[string]any{"a": 2.0, "s": "y", "tags": []any{"xy"}}}
	b.Run("sandbox", func(b *testing.B) {
		p, err := Compile(src, testTypes)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := p.Run(context.Background(), env); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare", func(b *testing.B) {
		p, err := expr.Compile(src, expr.Env(testTypes))
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := expr.Run(p, env); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkHostileExpressions: how long each hostile expression runs
// before its limit refuses it (the within column of hostile is this, on a
// quiet machine).
func BenchmarkHostileExpressions(b *testing.B) {
	env := attack()
	for _, tc := range hostile {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				p, err := Compile(tc.src, testTypes)
				if err == nil {
					_, err = p.Run(context.Background(), env)
				}
				if !errors.Is(err, ErrLimit) {
					b.Fatalf("error = %v, want a limit", err)
				}
			}
		})
	}
}
