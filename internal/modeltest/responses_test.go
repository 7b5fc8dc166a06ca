package modeltest_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/patchbay-dev/patchbay/internal/modeltest"
)

// TestResponsesStream reads the fake's stream with the official OpenAI
// SDK: text deltas, a namespaced function call and the completed response
// with usage.
func TestResponsesStream(t *testing.T) {
	f := modeltest.NewResponses(t, func(req modeltest.ResponsesRequest) modeltest.Reply {
		if req.UserText() != "hello" {
			t.Errorf("UserText = %q", req.UserText())
		}
		call := modeltest.CodexMCPCall("patch-bay", "add", `{"a":1}`)
		call.CallID = "call_x"
		return modeltest.Reply{Text: "hi there", ToolCalls: []modeltest.FunctionCall{call}}
	})
	client := openai.NewClient(option.WithBaseURL(f.URL+"/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	stream := client.Responses.NewStreaming(context.Background(), responses.ResponseNewParams{
		Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")},
	})
	var text string
	var types []string
	var done responses.Response
	for stream.Next() {
		ev := stream.Current()
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			done = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if text != "hi there" {
		t.Errorf("text = %q", text)
	}
	if types[0] != "response.created" || types[len(types)-1] != "response.completed" {
		t.Errorf("event types = %v", types)
	}
	if done.Usage.TotalTokens != 15 || len(done.Output) != 2 {
		t.Fatalf("completed response = %+v", done)
	}
	fc := done.Output[1]
	if fc.Type != "function_call" || fc.Name != "add" || fc.Namespace != "mcp__patch_bay" || fc.CallID != "call_x" || fc.Arguments.OfString != `{"a":1}` {
		t.Errorf("function call = %+v", fc)
	}
	if got := len(f.Requests()); got != 1 {
		t.Errorf("requests = %d", got)
	}
}

func TestResponsesErrorStatus(t *testing.T) {
	f := modeltest.NewResponses(t, func(modeltest.ResponsesRequest) modeltest.Reply {
		return modeltest.Reply{Status: http.StatusTooManyRequests, Text: "slow down"}
	})
	client := openai.NewClient(option.WithBaseURL(f.URL+"/"), option.WithAPIKey("sk-test"), option.WithMaxRetries(0))
	_, err := client.Responses.New(context.Background(), responses.ResponseNewParams{Model: "m"})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("err = %v", err)
	}
}

// TestRequestHelpers: LastToolOutput reads the current turn only, and
// OutputText unwraps Codex's output header.
func TestRequestHelpers(t *testing.T) {
	req := modeltest.ResponsesRequest{Input: []any{
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "<environment_context>x</environment_context>"}}},
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "first"}}},
		map[string]any{"type": "function_call", "call_id": "c1", "name": "add"},
		map[string]any{"type": "function_call_output", "call_id": "c1", "output": "Wall time: 0.04 seconds\nOutput:\n[{\"type\":\"text\",\"text\":\"5\"}]"},
		map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "5"}}},
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "second"}}},
	}}
	if got := req.UserText(); got != "second" {
		t.Errorf("UserText = %q", got)
	}
	if _, _, ok := req.LastToolOutput(); ok {
		t.Errorf("LastToolOutput found an output of an earlier turn")
	}
	req.Input = req.Input[:5]
	id, out, ok := req.LastToolOutput()
	if !ok || id != "c1" || modeltest.OutputText(out) != "5" {
		t.Errorf("LastToolOutput = %q %q %v", id, out, ok)
	}
	if got := modeltest.OutputText("plain"); got != "plain" {
		t.Errorf("OutputText(plain) = %q", got)
	}
	shell := "Chunk ID: a\nWall time: 0.0003 seconds\nProcess exited with code 0\nOriginal token count: 1\nOutput:\nhello\n"
	if got := modeltest.OutputText(shell); got != "hello\n" {
		t.Errorf("OutputText(shell) = %q", got)
	}
}
