package models

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

const testKey = "sk-test-SECRET-0123456789"

// wire describes one provider's wire format for the shared tests.
type wire struct {
	name       string
	text, tool http.HandlerFunc
	newP       func(baseURL string, maxRetries int) Provider
	errBody    func(status int, msg string) string
	checkAuth  func(t *testing.T, h http.Header)
	path       string
	wantTool   []ToolCall
	toolUsage  Usage
}

func wires() []wire {
	return []wire{
		{
			name: "anthropic", text: anthropicTextStream, tool: anthropicToolStream, path: "/v1/messages",
			newP: func(u string, n int) Provider {
				return NewAnthropic(AnthropicOptions{APIKey: testKey, BaseURL: u, MaxRetries: n})
			},
			errBody: func(status int, msg string) string {
				typ := map[int]string{400: "invalid_request_error", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}[status]
				return anthropicErrorBody(typ, msg)
			},
			checkAuth: func(t *testing.T, h http.Header) {
				if got := h.Get("X-Api-Key"); got != testKey {
					t.Errorf("x-api-key = %q", got)
				}
				if got := h.Get("Authorization"); got != "" {
					t.Errorf("unexpected Authorization %q", got)
				}
				if h.Get("Anthropic-Version") == "" {
					t.Error("anthropic-version header missing")
				}
			},
			wantTool:  []ToolCall{{ID: "toolu_01T1x1fJ34qAmk2tNTrN7Up6", Name: "get_weather", Args: json.RawMessage(`{"location": "San Francisco, CA", "unit": "fahrenheit"}`)}},
			toolUsage: Usage{InputTokens: 472, OutputTokens: 89},
		},
		{
			name: "openai", text: openAITextStream, tool: openAIToolStream, path: "/v1/chat/completions",
			newP: func(u string, n int) Provider {
				return NewOpenAI(OpenAIOptions{APIKey: testKey, BaseURL: u + "/v1/", MaxRetries: n})
			},
			errBody: func(status int, msg string) string {
				typ := map[int]string{400: "invalid_request_error", 429: "requests", 500: "server_error"}[status]
				return openAIErrorBody(typ, "", msg)
			},
			checkAuth: func(t *testing.T, h http.Header) {
				if got := h.Get("Authorization"); got != "Bearer "+testKey {
					t.Errorf("Authorization = %q", got)
				}
				if got := h.Get("X-Api-Key"); got != "" {
					t.Errorf("unexpected x-api-key %q", got)
				}
			},
			wantTool: []ToolCall{
				{ID: "call_DdmO9pD3xa9XTPNJ32zg2hcA", Name: "get_weather", Args: json.RawMessage(`{"location": "San Francisco, CA", "unit": "fahrenheit"}`)},
				{ID: "call_2", Name: "get_time", Args: json.RawMessage(`{"tz":"America/Los_Angeles"}`)},
			},
			toolUsage: Usage{InputTokens: 472, OutputTokens: 89},
		},
	}
}

