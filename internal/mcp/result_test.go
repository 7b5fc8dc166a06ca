package mcp

import (
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
)

func TestResultValue(t *testing.T) {
	t.Parallel()
	text := func(s string) mcp.Content { return mcp.NewTextContent(s) }
	tests := []struct {
		name string
		res  mcp.CallToolResult
		want any
	}{
		{"structured from the wire wins over text",
			mcp.CallToolResult{RawStructuredContent: json.RawMessage(`{"n":1,"l":[true]}`), Content: []mcp.Content{text(`"other"`)}},
			map[string]any{"n": 1.0, "l": []any{true}}},
		{"structured built in process",
			mcp.CallToolResult{StructuredContent: map[string]int{"n": 1}},
			map[string]any{"n": 1.0}},
		{"structured null falls back to text",
			mcp.CallToolResult{RawStructuredContent: json.RawMessage(`null`), Content: []mcp.Content{text("hi")}},
			"hi"},
		{"JSON text", mcp.CallToolResult{Content: []mcp.Content{text(`{"a":[1,2]}`)}}, map[string]any{"a": []any{1.0, 2.0}}},
		{"JSON scalar text", mcp.CallToolResult{Content: []mcp.Content{text(`42`)}}, 42.0},
		{"plain text", mcp.CallToolResult{Content: []mcp.Content{text("hello world")}}, "hello world"},
		{"first text block only", mcp.CallToolResult{Content: []mcp.Content{
			mcp.NewImageContent("aGk=", "image/png"), text("first"), text("second")}}, "first"},
		{"pointer text block", mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Type: "text", Text: "p"}}}, "p"},
		{"no content", mcp.CallToolResult{}, nil},
		{"no text content", mcp.CallToolResult{Content: []mcp.Content{mcp.NewImageContent("aGk=", "image/png")}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := resultValue(&tt.res)
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v, %v; want %#v", got, err, tt.want)
			}
		})
	}
}

func TestErrorText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		content []mcp.Content
		want    string
	}{
		{"joined", []mcp.Content{mcp.NewTextContent("a"), mcp.NewImageContent("aGk=", "image/png"), mcp.NewTextContent("b")}, "a\nb"},
		{"empty", nil, "the tool reported an error without a message"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := errorText(tt.content); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestChildEnv(t *testing.T) {
	t.Parallel()
	got := childEnv(map[string]string{"B": "2", "A": "1", "PATH": "/only"})
	want := []string{}
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			want = append(want, k+"="+v)
		}
	}
	// Configured values come last so they win (exec keeps the last of a
	// duplicated key).
	want = append(want, "A=1", "B=2", "PATH=/only")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("childEnv = %q, want %q", got, want)
	}
}

// TestMayBeResultType: the scan that spares plain results two decodes
// never misses a task or questions, wherever the member stands.
func TestMayBeResultType(t *testing.T) {
	for _, tc := range []struct {
		result, want string
		may          bool
	}{
		{`{"content":[{"type":"text","text":"hi"}]}`, "task", false},
		{`{"resultType":"complete","content":[]}`, "task", false},
		{`{"resultType":"task","task":{"taskId":"t1"}}`, "task", true},
		{`{"resultType" : "task"}`, "task", true},
		{"{\"resultType\":\n\t\"input_required\",\"inputRequests\":{}}", "input_required", true},
		{`{"structuredContent":{"resultType":"complete"},"resultType":"task"}`, "task", true},
		{`{"content":[{"type":"text","text":"\"resultType\""}]}`, "task", false},
		{`{"resultType":"input_required"}`, "task", false},
	} {
		if got := mayBeResultType(json.RawMessage(tc.result), tc.want); got != tc.may {
			t.Errorf("mayBeResultType(%s, %s) = %v, want %v", tc.result, tc.want, got, tc.may)
		}
	}
}
