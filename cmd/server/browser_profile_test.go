package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// greeterPage is a form: a name field and a button that greets by
// setting the page title.
const greeterPage = `<!doctype html><title>Greeter</title><h1>Greeter</h1>
<label>Name <input id=name></label>
<button onclick="document.title = 'Hello, ' + document.getElementById('name').value; document.getElementById('out').textContent = document.title">Greet</button>
<p id=out></p>`

// refOf is an expression over a ui.tree read (at path) giving the ref of
// the first element whose line mentions element.
func refOf(path, element string) map[string]any {
	return map[string]any{"$expr": fmt.Sprintf(`let line = filter(split(%s, "\n"), {# contains %q})[0]; split(split(line, "[ref=")[1], "]")[0]`, path, element)}
}

// browserLLM is a model (OpenAI wire) that drives the greeter: round 1
// asks for ui.tree through app_look, round 2 fills the name and taps the
// button by the refs it read, round 3 answers. It keeps every request.
type browserLLM struct {
	*httptest.Server
	mu       sync.Mutex
	requests []string
}

var refIn = func(element string) *regexp.Regexp {
	return regexp.MustCompile(regexp.QuoteMeta(element) + `[^\n]*?\[ref=([a-z0-9]+)\]`)
}

func (f *browserLLM) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body struct {
		Messages []struct {
			Role    string `json:"role"`
			Content any    `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(raw, &body)
	f.mu.Lock()
	f.requests = append(f.requests, string(raw))
	f.mu.Unlock()
	round, tree := 1, ""
	for _, m := range body.Messages {
		switch m.Role {
		case "assistant":
			round++
		case "tool":
			tree = fmt.Sprint(m.Content)
		}
	}
	call := func(id, name string, args map[string]any) string {
		a, _ := json.Marshal(args)
		b, _ := json.Marshal(map[string]any{"index": 0, "id": id, "type": "function", "function": map[string]any{"name": name, "arguments": string(a)}})
		return string(b)
	}
	var delta, finish string
	switch round {
	case 1:
		delta, finish = `{"role":"assistant","tool_calls":[`+call("call_look", "app_look", map[string]any{"read": "ui.tree"})+`]}`, "tool_calls"
	case 2:
		name, button := refIn(`textbox "Name"`).FindStringSubmatch(tree), refIn(`button "Greet"`).FindStringSubmatch(tree)
		if name == nil || button == nil {
			http.Error(w, "no refs in the tree: "+tree, http.StatusBadRequest)
			return
		}
		fill := call("call_fill", "app_ui_fill", map[string]any{"element": `textbox "Name"`, "ref": name[1], "text": "Ada"})
		click := strings.Replace(call("call_tap", "app_ui_click", map[string]any{"element": `button "Greet"`, "ref": button[1]}), `"index":0`, `"index":1`, 1)
		delta, finish = `{"role":"assistant","tool_calls":[`+fill+`,`+click+`]}`, "tool_calls"
	default:
		delta, finish = `{"role":"assistant","content":"Greeted Ada."}`, "stop"
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, chunk := range []string{
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":` + delta + `,"finish_reason":null}]}`,
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"` + finish + `"}]}`,
		"[DONE]",
	} {
		fmt.Fprint(w, "data: ", chunk, "\n\n")
	}
}

// TestBrowserProfileOverThePlaywrightPool: a pool of @playwright/mcp
// browsers (real chromium) bound to browser@1 by the shipped binding.
// Documents name only browser@1's operations and reads, never a
// Playwright tool: a workflow opens a local page, fills the form, taps
// the button and verifies browser.page.summary; an agent turn sees the
// page summary before every round (a diff after the first), asks for
// ui.tree through app_look, and fills and taps by the refs it read.
func TestBrowserProfileOverThePlaywrightPool(t *testing.T) {
	t.Parallel()
	node, cli, chromium := playwrightParts(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, greeterPage)
	}))
	t.Cleanup(page.Close)
	llm := &browserLLM{}
	llm.Server = httptest.NewServer(http.HandlerFunc(llm.serve))
	t.Cleanup(llm.Close)
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  browsers:
    binding: playwright-browser
    mcp:
      command: %q
      args: [%q, --browser, chromium, --executable-path, %q, --headless, --isolated, --no-sandbox, --output-dir, %q]
      env: { HOME: %q }
      timeoutMs: 60000
      requestTimeoutMs: 60000
    pool: { max: 2, waitMs: 60000 }
models:
  local: { type: openai, baseURL: %q }
allowlists:
  default:
    connections:
      browsers: { ops: ["navigate", "ui.*", "browser.*"] }
`, node, cli, chromium, t.TempDir(), t.TempDir(), llm.URL+"/v1"))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":", "REDIS_URL": os.Getenv("PATCHBAY_TEST_REDIS_URL"),
	})
	entry := map[string]any{"app": map[string]any{"from": "browsers", "profile": "browser@^1", "look": map[string]any{"ui.tree": "ask"}}}
	open := map[string]any{"kind": "call", "id": "open", "connection": "app", "op": "navigate", "args": map[string]any{"url": page.URL + "/greeter"}}
	run := func(t *testing.T, root map[string]any) map[string]any {
		t.Helper()
		status, ex := post2(strings.TrimPrefix(srv.url, "http://"), "k1", mustJSON(t, map[string]any{"workflow": map[string]any{"version": 1, "connections": entry, "root": root}}))
		if status != http.StatusAccepted {
			t.Fatalf("POST = %d %v", status, ex)
		}
		ex = waitLong(t, srv.url, ex["id"].(string))
		if ex["status"] != "succeeded" {
			t.Fatalf("execution: %v\nserver log:\n%s", ex, srv.output)
		}
		return ex
	}

	t.Run("workflow", func(t *testing.T) {
		ex := run(t, map[string]any{"kind": "sequence", "id": "main", "steps": []any{
			open,
			map[string]any{"kind": "verify", "id": "form", "connection": "app", "read": "ui.tree", "claims": []any{map[string]any{"at": "tree", "contains": `textbox "Name"`}}},
			map[string]any{"kind": "call", "id": "fill", "connection": "app", "op": "ui.fill", "args": map[string]any{"element": `textbox "Name"`, "ref": refOf("$steps.form.tree", `textbox "Name"`), "text": "Ada"}},
			map[string]any{"kind": "call", "id": "tap", "connection": "app", "op": "ui.click", "args": map[string]any{"element": `button "Greet"`, "ref": refOf("$steps.form.tree", `button "Greet"`)}},
			map[string]any{"kind": "verify", "id": "greeted", "connection": "app", "read": "browser.page.summary", "timeoutMs": 15000,
				"claims": []any{map[string]any{"at": "title", "equals": "Hello, Ada"}, map[string]any{"at": "url", "contains": "/greeter"}}},
		}})
		if out, _ := ex["output"].(map[string]any); out["title"] != "Hello, Ada" {
			t.Fatalf("output = %v", ex["output"])
		}
	})

	t.Run("agent", func(t *testing.T) {
		ex := run(t, map[string]any{"kind": "sequence", "id": "main", "steps": []any{
			open,
			map[string]any{"kind": "model", "id": "agent", "model": "local/m", "instructions": "Greet Ada on the page.", "until": map[string]any{"maxRounds": 5}},
		}})
		if ex["output"] != "Greeted Ada." {
			t.Fatalf("output = %v", ex["output"])
		}
		llm.mu.Lock()
		reqs := append([]string(nil), llm.requests...)
		llm.mu.Unlock()
		if len(reqs) != 3 {
			t.Fatalf("%d model requests, want 3", len(reqs))
		}
		// The summary before every round: whole, unchanged (round 1 only
		// looked), then the diff the tap made.
		for i, want := range []string{`[app browser.page.summary]`, `[app browser.page.summary: unchanged]`, `[app browser.page.summary: changes since last shown]`} {
			if !strings.Contains(reqs[i], want) {
				t.Errorf("round %d does not show %s: %.2000s", i+1, want, reqs[i])
			}
		}
		_, diff, _ := strings.Cut(reqs[2], `[app browser.page.summary: changes since last shown]`)
		diff, _, _ = strings.Cut(diff, `"`)
		if !strings.Contains(diff, `\n- `) || !strings.Contains(diff, `\n+ `) || !strings.Contains(diff, "Hello, Ada") {
			t.Errorf("round 3's summary diff does not show the new title: %q", diff)
		}
		t.Logf("round 3 saw the summary as %s", diff)
		if strings.Contains(reqs[0], "[app ui.tree") || !strings.Contains(reqs[1], `textbox \"Name\"`) {
			t.Errorf("ui.tree: shown unasked in round 1, or not answered through app_look in round 2")
		}
		if strings.Contains(reqs[0], "browser_") || !strings.Contains(reqs[0], `"app_look"`) || !strings.Contains(reqs[0], `"app_ui_click"`) {
			t.Errorf("round 1's tools: want browser@1's and app_look, no Playwright tool: %.3000s", reqs[0])
		}
	})
}

// waitLong waits up to two minutes (a browser on a loaded machine) for
// the execution to end.
func waitLong(t *testing.T, base, id string) map[string]any {
	t.Helper()
	var ex map[string]any
	until(t, "execution "+id+" to end", 2*time.Minute, func() bool {
		_, ex = get2(strings.TrimPrefix(base, "http://"), "k1", "/v1/executions/"+id)
		return ex["status"] == "succeeded" || ex["status"] == "failed" || ex["status"] == "cancelled"
	})
	return ex
}