func weatherRequest() Request {
	return Request{
		Model:        "test-model",
		Instructions: "You are terse.",
		Messages:     []Message{{Role: RoleUser, Text: "What is the weather in San Francisco?"}},
		Tools: []Tool{{
			Name:        "get_weather",
			Description: "Get the current weather in a given location",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"location":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["location"],"additionalProperties":false}`),
		}},
		ToolChoice: "auto",
	}
}

// collector records deltas and rebuilds text and tool calls from them alone.
type collector struct {
	text  strings.Builder
	calls []ToolCall
	n     int
}

func (c *collector) on(d Delta) {
	c.n++
	c.text.WriteString(d.Text)
	if tc := d.ToolCall; tc != nil {
		for len(c.calls) <= tc.Index {
			c.calls = append(c.calls, ToolCall{})
		}
		cl := &c.calls[tc.Index]
		if tc.ID != "" {
			cl.ID = tc.ID
		}
		if tc.Name != "" {
			cl.Name = tc.Name
		}
		cl.Args = append(cl.Args, tc.ArgsFragment...)
	}
}

func TestTextAnswer(t *testing.T) {
	t.Parallel()
	for _, w := range wires() {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, w.text)
			var c collector
			resp, err := w.newP(srv.URL, 0).Turn(context.Background(), weatherRequest(), c.on)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Text != "Hello!" || c.text.String() != "Hello!" || c.n < 2 {
				t.Errorf("text = %q, from deltas %q (%d deltas)", resp.Text, c.text.String(), c.n)
			}
			if resp.StopReason != StopEndTurn || len(resp.ToolCalls) != 0 {
				t.Errorf("stop = %q, calls = %v", resp.StopReason, resp.ToolCalls)
			}
			if want := (Usage{InputTokens: 25, OutputTokens: 15}); resp.Usage != want {
				t.Errorf("usage = %+v, want %+v", resp.Usage, want)
			}
			reqs := srv.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests", len(reqs))
			}
			if reqs[0].Path != w.path {
				t.Errorf("path = %q", reqs[0].Path)
			}
			w.checkAuth(t, reqs[0].Header)
			if reqs[0].Body["stream"] != true || reqs[0].Body["model"] != "test-model" {
				t.Errorf("body = %v", reqs[0].Body)
			}
		})
	}
}

func TestToolCallAssembledFromDeltas(t *testing.T) {
	t.Parallel()
	for _, w := range wires() {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, w.tool)
			var c collector
			resp, err := w.newP(srv.URL, 0).Turn(context.Background(), weatherRequest(), c.on)
			if err != nil {
				t.Fatal(err)
			}
			if want := "Okay, let's check the weather."; resp.Text != want || c.text.String() != want {
				t.Errorf("text = %q / %q", resp.Text, c.text.String())
			}
			if resp.StopReason != StopToolUse {
				t.Errorf("stop = %q", resp.StopReason)
			}
			if resp.Usage != w.toolUsage {
				t.Errorf("usage = %+v", resp.Usage)
			}
			if !reflect.DeepEqual(resp.ToolCalls, w.wantTool) {
				t.Errorf("calls = %s\nwant    %s", dump(resp.ToolCalls), dump(w.wantTool))
			}
			// The deltas alone rebuild the same calls.
			if !reflect.DeepEqual(c.calls, w.wantTool) {
				t.Errorf("calls from deltas = %s", dump(c.calls))
			}
		})
	}
}

func TestRetries(t *testing.T) {
	t.Parallel()
	for _, w := range wires() {
		t.Run(w.name+"/429 Retry-After then success", func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, jsonError(429, map[string]string{"Retry-After": "1"}, w.errBody(429, "slow down")), w.text)
			resp, err := w.newP(srv.URL, 0).Turn(context.Background(), weatherRequest(), nil)
			if err != nil {
				t.Fatal(err)
			}
			reqs := srv.requests()
			if len(reqs) != 2 || resp.Text != "Hello!" {
				t.Fatalf("%d requests, text %q", len(reqs), resp.Text)
			}
			if gap := reqs[1].At.Sub(reqs[0].At); gap < 900*time.Millisecond {
				t.Errorf("retried after %v, want about 1s (Retry-After)", gap)
			}
		})
		t.Run(w.name+"/500 then success", func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, jsonError(500, nil, w.errBody(500, "internal")), w.text)
			resp, err := w.newP(srv.URL, 0).Turn(context.Background(), weatherRequest(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(srv.requests()); n != 2 || resp.Text != "Hello!" {
				t.Fatalf("%d requests, text %q", n, resp.Text)
			}
		})
		t.Run(w.name+"/Retry-After capped", func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, jsonError(429, map[string]string{"Retry-After": "3600"}, w.errBody(429, "slow down")), w.text)
			var p Provider
			if w.name == "anthropic" {
				p = NewAnthropic(AnthropicOptions{APIKey: testKey, BaseURL: srv.URL, MaxRetryAfter: 50 * time.Millisecond})
			} else {
				p = NewOpenAI(OpenAIOptions{APIKey: testKey, BaseURL: srv.URL + "/v1/", MaxRetryAfter: 50 * time.Millisecond})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := p.Turn(ctx, weatherRequest(), nil); err != nil {
				t.Fatal(err)
			}
		})
		t.Run(w.name+"/attempts bounded", func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, jsonError(429, map[string]string{"Retry-After": "0"}, w.errBody(429, "slow down")))
			_, err := w.newP(srv.URL, 2).Turn(context.Background(), weatherRequest(), nil)
			var apiErr *APIError
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 429 || !apiErr.Retryable() {
				t.Fatalf("err = %v", err)
			}
			if n := len(srv.requests()); n != 3 {
				t.Errorf("%d requests, want 3 (1 + 2 retries)", n)
			}
		})
	}
}

func TestBadRequestNotRetriedAndKeyNotLeaked(t *testing.T) {
	t.Parallel()
	for _, w := range wires() {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			// A server that echoes the key back must not get it into our error.
			srv := newFakeServer(t, jsonError(400, nil, w.errBody(400, "messages: bad request for key "+testKey)))
			_, err := w.newP(srv.URL, 0).Turn(context.Background(), weatherRequest(), nil)
			var apiErr *APIError
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Provider != w.name {
				t.Fatalf("err = %#v", err)
			}
			if apiErr.Type != "invalid_request_error" || !contains(apiErr.Message, "bad request") {
				t.Errorf("type %q message %q", apiErr.Type, apiErr.Message)
			}
			t.Logf("error: %v", err)
			if contains(err.Error(), testKey) || contains(apiErr.Message, testKey) || contains(err.Error(), "SECRET") {
				t.Errorf("key leaked: %v", err)
			}
			if n := len(srv.requests()); n != 1 {
				t.Errorf("%d requests, want 1 (no retry)", n)
			}
			w.checkAuth(t, srv.requests()[0].Header)
		})
	}
}

func TestTransportErrorDoesNotLeakKey(t *testing.T) {
	t.Parallel()
	for _, w := range wires() {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			srv := newFakeServer(t, w.text)
			url := srv.URL
			srv.Close()
			_, err := w.newP(url, -1).Turn(context.Background(), weatherRequest(), nil)
			if err == nil || contains(err.Error(), testKey) {
				t.Fatalf("err = %v", err)
			}
			t.Logf("error: %v", err)
		})
	}
}

// A transcript with a tool round goes out in each provider's shape.
func TestTranscriptEncoding(t *testing.T) {
	t.Parallel()
	req := weatherRequest()
	req.ToolChoice = "get_weather"
	req.Messages = append(req.Messages,
		Message{Role: RoleAssistant, Text: "Checking.", ToolCalls: []ToolCall{{ID: "c1", Name: "get_weather", Args: json.RawMessage(`{"location":"SF"}`)}}},
		Message{Role: RoleTool, ToolResults: []ToolResult{{CallID: "c1", Content: "15 degrees"}}},
		Message{Role: RoleUser, Text: "And tomorrow?"},
	)

	t.Run("anthropic", func(t *testing.T) {
		t.Parallel()
		srv := newFakeServer(t, anthropicTextStream)
		if _, err := NewAnthropic(AnthropicOptions{APIKey: testKey, BaseURL: srv.URL}).Turn(context.Background(), req, nil); err != nil {
			t.Fatal(err)
		}
		b := srv.requests()[0].Body
		want := map[string]any{
			"model":       "test-model",
			"max_tokens":  float64(4096),
			"stream":      true,
			"system":      []any{map[string]any{"type": "text", "text": "You are terse."}},
			"tool_choice": map[string]any{"type": "tool", "name": "get_weather"},
			"tools": []any{map[string]any{
				"name": "get_weather", "description": "Get the current weather in a given location",
				"input_schema": map[string]any{"type": "object", "additionalProperties": false, "required": []any{"location"},
					"properties": map[string]any{"location": map[string]any{"type": "string"}, "unit": map[string]any{"type": "string", "enum": []any{"celsius", "fahrenheit"}}}},
			}},
			"messages": []any{
				map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "What is the weather in San Francisco?"}}},
				map[string]any{"role": "assistant", "content": []any{
					map[string]any{"type": "text", "text": "Checking."},
					map[string]any{"type": "tool_use", "id": "c1", "name": "get_weather", "input": map[string]any{"location": "SF"}},
				}},
				map[string]any{"role": "user", "content": []any{
					map[string]any{"type": "tool_result", "tool_use_id": "c1", "content": []any{map[string]any{"type": "text", "text": "15 degrees"}}, "is_error": false},
					map[string]any{"type": "text", "text": "And tomorrow?"},
				}},
			},
		}
		compareBody(t, b, want)
	})

	t.Run("openai", func(t *testing.T) {
		t.Parallel()
		srv := newFakeServer(t, openAITextStream)
		if _, err := NewOpenAI(OpenAIOptions{BaseURL: srv.URL + "/v1/"}).Turn(context.Background(), req, nil); err != nil {
			t.Fatal(err)
		}
		r := srv.requests()[0]
		if got := r.Header.Get("Authorization"); got != "" {
			t.Errorf("no key configured but Authorization = %q", got)
		}
		want := map[string]any{
			"model":          "test-model",
			"stream":         true,
			"stream_options": map[string]any{"include_usage": true},
			"tool_choice":    map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}},
			"tools": []any{map[string]any{"type": "function", "function": map[string]any{
				"name": "get_weather", "description": "Get the current weather in a given location",
				"parameters": map[string]any{"type": "object", "additionalProperties": false, "required": []any{"location"},
					"properties": map[string]any{"location": map[string]any{"type": "string"}, "unit": map[string]any{"type": "string", "enum": []any{"celsius", "fahrenheit"}}}},
			}}},
			"messages": []any{
				map[string]any{"role": "system", "content": "You are terse."},
				map[string]any{"role": "user", "content": "What is the weather in San Francisco?"},
				map[string]any{"role": "assistant", "content": "Checking.", "tool_calls": []any{
					map[string]any{"id": "c1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"location":"SF"}`}},
				}},
				map[string]any{"role": "tool", "tool_call_id": "c1", "content": "15 degrees"},
				map[string]any{"role": "user", "content": "And tomorrow?"},
			},
		}
		compareBody(t, r.Body, want)
	})
}

