package config_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// TestTriggerExpressionLimits: trigger expressions compile and run through
// the same sandbox as a document's, under the same limits.
func TestTriggerExpressionLimits(t *testing.T) {
	t.Parallel()
	if _, err := config.CompileExpr(strings.Repeat("(", 65) + "1" + strings.Repeat(")", 65)); !errors.Is(err, sandbox.ErrLimit) || !strings.Contains(err.Error(), "nesting depth") {
		t.Errorf("deep filter: %v", err)
	}
	p, err := config.CompileExpr(`len(repeat(event.payload.s, 1000000)) > 0`)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]any{"event": map[string]any{"payload": map[string]any{"s": strings.Repeat("x", 600_000)}}}
	if _, err := p.Run(context.Background(), env); !errors.Is(err, sandbox.ErrLimit) || !strings.Contains(err.Error(), "memory limit") {
		t.Errorf("hostile filter: %v", err)
	}
	p, err = config.CompileExpr(`event.payload.s + "!"`)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := p.Run(context.Background(), env); err != nil || len(out.(string)) != 600_001 {
		t.Errorf("ordinary filter: %v", err)
	}
}
