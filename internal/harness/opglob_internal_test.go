package harness

import (
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/document"
)

// TestMatchOp: '/' in an operation name is an ordinary character, so "*"
// denies or grants OpenAPI operations such as issues/create too.
func TestMatchOp(t *testing.T) {
	t.Parallel()
	tests := []struct {
		glob, op string
		want     bool
	}{
		{"*", "issues/create", true},
		{"*", "note_get", true},
		{"issues*", "issues/list-for-repo", true},
		{"issues/*", "issues/create", true},
		{"pulls/*", "issues/create", false},
		{"ui.*", "ui.tap", true},
		{"issues/get", "issues/create", false},
	}
	for _, tt := range tests {
		if got := document.MatchOp([]string{tt.glob}, tt.op); got != tt.want {
			t.Errorf("matchOp(%q, %q) = %v, want %v", tt.glob, tt.op, got, tt.want)
		}
	}
}
