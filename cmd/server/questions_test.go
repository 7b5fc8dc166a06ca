package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/chromiumtest"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// everythingVersion is the pinned @modelcontextprotocol/server-everything
// (as the provider's interop tests pin it).
const everythingVersion = "2026.8.31"

// questionServer runs the server on server-everything over stdio, with a
// run key (k1, principal env-1) and an approve key (k2, env-2), holding a
// call for a question at most hold.
func questionServer(t *testing.T, hold string) *replica {
	t.Helper()
	dir := npmtest.Require(t, "everything", "@modelcontextprotocol/server-everything@"+everythingVersion)
	cfg, _ := json.Marshal(map[string]any{
		"connections": map[string]any{"everything": map[string]any{"mcp": map[string]any{
			"command": npmtest.Node(t), "args": []string{filepath.Join(dir, "dist", "index.js"), "stdio"}, "timeoutMs": 60000,
		}}},
		"allowlists": map[string]any{"default": map[string]any{"connections": map[string]any{"everything": map[string]any{"ops": []string{"*"}}}}},
	})
	st := storetest.New(t)
	return oneReplica(t, st, writeConfig(t, string(cfg)), "PATCHBAY_API_KEYS=k1,k2@approve", "PATCHBAY_QUESTION_HOLD="+hold)
}