func compareBody(t *testing.T, got, want map[string]any) {
	t.Helper()
	for k, v := range want {
		if !reflect.DeepEqual(got[k], v) {
			t.Errorf("body[%q] = %s\nwant %s", k, dump(got[k]), dump(v))
		}
	}
}

func TestMalformedToolArguments(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, sse(
		openAIChunk(`{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":"}}]}`, ""),
		openAIChunk(`{}`, "tool_calls"),
		"data: [DONE]",
	))
	_, err := NewOpenAI(OpenAIOptions{BaseURL: srv.URL + "/v1/"}).Turn(context.Background(), weatherRequest(), nil)
	if !errors.Is(err, ErrToolArguments) {
		t.Fatalf("err = %v", err)
	}
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// An error event in the middle of a stream ends the turn with an error (not retried:
// deltas were already delivered).
func TestAnthropicMidStreamError(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, sse(
		anthropicEvent("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}}`),
		anthropicEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		anthropicEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hel"}}`),
		anthropicEvent("error", `{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}`),
	))
	var c collector
	_, err := NewAnthropic(AnthropicOptions{APIKey: testKey, BaseURL: srv.URL}).Turn(context.Background(), weatherRequest(), c.on)
	if err == nil || !contains(err.Error(), "Overloaded") || contains(err.Error(), testKey) {
		t.Fatalf("err = %v", err)
	}
	if len(srv.requests()) != 1 || c.text.String() != "Hel" {
		t.Errorf("%d requests, deltas %q", len(srv.requests()), c.text.String())
	}
}

