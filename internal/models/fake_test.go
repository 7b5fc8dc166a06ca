package models

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorded is one request the fake server saw.
type recorded struct {
	Header http.Header
	Path   string
	Body   map[string]any
	At     time.Time
}

// fakeServer answers the i-th request with steps[i] (the last step repeats).
type fakeServer struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []recorded
}

func newFakeServer(t *testing.T, steps ...http.HandlerFunc) *fakeServer {
	t.Helper()
	f := &fakeServer{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		f.mu.Lock()
		i := len(f.reqs)
		f.reqs = append(f.reqs, recorded{Header: r.Header.Clone(), Path: r.URL.Path, Body: body, At: time.Now()})
		f.mu.Unlock()
		steps[min(i, len(steps)-1)](w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) requests() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.reqs...)
}

// sse writes a text/event-stream; each frame is "event: X\ndata: Y" or just "data: Y".
func sse(frames ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		fl := w.(http.Flusher)
		for _, fr := range frames {
			fmt.Fprint(w, fr, "\n\n")
			fl.Flush()
		}
	}
}

func jsonError(status int, headers map[string]string, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for k, v := range headers {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}
}

// --- Anthropic Messages API wire format, after the documented streaming examples.

func anthropicEvent(typ, data string) string { return "event: " + typ + "\ndata: " + data }

var anthropicTextStream = sse(
	anthropicEvent("message_start", `{"type":"message_start","message":{"id":"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY","type":"message","role":"assistant","content":[],"model":"claude-opus-4-6","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":25,"output_tokens":1}}}`),
	anthropicEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
	anthropicEvent("ping", `{"type": "ping"}`),
	anthropicEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`),
	anthropicEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"!"}}`),
	anthropicEvent("content_block_stop", `{"type":"content_block_stop","index":0}`),
	anthropicEvent("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}`),
	anthropicEvent("message_stop", `{"type":"message_stop"}`),
)

var anthropicToolStream = sse(
	anthropicEvent("message_start", `{"type":"message_start","message":{"id":"msg_014p7gG3wDgGV9EUtLvnow3U","type":"message","role":"assistant","model":"claude-opus-4-6","stop_sequence":null,"usage":{"input_tokens":472,"output_tokens":2},"content":[],"stop_reason":null}}`),
	anthropicEvent("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
	anthropicEvent("ping", `{"type": "ping"}`),
	anthropicEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Okay"}}`),
	anthropicEvent("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":", let's check the weather."}}`),
	anthropicEvent("content_block_stop", `{"type":"content_block_stop","index":0}`),
	anthropicEvent("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01T1x1fJ34qAmk2tNTrN7Up6","name":"get_weather","input":{}}}`),
	anthropicEvent("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`),
	anthropicEvent("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"location\":"}}`),
	anthropicEvent("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" \"San Francisco, CA\""}}`),
	anthropicEvent("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":", \"unit\": \"fah"}}`),
	anthropicEvent("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"renheit\"}"}}`),
	anthropicEvent("content_block_stop", `{"type":"content_block_stop","index":1}`),
	anthropicEvent("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":89}}`),
	anthropicEvent("message_stop", `{"type":"message_stop"}`),
)

func anthropicErrorBody(typ, msg string) string {
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": msg}})
	return string(b)
}

// --- OpenAI Chat Completions wire format, after the documented streaming examples.

func openAIChunk(delta string, finish string) string {
	f := "null"
	if finish != "" {
		f = `"` + finish + `"`
	}
	return `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + f + `}],"usage":null}`
}

const openAIUsageChunk = `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[],"usage":{"prompt_tokens":25,"completion_tokens":15,"total_tokens":40}}`

var openAITextStream = sse(
	openAIChunk(`{"role":"assistant","content":"","refusal":null}`, ""),
	openAIChunk(`{"content":"Hello"}`, ""),
	openAIChunk(`{"content":"!"}`, ""),
	openAIChunk(`{}`, "stop"),
	openAIUsageChunk,
	"data: [DONE]",
)

var openAIToolStream = sse(
	openAIChunk(`{"role":"assistant","content":"Okay"}`, ""),
	openAIChunk(`{"content":", let's check the weather."}`, ""),
	openAIChunk(`{"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"get_weather","arguments":""}}]}`, ""),
	openAIChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"location\":"}}]}`, ""),
	openAIChunk(`{"tool_calls":[{"index":0,"function":{"arguments":" \"San Francisco, CA\""}}]}`, ""),
	openAIChunk(`{"tool_calls":[{"index":0,"function":{"arguments":", \"unit\": \"fah"}}]}`, ""),
	openAIChunk(`{"tool_calls":[{"index":0,"function":{"arguments":"renheit\"}"}}]}`, ""),
	openAIChunk(`{"tool_calls":[{"index":1,"id":"call_2","type":"function","function":{"name":"get_time","arguments":""}}]}`, ""),
	openAIChunk(`{"tool_calls":[{"index":1,"function":{"arguments":"{\"tz\":\"America/Los_Angeles\"}"}}]}`, ""),
	openAIChunk(`{}`, "tool_calls"),
	`data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","choices":[],"usage":{"prompt_tokens":472,"completion_tokens":89,"total_tokens":561}}`,
	"data: [DONE]",
)

func openAIErrorBody(typ, code, msg string) string {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
	return string(b)
}

// contains reports whether s contains sub, for messages in t.Errorf.
func contains(s, sub string) bool { return strings.Contains(s, sub) }
