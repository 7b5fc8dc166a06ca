package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// fakeLLM speaks the Anthropic Messages and OpenAI Chat Completions
// streaming wire formats, after the providers' documented examples. Round
// 1 of a turn (no assistant message in the transcript yet) asks for
// counter_effect, streamed in fragments; round 2 answers with text.
type fakeLLM struct {
	*httptest.Server
	key string // the API key the Anthropic route expects

	mu        sync.Mutex
	rounds    map[string]int // "<wire> <round>" → requests
	badAuth   int
	sawResult bool // round 2 carried the tool's result
	// hold, when set, keeps round-2 requests open until it is closed or
	// the client goes away; held is signalled for each one held.
	hold chan struct{}
	held chan struct{}
	// tool and args, when set, are the tool call of an OpenAI round 1
	// instead of counter_effect {"step": "one"}.
	tool, args string
}

func newFakeLLM(t *testing.T, key string) *fakeLLM {
	f := &fakeLLM{key: key, rounds: map[string]int{}, held: make(chan struct{}, 8)}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeLLM) count(wire string, round int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rounds[fmt.Sprintf("%s %d", wire, round)]
}

// requestRound is the round of a turn a model request is: one more than
// the assistant messages in its transcript (either wire format).
func requestRound(raw []byte) int {
	var body struct {
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(raw, &body)
	round := 1
	for _, m := range body.Messages {
		if m.Role == "assistant" {
			round++
		}
	}
	return round
}

// openaiChunk is one Chat Completions stream frame carrying delta.
func openaiChunk(delta, finish string) string {
	fin := "null"
	if finish != "" {
		fin = `"` + finish + `"`
	}
	return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1694268190,"model":"llama3","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + fin + `}]}`
}

func (f *fakeLLM) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(raw, &body)
	round := requestRound(raw)
	wire := "openai"
	if r.URL.Path == "/v1/messages" {
		wire = "anthropic"
	}
	f.mu.Lock()
	f.rounds[fmt.Sprintf("%s %d", wire, round)]++
	if wire == "anthropic" && r.Header.Get("X-Api-Key") != f.key {
		f.badAuth++
	}
	if round == 2 && (strings.Contains(string(raw), `\"effect\"`) || strings.Contains(string(raw), "done")) {
		f.sawResult = true
	}
	hold := f.hold
	f.mu.Unlock()
	if round == 2 && hold != nil {
		f.held <- struct{}{}
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	if !body.Stream {
		http.Error(w, `{"error":{"message":"stream must be true"}}`, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for _, frame := range f.frames(wire, round) {
		fmt.Fprint(w, frame, "\n\n")
		fl.Flush()
	}
}

func (f *fakeLLM) frames(wire string, round int) []string {
	ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data }
	chunk := openaiChunk
	usage := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1694268190,"model":"llama3","choices":[],"usage":{"prompt_tokens":50,"completion_tokens":9,"total_tokens":59}}`
	switch {
	case wire == "anthropic" && round == 1:
		return []string{
			ev("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":50,"output_tokens":1}}}`),
			ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
			ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Running the effect."}}`),
			ev("content_block_stop", `{"type":"content_block_stop","index":0}`),
			ev("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_01","name":"counter_effect","input":{}}}`),
			ev("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"step\":"}}`),
			ev("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" \"one\"}"}}`),
			ev("content_block_stop", `{"type":"content_block_stop","index":1}`),
			ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}`),
			ev("message_stop", `{"type":"message_stop"}`),
		}
	case wire == "anthropic":
		return []string{
			ev("message_start", `{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":80,"output_tokens":1}}}`),
			ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
			ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"The effect "}}`),
			ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ran once."}}`),
			ev("content_block_stop", `{"type":"content_block_stop","index":0}`),
			ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":5}}`),
			ev("message_stop", `{"type":"message_stop"}`),
		}
	case round == 1 && f.tool != "":
		return []string{
			chunk(`{"role":"assistant","content":"Running it."}`, ""),
			chunk(`{"tool_calls":[{"index":0,"id":"call_01","type":"function","function":{"name":"`+f.tool+`","arguments":""}}]}`, ""),
			chunk(`{"tool_calls":[{"index":0,"function":{"arguments":`+strconv.Quote(f.args)+`}}]}`, ""),
			chunk(`{}`, "tool_calls"),
			usage,
			"data: [DONE]",
		}
	case round == 1:
		return []string{
			chunk(`{"role":"assistant","content":"Running the effect."}`, ""),
			chunk(`{"tool_calls":[{"index":0,"id":"call_01","type":"function","function":{"name":"counter_effect","arguments":""}}]}`, ""),
			chunk(`{"tool_calls":[{"index":0,"function":{"arguments":"{\"step\":"}}]}`, ""),
			chunk(`{"tool_calls":[{"index":0,"function":{"arguments":" \"one\"}"}}]}`, ""),
			chunk(`{}`, "tool_calls"),
			usage,
			"data: [DONE]",
		}
	default:
		return []string{
			chunk(`{"role":"assistant","content":"The effect "}`, ""),
			chunk(`{"content":"ran once."}`, ""),
			chunk(`{}`, "stop"),
			usage,
			"data: [DONE]",
		}
	}
}

const modelKey = "sk-ant-test-9f8e7d6c5b4a3210"

