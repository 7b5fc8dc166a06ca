package harness_test

import (
	"reflect"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/mcp"
)

// TestToolIDsMatchMCP: the harness names tools by the rule internal/mcp
// documents (the algorithm is copied, since mcp imports the harness).
func TestToolIDsMatchMCP(t *testing.T) {
	t.Parallel()
	tests := [][]string{
		{"echo", "add"},
		{"ui.tap", "ui_tap", "ui-tap"},
		{"a.b", "a_b", "a.b"},
		{"weird name/with spaces", "ok"},
		{string(make([]byte, 200))},
	}
	for _, ops := range tests {
		if got, want := harness.ToolIDs("gh", ops), mcp.ToolIDs("gh", ops); !reflect.DeepEqual(got, want) {
			t.Errorf("ToolIDs(%q) = %v, mcp says %v", ops, got, want)
		}
	}
}