// Local OpenAI-compatible servers sometimes answer errors as {"error": "text"}.
func TestOpenAIStringErrorBody(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, jsonError(404, nil, `{"error":"model \"llama9\" not found, try pulling it first"}`))
	_, err := NewOpenAI(OpenAIOptions{BaseURL: srv.URL + "/v1/"}).Turn(context.Background(), weatherRequest(), nil)
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !contains(apiErr.Message, "not found") {
		t.Fatalf("err = %v", err)
	}
}

func TestOpenAIPlainTextErrorBody(t *testing.T) {
	t.Parallel()
	srv := newFakeServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "upstream says no", http.StatusForbidden)
	})
	_, err := NewOpenAI(OpenAIOptions{APIKey: testKey, BaseURL: srv.URL + "/v1/"}).Turn(context.Background(), weatherRequest(), nil)
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 403 || apiErr.Message != "upstream says no" {
		t.Fatalf("err = %v", err)
	}
}

// TestOutputSchemaOnTheWire: an object output schema becomes an
// OpenAI-compatible response_format (strict off); a non-object schema is
// left to the instructions, and Anthropic requests carry no format.
func TestOutputSchemaOnTheWire(t *testing.T) {
	t.Parallel()
	const schema = `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`
	tests := []struct {
		name, wire, schema string
		want               string // the response_format sent, as JSON; "" none
	}{
		{"openai object schema", "openai", schema, `{"json_schema":{"name":"output","schema":` + schema + `,"strict":false},"type":"json_schema"}`},
		{"openai array schema", "openai", `{"type":"array"}`, ""},
		{"openai no schema", "openai", "", ""},
		{"anthropic", "anthropic", schema, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := weatherRequest()
			req.OutputSchema = json.RawMessage(tt.schema)
			var srv *fakeServer
			var p Provider
			if tt.wire == "openai" {
				srv = newFakeServer(t, openAITextStream)
				p = NewOpenAI(OpenAIOptions{BaseURL: srv.URL + "/v1/"})
			} else {
				srv = newFakeServer(t, anthropicTextStream)
				p = NewAnthropic(AnthropicOptions{APIKey: testKey, BaseURL: srv.URL + "/"})
			}
			if _, err := p.Turn(context.Background(), req, nil); err != nil {
				t.Fatal(err)
			}
			body := srv.requests()[0].Body
			for _, field := range []string{"output_config", "output_format"} {
				if _, ok := body[field]; ok {
					t.Errorf("request has %s: %v", field, body[field])
				}
			}
			got := ""
			if rf, ok := body["response_format"]; ok {
				b, _ := json.Marshal(rf)
				got = string(b)
			}
			if tt.want != "" {
				var w any
				_ = json.Unmarshal([]byte(tt.want), &w)
				b, _ := json.Marshal(w)
				tt.want = string(b)
			}
			if got != tt.want {
				t.Errorf("response_format = %s\nwant              %s", got, tt.want)
			}
		})
	}
}
