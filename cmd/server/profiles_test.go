package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// typedChat is a document whose one step posts through chat@1.
func typedChat(entry, args string) []byte {
	return []byte(`{"wait":"10s","workflow":{"version":1,"connections":{"chat":` + entry + `},
		"root":{"kind":"call","id":"post","connection":"chat","op":"chat.post","args":` + args + `}}}`)
}

// TestTypedStepsOverTheDemoChatServer: demo-mcp -profile chat declares
// chat@1; a document naming the profile runs chat.post, and one that
// breaks the profile is refused at submit or fails its step.
func TestTypedStepsOverTheDemoChatServer(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  chat:
    mcp: { command: %q, args: ["-profile", "chat"] }
allowlists:
  default:
    connections:
      chat: { ops: ["*"] }
`, demoBin))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	})
	req, _ := http.NewRequest("GET", srv.url+"/v1/connections/chat", nil)
	req.Header.Set("Authorization", "Bearer k1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var status struct {
		Profiles []map[string]any `json:"profiles"`
	}
	err = json.NewDecoder(resp.Body).Decode(&status)
	resp.Body.Close()
	if err != nil || len(status.Profiles) != 1 || status.Profiles[0]["name"] != "chat" || status.Profiles[0]["version"] != "1.0.0" {
		t.Fatalf("connection status profiles = %v (%v)", status.Profiles, err)
	}
	ex := post(t, srv.url, "k1", typedChat(`{"profile":"chat@^1"}`, `{"channel":"#general","text":"hello"}`))
	if ex["status"] != "succeeded" {
		t.Fatalf("typed post: %v", ex)
	}
	if out, _ := ex["output"].(map[string]any); !strings.HasPrefix(fmt.Sprint(out["thread"]), "#general/") {
		t.Fatalf("output = %v", ex["output"])
	}
	ex = postAny(t, srv.url, "k1", typedChat(`{"profile":"chat@^1"}`, `{"channel":"#broken","text":"hello"}`))
	errObj, _ := ex["error"].(map[string]any)
	if ex["status"] != "failed" || errObj["code"] != "step_failed" || !strings.Contains(fmt.Sprint(errObj["message"]), "contradicts chat@1.0.0") {
		t.Fatalf("contradicting result: %v", ex)
	}
	for _, tc := range []struct{ entry, args, pointer string }{
		{`{"profile":"chat@^2"}`, `{"channel":"#a","text":"x"}`, "/workflow/connections/chat/profile"},
		{`{"profile":"chat@^1"}`, `{"channel":"#a"}`, "/workflow/root/args"},
	} {
		problem := postAny(t, srv.url, "k1", typedChat(tc.entry, tc.args))
		body, _ := json.Marshal(problem)
		if problem["status"] != 422.0 || !strings.Contains(string(body), `"`+tc.pointer+`"`) {
			t.Errorf("%s %s: %s, want a 422 naming %s", tc.entry, tc.args, body, tc.pointer)
		}
	}
}

func TestBadProfileFileStopsTheServer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "fax.yaml")
	if err := os.WriteFile(path, []byte("profile: fax\nversion: 1\noperations: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), nil, envMap{"PATCHBAY_PROFILES_DIR": dir, "PATCHBAY_ADDR": "127.0.0.1:0"}.get, io.Discard)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "/version") {
		t.Fatalf("run = %v, want an error naming %s", err, path)
	}
}

func TestUnknownBindingStopsTheServer(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, fmt.Sprintf("connections:\n  web:\n    binding: nope\n    mcp: { command: %q }\n", demoBin))
	err := run(context.Background(), nil, envMap{"PATCHBAY_CONFIG": cfg, "PATCHBAY_ADDR": "127.0.0.1:0"}.get, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `connections.web.binding: no binding named "nope" (known: playwright-browser)`) {
		t.Fatalf("run = %v", err)
	}
}

// notesChat binds chat@1 onto the demo server's notes: a post stores the
// text under the channel's name.
const notesChat = `binding: notes-chat
profile: chat@^1
server: demo-mcp
operations:
  chat.post:
    tool: note_put
    args: { key: args.channel, value: args.text }
    result: '{"message": result.key, "thread": result.key}'
  chat.reply:
    tool: note_put
    args: { key: args.thread, value: args.text }
    result: '{"message": result.key, "thread": result.key}'
`

// TestBindingFromTheProfilesDirectory: a binding file in
// PATCHBAY_PROFILES_DIR maps chat@1 onto a server that declares nothing;
// a document written against chat@1 runs on it.
func TestBindingFromTheProfilesDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes-chat.yaml"), []byte(notesChat), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  chat:
    binding: notes-chat
    mcp: { command: %q }
allowlists:
  default:
    connections:
      chat: { ops: ["chat.*", "note_get"] }
`, demoBin))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1", "PATCHBAY_PROFILES_DIR": dir,
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	})
	ex := post(t, srv.url, "k1", []byte(`{"wait":"10s","workflow":{"version":1,"connections":{"chat":{"profile":"chat@^1"}},
		"root":{"kind":"sequence","id":"main","steps":[
			{"kind":"call","id":"post","connection":"chat","op":"chat.post","args":{"channel":"general","text":"hello"}},
			{"kind":"call","id":"read","connection":"chat","op":"note_get","args":{"key":{"$expr":"$steps.post.thread"}}}]}}}`))
	if ex["status"] != "succeeded" {
		t.Fatalf("bound post: %v", ex)
	}
	steps := ex["steps"].([]any)
	if out := steps[0].(map[string]any)["output"].(map[string]any); out["thread"] != "general" {
		t.Fatalf("chat.post output = %v", out)
	}
	if out := fmt.Sprint(steps[1].(map[string]any)["output"]); !strings.Contains(out, "hello") {
		t.Fatalf("note_get output = %v", out)
	}
}
