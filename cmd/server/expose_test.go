package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// fiftyToolServer is an MCP server of 50 tools, tool_00…tool_49, each
// taking a required id; it counts the calls each tool receives.
func fiftyToolServer(t *testing.T) (*httptest.Server, func() map[string]int) {
	var mu sync.Mutex
	calls := map[string]int{}
	s := server.NewMCPServer("big", "1.0.0", server.WithToolCapabilities(false))
	for i := range 50 {
		name := fmt.Sprintf("tool_%02d", i)
		tool := mcp.NewTool(name, mcp.WithDescription(fmt.Sprintf("Does thing number %d to a record.", i)),
			mcp.WithString("id", mcp.Required(), mcp.Description("The record.")), mcp.WithString("note"))
		s.AddTool(tool, func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			mu.Lock()
			calls[name+":"+req.GetString("id", "")]++
			mu.Unlock()
			return mcp.NewToolResultStructured(map[string]any{"ran": name}, "ran "+name), nil
		})
	}
	srv := httptest.NewServer(server.NewStreamableHTTPServer(s))
	t.Cleanup(srv.Close)
	return srv, func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for k, v := range calls {
			out[k] = v
		}
		return out
	}
}

// scriptLLM speaks the OpenAI Chat Completions streaming format: round n
// of a turn answers with the tool calls of calls[n-1] (name, arguments),
// or, past them, with the text "done". It keeps every request body.
type scriptLLM struct {
	*httptest.Server
	calls [][2]string // one tool call per round: name, arguments

	mu     sync.Mutex
	bodies [][]byte
}

func newScriptLLM(t *testing.T, calls ...[2]string) *scriptLLM {
	f := &scriptLLM{calls: calls}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *scriptLLM) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	round := requestRound(raw)
	f.mu.Lock()
	f.bodies = append(f.bodies, raw)
	script := f.calls
	f.mu.Unlock()
	chunk := openaiChunk
	frames := []string{chunk(`{"role":"assistant","content":"done"}`, ""), chunk(`{}`, "stop")}
	if round <= len(script) {
		c := script[round-1]
		args, _ := json.Marshal(c[1])
		frames = []string{
			chunk(fmt.Sprintf(`{"role":"assistant","tool_calls":[{"index":0,"id":"call_%d","type":"function","function":{"name":%q,"arguments":%s}}]}`, round, c[0], args), ""),
			chunk(`{}`, "tool_calls"),
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, fr := range append(frames, "data: [DONE]") {
		fmt.Fprint(w, fr, "\n\n")
	}
}

func (f *scriptLLM) requests() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.bodies...)
}

// wireTools is the tools array of a captured request, and its size in bytes.
func wireTools(t *testing.T, body []byte) ([]string, int) {
	t.Helper()
	var req struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	size, _ := json.Marshal(req.Tools)
	var names []string
	for _, raw := range req.Tools {
		var tool struct {
			Function struct{ Name string } `json:"function"`
		}
		_ = json.Unmarshal(raw, &tool)
		names = append(names, tool.Function.Name)
	}
	return names, len(size)
}

// TestExposeCallOverFiftyTools: a 50-tool MCP server whose entry says
// expose "call" is two tools on the wire to the model, which lists the
// operations the allowlist grants, runs a granted one through big_call,
// and is refused one the allowlist does not grant (the server never sees
// it). The same server eager is twenty tools.
func TestExposeCallOverFiftyTools(t *testing.T) {
	t.Parallel()
	big, calls := fiftyToolServer(t)
	llm := newScriptLLM(t,
		[2]string{"big_ops", `{"query":"tool_0"}`},
		[2]string{"big_call", `{"op":"tool_03","args":{"id":"r3"}}`},
		[2]string{"big_call", `{"op":"tool_45","args":{"id":"r45"}}`},
	)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  big: { mcp: { type: http, url: %q } }
models:
  local: { type: openai, baseURL: %q }
allowlists:
  default: { connections: { big: { ops: ["tool_0*", "tool_1*"] } } }
  all: { connections: { big: { ops: ["*"] } } }
apiKeys:
  - { name: everything, key: k-all, allowlist: all }
`, big.URL+"/mcp", llm.URL+"/v1"))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	})
	doc := func(entry string) []byte {
		return []byte(`{"workflow":{"version":1,"connections":{"big":` + entry + `},
			"root":{"kind":"model","id":"turn","model":"local/m"}},"input":"Run tool_03 on r3.","wait":"20s"}`)
	}

	ex := post(t, srv.url, "k1", doc(`{"expose":"call"}`))
	if ex["status"] != "succeeded" || ex["output"] != "done" {
		t.Fatalf("execution = %v", ex)
	}
	reqs := llm.requests()
	if len(reqs) != 4 {
		t.Fatalf("%d model requests, want 4", len(reqs))
	}
	names, callBytes := wireTools(t, reqs[0])
	if strings.Join(names, ",") != "big_ops,big_call" {
		t.Fatalf("tools sent = %v, want big_ops and big_call", names)
	}
	if got := calls(); len(got) != 1 || got["tool_03:r3"] != 1 {
		t.Fatalf("server calls = %v, want tool_03 once", got)
	}
	last := string(reqs[3])
	for _, want := range []string{`\"name\":\"tool_09\"`, `\"total\":10`, `\"ran\":\"tool_03\"`, "steering_denied", "tool_45"} {
		if !strings.Contains(last, want) {
			t.Errorf("the transcript lacks %s:\n%s", want, last)
		}
	}
	if strings.Contains(last, `\"name\":\"tool_45\"`) {
		t.Error("the listing shows a tool the allowlist does not grant")
	}

	llm.mu.Lock()
	llm.calls = nil
	llm.mu.Unlock()
	sizes := map[string]int{}
	for _, tc := range []struct {
		key, entry string
		tools      int
	}{{"k1", `{}`, 20}, {"k-all", `{}`, 50}, {"k-all", `{"expose":"call"}`, 2}} {
		before := len(llm.requests())
		if ex := post(t, srv.url, tc.key, doc(tc.entry)); ex["status"] != "succeeded" {
			t.Fatalf("%s %s: execution = %v", tc.key, tc.entry, ex)
		}
		names, size := wireTools(t, llm.requests()[before])
		if len(names) != tc.tools {
			t.Fatalf("%s %s: %d tools sent, want %d", tc.key, tc.entry, len(names), tc.tools)
		}
		sizes[fmt.Sprint(tc.tools)] = size
	}
	t.Logf("the tools array sent to the model: 50 tools eager %d bytes (20 granted: %d), expose call %d bytes (20 granted: %d)",
		sizes["50"], sizes["20"], sizes["2"], callBytes)

	problem := postAny(t, srv.url, "k1", doc(`{"expose":"lazy"}`))
	body, _ := json.Marshal(problem)
	if problem["status"] != 422.0 || !strings.Contains(string(body), `"/workflow/connections/big/expose"`) {
		t.Fatalf("a bad expose: %s, want a 422 naming /workflow/connections/big/expose", body)
	}
}
