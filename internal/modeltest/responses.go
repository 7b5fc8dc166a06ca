package modeltest

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

// Responses is a scripted fake of the OpenAI Responses API on loopback:
// POST {URL}/responses answers each request with the Reply its script
// returns, streamed as server-sent events the way the real API streams
// them; GET {URL}/models answers with an empty model list. It is closed
// at the test's cleanup.
type Responses struct {
	// URL is the base URL, http://127.0.0.1:PORT/v1, for a client's
	// base_url.
	URL string

	t      testing.TB
	srv    *httptest.Server
	script func(ResponsesRequest) Reply

	scriptMu sync.Mutex // one script call at a time

	mu       sync.Mutex
	requests []ResponsesRequest
	other    []string
	seq      int
}

// Reply is what the fake model answers one request with: an assistant
// message holding Text (none when empty), then ToolCalls as function_call
// items, in that order.
type Reply struct {
	Text      string
	ToolCalls []FunctionCall

	// Status, when not 0 or 200, answers with that HTTP status and an
	// OpenAI-style JSON error (Text is its message) instead of a stream.
	Status int
	// Hold, when not nil, stalls the stream after response.created until
	// it is closed or the client goes away, for tests that cancel a turn
	// while the model is "thinking" (close it at cleanup, or stop the
	// client first: the server's Close waits for the stalled request).
	Hold <-chan struct{}
	// Usage overrides the token counts sent with response.completed
	// (default 10 in, 5 out).
	Usage *Usage
}

// Usage is the token usage reported in response.completed.
type Usage struct {
	InputTokens, OutputTokens int
}

// FunctionCall is one function_call output item. Arguments is the JSON
// text of the arguments ("{}" when empty); CallID is generated
// ("call_<request>_<index>", e.g. call_1_0) when empty. Namespace, when set, is sent as the item's
// namespace field, for tools the client offered inside a namespace.
type FunctionCall struct {
	Name      string
	Namespace string
	Arguments string
	CallID    string
}

// Text is a Reply holding only an assistant message.
func Text(s string) Reply { return Reply{Text: s} }

// Call is a Reply holding only one function call.
func Call(name, arguments string) Reply {
	return Reply{ToolCalls: []FunctionCall{{Name: name, Arguments: arguments}}}
}

// ResponsesRequest is one request body the fake received.
type ResponsesRequest struct {
	// Raw is the whole JSON body.
	Raw map[string]any
	// Model, Input and Tools are the body's model, input and tools (an
	// input given as a string is one user message here).
	Model string
	Input []any
	Tools []any
	// Header is the request's HTTP header.
	Header http.Header
}

// NewResponses starts the fake on loopback. script is called once per
// POST /responses, one call at a time, with the decoded request; it may
// call t.Error but not t.Fatal (it runs on the server's goroutine).
func NewResponses(t testing.TB, script func(req ResponsesRequest) Reply) *Responses {
	t.Helper()
	f := &Responses{t: t, script: script}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	f.URL = f.srv.URL + "/v1"
	t.Cleanup(f.srv.Close)
	return f
}

// Requests returns the Responses requests received so far, in order.
func (f *Responses) Requests() []ResponsesRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ResponsesRequest(nil), f.requests...)
}

// Other returns "METHOD /path" of every request that was not a POST to
// /v1/responses, in order.
func (f *Responses) Other() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.other...)
}

func (f *Responses) next() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	return f.seq
}