// TestAgentOverBothWireFormats runs the agent shorthand against a hosted
// (Anthropic, key from the secret chain) and a local (OpenAI-compatible)
// provider through an MCP connection whose operation needs approval: the
// turn waits, is approved, calls the server once and answers.
func TestAgentOverBothWireFormats(t *testing.T) {
	t.Parallel()
	llm := newFakeLLM(t, modelKey)
	count, mcpSrv := newCounter()
	t.Cleanup(mcpSrv.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  counter: { mcp: { type: http, url: %q }, policy: { approve: [effect] } }
models:
  claude: { type: anthropic, apiKey: "${secret:anthropic.key}", baseURL: %q }
  local: { type: openai, baseURL: %q }
allowlists:
  default: { connections: { counter: { ops: ["*"] } } }
apiKeys:
  - { name: oncall, key: approver-key, allowlist: default, roles: [approve] }
`, mcpSrv.URL+"/mcp", llm.URL, llm.URL+"/v1"))
	for mode, redisURL := range redisModes(t) {
		t.Run(mode, func(t *testing.T) {
			srv := start(t, map[string]string{
				"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
				"REDIS_URL": redisURL, "PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
				"PATCHBAY_SECRET_ANTHROPIC_KEY": modelKey,
			})
			for _, tc := range []struct{ wire, model string }{{"anthropic", "claude/claude-sonnet-4-5"}, {"openai", "local/llama3"}} {
				t.Run(tc.wire, func(t *testing.T) {
					body := fmt.Sprintf(`{"agent":{"model":%q,"instructions":"Run the effect once."},"input":%q}`, tc.model, "go "+tc.wire+" "+mode)
					status, ex := post2(strings.TrimPrefix(srv.url, "http://"), "k1", []byte(body))
					if status != http.StatusAccepted {
						t.Fatalf("POST = %d %v", status, ex)
					}
					id := ex["id"].(string)
					approveWhenAsked(t, srv.url, id)
					ex = waitDone(t, srv.url, id)
					if ex["status"] != "succeeded" || ex["output"] != "The effect ran once." {
						t.Fatalf("execution = %v", ex)
					}
					raw, _ := json.Marshal(ex)
					if strings.Contains(string(raw), modelKey) {
						t.Fatal("the model API key shows in the execution")
					}
					count.mu.Lock()
					n := count.sends[id+":agent/round:1/tool:"+map[string]string{"anthropic": "toolu_01", "openai": "call_01"}[tc.wire]]
					count.mu.Unlock()
					if n != 1 {
						t.Fatalf("effect sent %d times, want 1", n)
					}
				})
			}
		})
	}
	llm.mu.Lock()
	defer llm.mu.Unlock()
	if llm.badAuth != 0 || !llm.sawResult {
		t.Fatalf("bad auth %d, saw tool result %v", llm.badAuth, llm.sawResult)
	}
}

func approveWhenAsked(t *testing.T, base, exec string) {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_, list := get2(addr, "k1", "/v1/approvals?state=pending")
		items, _ := list["items"].([]any)
		for _, it := range items {
			ap := it.(map[string]any)
			if ap["execution"] == exec {
				req, _ := http.NewRequest("POST", base+"/v1/approvals/"+ap["id"].(string)+"/approve", nil)
				req.Header.Set("Authorization", "Bearer approver-key") // a second person
				if status, _ := do2(req); status != 200 {
					t.Fatalf("approve = %d", status)
				}
				return
			}
		}
	}
	t.Fatal("no approval was asked for")
}

func waitDone(t *testing.T, base, id string) map[string]any {
	t.Helper()
	return waitDoneAs(t, base, "k1", id)
}

// waitDoneAs waits, reading as key, for the execution to finish.
func waitDoneAs(t *testing.T, base, key, id string) map[string]any {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	var ex map[string]any
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var status int
		if status, ex = get2(addr, key, "/v1/executions/"+id); status == 200 {
			switch ex["status"] {
			case "succeeded", "failed", "cancelled":
				return ex
			}
		}
	}
	t.Fatalf("execution %s not finished: %v", id, ex)
	return nil
}

// TestAgentResumesAfterKill kills the server (SIGKILL) while round 2 of a
// turn is streaming, after round 1 and its tool call finished. The
// restarted server resumes from the ledger: round 1 is not paid for again
// and the tool call is not sent again.
func TestAgentResumesAfterKill(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") that outlives the process")
	}
	st := storetest.New(t)
	llm := newFakeLLM(t, "")
	llm.hold = make(chan struct{})
	count, mcpSrv := newCounter()
	t.Cleanup(mcpSrv.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  counter: { mcp: { type: http, url: %q } }
models:
  local: { type: openai, baseURL: %q }
allowlists:
  default: { connections: { counter: { ops: ["*"] } } }
`, mcpSrv.URL+"/mcp", llm.URL+"/v1"))
	srv := oneReplica(t, st, cfg)
	addr := srv.addr

	status, ex := post2(addr, "k1", []byte(`{"agent":{"model":"local/llama3","tools":[{"connection":"counter"}]},"input":"go"}`))
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ex)
	}
	id := ex["id"].(string)
	select {
	case <-llm.held: // round 1 and its tool call are done; round 2 is streaming
	case <-time.After(20 * time.Second):
		out, _ := os.ReadFile(srv.logPath)
		t.Fatalf("round 2 never started; log:\n%s", out)
	}
	srv.kill()
	close(llm.hold)
	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	ex = waitDone(t, "http://"+addr, id)
	if ex["status"] != "succeeded" || ex["output"] != "The effect ran once." {
		t.Fatalf("execution = %v", ex)
	}
	if n := llm.count("openai", 1); n != 1 {
		t.Fatalf("round 1 was sent %d times, want 1 (a finished round is not paid for again)", n)
	}
	if n := llm.count("openai", 2); n != 2 {
		t.Fatalf("round 2 was sent %d times, want 2 (the one cut by the kill, then once more)", n)
	}
	count.mu.Lock()
	defer count.mu.Unlock()
	if n := count.sends[id+":agent/round:1/tool:call_01"]; n != 1 {
		t.Fatalf("the tool call was sent %d times, want 1; sends %v", n, count.sends)
	}
}