// askQuestion starts an execution whose call makes the server ask the
// form question, and returns the execution's and the question's ids.
func askQuestion(t *testing.T, addr string) (exec, question string) {
	t.Helper()
	doc := []byte(`{"workflow":{"version":1,"connections":{"everything":{}},"root":{"kind":"call","id":"ask","connection":"everything","op":"trigger-elicitation-request","args":{}}}}`)
	status, ex := post2(addr, "k1", doc)
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ex)
	}
	exec = ex["id"].(string)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		_, list := get2(addr, "k2", "/v1/questions?state=pending")
		items, _ := list["items"].([]any)
		for _, it := range items {
			q := it.(map[string]any)
			if q["execution"] == exec {
				return exec, q["id"].(string)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, ex = get2(addr, "k1", "/v1/executions/"+exec)
	t.Fatalf("no question was asked by %s: %v", exec, ex)
	return "", ""
}

func decideQuestion(t *testing.T, addr, key, id, verb string, body any) (int, map[string]any) {
	t.Helper()
	data, _ := json.Marshal(body)
	return post2path(addr, key, "/v1/questions/"+id+"/"+verb, data)
}

func post2path(addr, key, path string, body []byte) (int, map[string]any) {
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	return do2(req)
}

// TestQuestionsFromServerEverything: server-everything's elicitation tool
// asks its form while patchbay's call waits; the question is answered,
// declined or left to expire through the API, and the server receives
// each outcome once.
func TestQuestionsFromServerEverything(t *testing.T) {
	if storetest.URL(t) == "" && npmtest.CI() {
		t.Fatal("CI=true: needs PATCHBAY_TEST_REDIS_URL")
	}
	srv := questionServer(t, "3m")

	t.Run("answered", func(t *testing.T) {
		exec, id := askQuestion(t, srv.addr)
		_, q := get2(srv.addr, "k2", "/v1/questions/"+id)
		if q["mode"] != "form" || q["connection"] != "everything" || q["requestedBy"] != "env-1" || q["step"] != "ask" {
			t.Fatalf("question = %v", q)
		}
		if status, _ := decideQuestion(t, srv.addr, "k1", id, "answer", map[string]any{"content": map[string]any{"name": "Ada"}}); status == http.StatusOK {
			t.Fatal("the key whose execution asked answered its own question")
		}
		if status, p := decideQuestion(t, srv.addr, "k2", id, "answer", map[string]any{"content": map[string]any{"name": 7}}); status != http.StatusUnprocessableEntity {
			t.Fatalf("a wrongly typed answer = %d %v, want 422", status, p)
		}
		answer := map[string]any{"name": "Ada Lovelace", "check": true, "email": "ada@example.com", "integer": 7,
			"untitledSingleSelectEnum": "Joey", "titledSingleSelectEnum": "hero-3"}
		if status, p := decideQuestion(t, srv.addr, "k2", id, "answer", map[string]any{"content": answer}); status != http.StatusOK {
			t.Fatalf("answer = %d %v", status, p)
		}
		ex := waitDoneAs(t, "http://"+srv.addr, "k1", exec)
		if ex["status"] != "succeeded" || !strings.Contains(fmt.Sprint(ex["output"]), "provided the requested information") {
			t.Fatalf("execution = %v", ex)
		}
		steps, _ := ex["steps"].([]any)
		if len(steps) != 1 || steps[0].(map[string]any)["question"] != id {
			t.Errorf("the step does not name its question: %v", steps)
		}
		// The answer is not on the execution's event stream.
		events := readEvents(t, srv.addr, "k1", exec)
		if strings.Contains(events, "Ada Lovelace") || !strings.Contains(events, "question.asked") || !strings.Contains(events, "question.answered") {
			t.Errorf("events:\n%s", events)
		}
		if status, _ := decideQuestion(t, srv.addr, "k2", id, "decline", map[string]any{}); status != http.StatusConflict {
			t.Errorf("deciding an answered question again = %d, want 409", status)
		}
	})

	t.Run("declined", func(t *testing.T) {
		exec, id := askQuestion(t, srv.addr)
		if status, p := decideQuestion(t, srv.addr, "k2", id, "decline", map[string]any{"reason": "not today"}); status != http.StatusOK {
			t.Fatalf("decline = %d %v", status, p)
		}
		ex := waitDoneAs(t, "http://"+srv.addr, "k1", exec)
		if ex["status"] != "succeeded" || !strings.Contains(fmt.Sprint(ex["output"]), "declined") {
			t.Fatalf("execution = %v", ex)
		}
	})
}

// TestQuestionExpires: a question nobody answers within
// PATCHBAY_QUESTION_HOLD expires, and the server is told it was declined.
func TestQuestionExpires(t *testing.T) {
	if storetest.URL(t) == "" && npmtest.CI() {
		t.Fatal("CI=true: needs PATCHBAY_TEST_REDIS_URL")
	}
	srv := questionServer(t, "2s")
	exec, id := askQuestion(t, srv.addr)
	ex := waitDoneAs(t, "http://"+srv.addr, "k1", exec)
	if ex["status"] != "succeeded" || !strings.Contains(fmt.Sprint(ex["output"]), "declined") {
		out, _ := os.ReadFile(srv.logPath)
		t.Fatalf("execution = %v; log:\n%s", ex, out)
	}
	if _, q := get2(srv.addr, "k2", "/v1/questions/"+id); q["state"] != "expired" {
		t.Errorf("question = %v, want expired", q)
	}
}

// readEvents reads an execution's event stream (it has ended) as text.
func readEvents(t *testing.T, addr, key, exec string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/executions/"+exec+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return buf.String()
}

// askingServer is a 2026-07-28 MCP server whose tools ask their question
// as an input_required result (multi round-trip): "pick" a form patchbay
// puts to a person, "signup" a form asking for a password, which patchbay
// declines without asking anyone. It counts the answers it receives.
func askingServer(t *testing.T) (url string, answers func() []string) {
	t.Helper()
	var mu sync.Mutex
	var got []string
	s := server.NewMCPServer("asking", "1.0.0", server.WithToolCapabilities(false))
	ask := func(name string, schema map[string]any) {
		s.AddTool(mcp.NewTool(name, mcp.WithDestructiveHintAnnotation(false), mcp.WithOpenWorldHintAnnotation(false)),
			func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				if res := server.ElicitationResponse(req.Params.InputResponses, "q"); res != nil {
					mu.Lock()
					got = append(got, fmt.Sprintf("%s %s %v", name, res.Action, res.Content))
					mu.Unlock()
					return mcp.NewToolResultText(fmt.Sprintf("%s: %s %v", name, res.Action, res.Content)), nil
				}
				return server.NewInputRequestBuilder("round-1").Elicit("q", mcp.ElicitationParams{
					Message: "Please fill this in for " + name, RequestedSchema: schema,
				}).ToolResult(), nil
			})
	}
	ask("pick", map[string]any{"type": "object", "properties": map[string]any{
		"color": map[string]any{"type": "string", "enum": []any{"red", "green"}}}, "required": []any{"color"}})
	ask("signup", map[string]any{"type": "object", "properties": map[string]any{
		"user": map[string]any{"type": "string"}, "password": map[string]any{"type": "string", "title": "Password"}}})
	ts := httptest.NewServer(server.NewStreamableHTTPServer(s))
	t.Cleanup(ts.Close)
	return ts.URL + "/mcp", func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// TestQuestionsOverMultiRoundTrip: a 2026-07-28 server's input_required
// question is put to a person and its answer sent once; a form asking for
// a password is declined without reaching anyone.
func TestQuestionsOverMultiRoundTrip(t *testing.T) {
	if storetest.URL(t) == "" && npmtest.CI() {
		t.Fatal("CI=true: needs PATCHBAY_TEST_REDIS_URL")
	}
	url, answers := askingServer(t)
	cfg, _ := json.Marshal(map[string]any{
		"connections": map[string]any{"asking": map[string]any{"mcp": map[string]any{"type": "http", "url": url}}},
		"allowlists":  map[string]any{"default": map[string]any{"connections": map[string]any{"asking": map[string]any{"ops": []string{"*"}}}}},
	})
	srv := oneReplica(t, storetest.New(t), writeConfig(t, string(cfg)), "PATCHBAY_API_KEYS=k1,k2@approve")
	call := func(op string) string {
		doc := fmt.Sprintf(`{"workflow":{"version":1,"connections":{"asking":{}},"root":{"kind":"call","id":"ask","connection":"asking","op":%q,"args":{}}}}`, op)
		status, ex := post2(srv.addr, "k1", []byte(doc))
		if status != http.StatusAccepted {
			t.Fatalf("POST = %d %v", status, ex)
		}
		return ex["id"].(string)
	}

	exec := call("signup")
	ex := waitDoneAs(t, "http://"+srv.addr, "k1", exec)
	if ex["status"] != "succeeded" || !strings.Contains(fmt.Sprint(ex["output"]), "signup: decline") {
		t.Fatalf("signup = %v, want the server told decline", ex)
	}
	if _, list := get2(srv.addr, "k2", "/v1/questions"); len(list["items"].([]any)) != 0 {
		t.Errorf("a password form reached the queue: %v", list)
	}
	if events := readEvents(t, srv.addr, "k1", exec); !strings.Contains(events, "question.declined") || !strings.Contains(events, "password") {
		t.Errorf("no question.declined event saying why:\n%s", events)
	}

	exec = call("pick")
	_, id := waitQuestion(t, srv.addr, exec)
	if status, p := decideQuestion(t, srv.addr, "k2", id, "answer", map[string]any{"content": map[string]any{"color": "green"}}); status != http.StatusOK {
		t.Fatalf("answer = %d %v", status, p)
	}
	ex = waitDoneAs(t, "http://"+srv.addr, "k1", exec)
	if ex["status"] != "succeeded" || !strings.Contains(fmt.Sprint(ex["output"]), "pick: accept map[color:green]") {
		t.Fatalf("pick = %v", ex)
	}
	if got := answers(); len(got) != 2 || got[1] != "pick accept map[color:green]" {
		t.Errorf("the server received %v, want the decline and then the answer, once each", got)
	}
}

// waitQuestion waits for the execution's pending question.
func waitQuestion(t *testing.T, addr, exec string) (map[string]any, string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		_, list := get2(addr, "k2", "/v1/questions?state=pending")
		items, _ := list["items"].([]any)
		for _, it := range items {
			if q := it.(map[string]any); q["execution"] == exec {
				return q, q["id"].(string)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no question was asked by %s", exec)
	return nil, ""
}

// TestAParkedQuestionSurvivesAKill: a 2026-07-28 server's question parks
// the run (no worker held: the execution is waiting); the server process
// is killed (SIGKILL) and started again; the answer given to the new
// process resumes the run, and the server receives it once, with its
// requestState.
func TestAParkedQuestionSurvivesAKill(t *testing.T) {
	if storetest.URL(t) == "" {
		if npmtest.CI() {
			t.Fatal("CI=true: needs PATCHBAY_TEST_REDIS_URL")
		}
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") that outlives the process")
	}
	url, answers := askingServer(t)
	cfg, _ := json.Marshal(map[string]any{
		"connections": map[string]any{"asking": map[string]any{"mcp": map[string]any{"type": "http", "url": url}}},
		"allowlists":  map[string]any{"default": map[string]any{"connections": map[string]any{"asking": map[string]any{"ops": []string{"*"}}}}},
	})
	srv := oneReplica(t, storetest.New(t), writeConfig(t, string(cfg)), "PATCHBAY_API_KEYS=k1,k2@approve")
	doc := `{"workflow":{"version":1,"connections":{"asking":{}},"root":{"kind":"call","id":"ask","connection":"asking","op":"pick","args":{}}}}`
	status, ex := post2(srv.addr, "k1", []byte(doc))
	if status != http.StatusAccepted {
		t.Fatalf("POST = %d %v", status, ex)
	}
	exec := ex["id"].(string)
	_, id := waitQuestion(t, srv.addr, exec)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ex = get2(srv.addr, "k1", "/v1/executions/"+exec); ex["status"] == "waiting" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution = %v, want waiting (parked on its question)", ex)
		}
		time.Sleep(50 * time.Millisecond)
	}
	srv.kill()
	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	if status, p := decideQuestion(t, srv.addr, "k2", id, "answer", map[string]any{"content": map[string]any{"color": "red"}}); status != http.StatusOK {
		t.Fatalf("answer = %d %v", status, p)
	}
	ex = waitDoneAs(t, "http://"+srv.addr, "k1", exec)
	if ex["status"] != "succeeded" || !strings.Contains(fmt.Sprint(ex["output"]), "pick: accept map[color:red]") {
		t.Fatalf("execution = %v", ex)
	}
	if got := answers(); len(got) != 1 || got[0] != "pick accept map[color:red]" {
		t.Errorf("the server received %v, want the answer once", got)
	}
}