func (f *Responses) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.URL.Path == "/v1/responses" {
		f.respond(w, r)
		return
	}
	f.mu.Lock()
	f.other = append(f.other, r.Method+" "+r.URL.Path)
	f.mu.Unlock()
	if r.Method == http.MethodGet && r.URL.Path == "/v1/models" {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[],"models":[]}`)
		return
	}
	writeError(w, http.StatusNotFound, "not found: "+r.Method+" "+r.URL.Path)
}

func writeError(w http.ResponseWriter, status int, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": message, "type": "invalid_request_error", "code": nil}})
	w.Write(b)
}

func (f *Responses) respond(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		f.t.Errorf("modeltest: POST /v1/responses body is not JSON (Content-Encoding %q): %v", r.Header.Get("Content-Encoding"), err)
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	req := ResponsesRequest{Raw: raw, Header: r.Header.Clone()}
	req.Model, _ = raw["model"].(string)
	switch in := raw["input"].(type) {
	case []any:
		req.Input = in
	case string: // shorthand for one user message
		req.Input = []any{map[string]any{"type": "message", "role": "user", "content": in}}
	}
	req.Tools, _ = raw["tools"].([]any)
	f.mu.Lock()
	f.requests = append(f.requests, req)
	f.mu.Unlock()

	f.scriptMu.Lock()
	reply := f.script(req)
	f.scriptMu.Unlock()

	if reply.Status != 0 && reply.Status != http.StatusOK {
		writeError(w, reply.Status, reply.Text)
		return
	}
	f.stream(w, r, req, reply)
}

// stream writes reply as the Responses API's event stream.
func (f *Responses) stream(w http.ResponseWriter, r *http.Request, req ResponsesRequest, reply Reply) {
	n := f.next()
	respID := fmt.Sprintf("resp_%d", n)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	seq := 0
	emit := func(event map[string]any) {
		event["sequence_number"] = seq
		seq++
		b, _ := json.Marshal(event)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event["type"], b)
		if flusher != nil {
			flusher.Flush()
		}
	}
	response := func(status string, output []any) map[string]any {
		return map[string]any{
			"id": respID, "object": "response", "created_at": time.Now().Unix(),
			"status": status, "model": req.Model, "output": output,
		}
	}
	emit(map[string]any{"type": "response.created", "response": response("in_progress", []any{})})
	emit(map[string]any{"type": "response.in_progress", "response": response("in_progress", []any{})})
	if reply.Hold != nil {
		select {
		case <-reply.Hold:
		case <-r.Context().Done():
			return
		}
	}

	var output []any
	if reply.Text != "" {
		id := fmt.Sprintf("msg_%d", n)
		idx := len(output)
		emit(map[string]any{"type": "response.output_item.added", "output_index": idx,
			"item": map[string]any{"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []any{}}})
		emit(map[string]any{"type": "response.content_part.added", "item_id": id, "output_index": idx, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
		emit(map[string]any{"type": "response.output_text.delta", "item_id": id, "output_index": idx, "content_index": 0, "delta": reply.Text})
		emit(map[string]any{"type": "response.output_text.done", "item_id": id, "output_index": idx, "content_index": 0, "text": reply.Text})
		part := map[string]any{"type": "output_text", "text": reply.Text, "annotations": []any{}}
		emit(map[string]any{"type": "response.content_part.done", "item_id": id, "output_index": idx, "content_index": 0, "part": part})
		item := map[string]any{"id": id, "type": "message", "status": "completed", "role": "assistant", "content": []any{part}}
		emit(map[string]any{"type": "response.output_item.done", "output_index": idx, "item": item})
		output = append(output, item)
	}
	for i, call := range reply.ToolCalls {
		id := fmt.Sprintf("fc_%d_%d", n, i)
		idx := len(output)
		callID := call.CallID
		if callID == "" {
			callID = fmt.Sprintf("call_%d_%d", n, i)
		}
		args := call.Arguments
		if args == "" {
			args = "{}"
		}
		item := func(status, args string) map[string]any {
			m := map[string]any{"id": id, "type": "function_call", "status": status, "name": call.Name, "call_id": callID, "arguments": args}
			if call.Namespace != "" {
				m["namespace"] = call.Namespace
			}
			return m
		}
		emit(map[string]any{"type": "response.output_item.added", "output_index": idx, "item": item("in_progress", "")})
		emit(map[string]any{"type": "response.function_call_arguments.delta", "item_id": id, "output_index": idx, "delta": args})
		emit(map[string]any{"type": "response.function_call_arguments.done", "item_id": id, "output_index": idx, "arguments": args})
		done := item("completed", args)
		emit(map[string]any{"type": "response.output_item.done", "output_index": idx, "item": done})
		output = append(output, done)
	}
	usage := Usage{InputTokens: 10, OutputTokens: 5}
	if reply.Usage != nil {
		usage = *reply.Usage
	}
	completed := response("completed", output)
	completed["usage"] = map[string]any{
		"input_tokens":          usage.InputTokens,
		"input_tokens_details":  map[string]any{"cached_tokens": 0},
		"output_tokens":         usage.OutputTokens,
		"output_tokens_details": map[string]any{"reasoning_tokens": 0},
		"total_tokens":          usage.InputTokens + usage.OutputTokens,
	}
	emit(map[string]any{"type": "response.completed", "response": completed})
}

// UserText is the text of the last user message in the input (its
// input_text parts, joined by newlines), skipping messages that are
// context the client adds itself (text starting with "<", such as
// Codex's <environment_context> and <permissions instructions>).
func (r ResponsesRequest) UserText() string {
	i := r.lastUser()
	if i < 0 {
		return ""
	}
	m, _ := r.Input[i].(map[string]any)
	return contentText(m["content"])
}

// lastUser is the index of the last user message UserText reads, or -1.
func (r ResponsesRequest) lastUser() int {
	for i := len(r.Input) - 1; i >= 0; i-- {
		m, _ := r.Input[i].(map[string]any)
		if m["type"] != nil && m["type"] != "message" || m["role"] != "user" {
			continue
		}
		if text := contentText(m["content"]); text != "" && !strings.HasPrefix(strings.TrimSpace(text), "<") {
			return i
		}
	}
	return -1
}

// LastToolOutput returns the latest function_call_output (or
// custom_tool_call_output) item of the current turn, the items after the
// last user message (so a tool output of an earlier turn, which the
// client sends again as history, is not taken for this turn's): its
// call_id and its output as text (a string output as is, a content
// list's text parts joined by newlines). Codex wraps an output in a
// header ("Wall time: …\nOutput:\n…"); OutputText unwraps it.
func (r ResponsesRequest) LastToolOutput() (callID, output string, ok bool) {
	user := r.lastUser()
	for i := len(r.Input) - 1; i > user; i-- {
		m, _ := r.Input[i].(map[string]any)
		switch m["type"] {
		case "function_call_output", "custom_tool_call_output":
			callID, _ = m["call_id"].(string)
			return callID, outputText(m["output"]), true
		}
	}
	return "", "", false
}

// ToolOutputs maps the call_id of every function_call_output (and
// custom_tool_call_output) item in the whole input, earlier turns
// included, to its output text.
func (r ResponsesRequest) ToolOutputs() map[string]string {
	out := map[string]string{}
	for _, it := range r.Input {
		m, _ := it.(map[string]any)
		switch m["type"] {
		case "function_call_output", "custom_tool_call_output":
			id, _ := m["call_id"].(string)
			out[id] = outputText(m["output"])
		}
	}
	return out
}

// OutputText is what a tool returned, out of the text Codex sends the
// model for it: the part after Codex's header line "Output:" (an MCP
// call's output reads "Wall time: 0.04 seconds\nOutput:\n" then the
// result's content as JSON; a shell command's has "Chunk ID", "Process
// exited with code N" and more before "Output:"), and when that part is a
// JSON list of content blocks, the text of its text blocks joined by
// newlines. Text without the header is returned as is.
func OutputText(output string) string {
	body := output
	if i := strings.Index(output, "\nOutput:\n"); i >= 0 {
		body = output[i+len("\nOutput:\n"):]
	} else if strings.HasPrefix(output, "Output:\n") {
		body = output[len("Output:\n"):]
	} else {
		return output
	}
	var blocks []map[string]any
	if err := json.Unmarshal([]byte(body), &blocks); err != nil {
		return body
	}
	var parts []string
	for _, b := range blocks {
		if s, ok := b["text"].(string); ok {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "\n")
}

// ToolNames lists the names of the offered tools: a function's name, or
// for a tool of type "namespace" each of its tools as "namespace.name"
// (other tool types by their type).
func (r ResponsesRequest) ToolNames() []string {
	var names []string
	for _, t := range r.Tools {
		m, _ := t.(map[string]any)
		name, _ := m["name"].(string)
		if m["type"] == "namespace" {
			sub, _ := m["tools"].([]any)
			for _, s := range sub {
				sm, _ := s.(map[string]any)
				sn, _ := sm["name"].(string)
				names = append(names, name+"."+sn)
			}
			continue
		}
		if name == "" {
			name, _ = m["type"].(string)
		}
		names = append(names, name)
	}
	return names
}

// Tool finds an offered tool by name (searching inside namespaces too)
// and returns its definition and the namespace it is in ("" at top
// level).
func (r ResponsesRequest) Tool(name string) (tool map[string]any, namespace string, ok bool) {
	for _, t := range r.Tools {
		m, _ := t.(map[string]any)
		if m["type"] == "namespace" {
			ns, _ := m["name"].(string)
			sub, _ := m["tools"].([]any)
			for _, s := range sub {
				sm, _ := s.(map[string]any)
				if sm["name"] == name {
					return sm, ns, true
				}
			}
			continue
		}
		if m["name"] == name {
			return m, "", true
		}
	}
	return nil, "", false
}

func contentText(content any) string {
	switch c := content.(type) {
	case string:
		return c
	case []any:
		var parts []string
		for _, p := range c {
			pm, _ := p.(map[string]any)
			if s, ok := pm["text"].(string); ok {
				parts = append(parts, s)
			}
		}
		return strings.Join(parts, "\n")
	}
	return ""
}

func outputText(output any) string {
	switch o := output.(type) {
	case string:
		return o
	case map[string]any: // {content: ..., success: ...}
		return contentText(o["content"])
	}
	return contentText(output)
}