// TestQuestionAnsweredInTheAdminUI: server-everything's form, asked while
// patchbay's call waits, is answered by a person in the admin UI (headless
// Chromium, signed in with an approve key): the form is rendered from the
// server's schema, and the answer reaches the server.
func TestQuestionAnsweredInTheAdminUI(t *testing.T) {
	if storetest.URL(t) == "" && npmtest.CI() {
		t.Fatal("CI=true: needs PATCHBAY_TEST_REDIS_URL")
	}
	chromiumtest.Path(t)
	srv := questionServer(t, "3m")
	exec, id := askQuestion(t, srv.addr)
	card := `article[data-question="` + id + `"]`
	ctx := chromiumtest.Context(t)
	err := chromedp.Run(ctx,
		chromedp.Navigate("http://"+srv.addr+"/admin/sign-in?next=/admin/questions"),
		chromedp.SendKeys(`input[name="token"]`, "k2", chromedp.ByQuery),
		chromedp.Submit(`input[name="token"]`, chromedp.ByQuery),
		chromedp.WaitVisible(card, chromedp.ByQuery),
		chromedp.SendKeys(card+` input[name="field:name"]`, "Grace Hopper", chromedp.ByQuery),
		chromedp.Click(card+` form.answer button.primary`, chromedp.ByQuery),
		chromedp.WaitVisible(`.flash`, chromedp.ByQuery),
	)
	if err != nil {
		t.Fatal(err)
	}
	ex := waitDoneAs(t, "http://"+srv.addr, "k1", exec)
	if ex["status"] != "succeeded" || !strings.Contains(fmt.Sprint(ex["output"]), "provided the requested information") {
		t.Fatalf("execution = %v", ex)
	}
	if _, q := get2(srv.addr, "k2", "/v1/questions/"+id); q["state"] != "answered" || q["answeredBy"] != "env-2" {
		t.Errorf("question = %v, want answered by env-2", q)
	}
}
