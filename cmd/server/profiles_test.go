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
	"time"
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
	// The read chat.thread.recent, served as a tool of its name, verified
	// over MCP.
	ex = post(t, srv.url, "k1", []byte(`{"wait":"10s","workflow":{"version":1,"connections":{"chat":{}},
		"root":{"kind":"verify","id":"seen","connection":"chat","read":"chat.thread.recent","claims":[{"expr":"any($subject.messages, .text == 'hello')"}]}}}`))
	if ex["status"] != "succeeded" {
		t.Fatalf("verify read: %v", ex)
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

// vaultProfile marks vault.put guarded; vaultNotes binds it onto the demo
// server's notes.
const (
	vaultProfile = `profile: vault
version: 1.0.0
operations:
  vault.put:
    effects: true
    guarded: true
    input: { type: object, required: [key, value], properties: { key: { type: string }, value: { type: string } } }
    output: { type: object, required: [key], properties: { key: { type: string } } }
`
	vaultNotes = `binding: vault-notes
profile: vault@^1
operations:
  vault.put:
    tool: note_put
    args: { key: args.key, value: args.value }
    result: '{"key": result.key}'
`
)

// TestProfileGuardedOperationWaitsForApproval: an operation its profile
// marks guarded parks its execution until a second principal with the
// approve role approves it, then runs; a connection whose policy allows
// it runs it at once.
func TestProfileGuardedOperationWaitsForApproval(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, body := range map[string]string{"vault.yaml": vaultProfile, "vault-notes.yaml": vaultNotes} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  vault: { binding: vault-notes, mcp: { command: %[1]q } }
  open: { binding: vault-notes, mcp: { command: %[1]q }, policy: { allow: ["vault.put"] } }
allowlists:
  default:
    connections:
      vault: { ops: ["*"] }
      open: { ops: ["*"] }
apiKeys:
  - { name: oncall, key: approver-key, allowlist: default, roles: [approve] }
`, demoBin))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1", "PATCHBAY_PROFILES_DIR": dir,
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	})
	doc := func(conn string) map[string]any {
		return map[string]any{"workflow": map[string]any{"version": 1, "connections": map[string]any{conn: map[string]any{"profile": "vault@^1"}},
			"root": map[string]any{"kind": "call", "id": "put", "connection": conn, "op": "vault.put", "args": map[string]any{"key": "k", "value": "v"}}}}
	}
	status, ex := call(t, "POST", srv.url+"/v1/executions", "k1", doc("vault"))
	if status != 202 {
		t.Fatalf("POST = %d %v", status, ex)
	}
	if got := approveParked(t, srv.url, ex["id"].(string)); got["status"] != "succeeded" {
		t.Fatalf("after approval: %v", got)
	}
	allowed := doc("open")
	allowed["wait"] = "10s"
	if ex := post(t, srv.url, "k1", mustJSON(t, allowed)); ex["status"] != "succeeded" {
		t.Fatalf("allowed by the policy: %v", ex)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// approveParked waits for execution id to ask for an approval, checks the
// principal who asked cannot decide it, approves it as a second principal
// with the approve role (approver-key), and returns the execution once it
// ends.
func approveParked(t *testing.T, url, id string) map[string]any {
	t.Helper()
	approval := ""
	for deadline := time.Now().Add(15 * time.Second); approval == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_, list := call(t, "GET", url+"/v1/approvals?state=pending", "k1", nil)
		for _, it := range list["items"].([]any) {
			if ap := it.(map[string]any); ap["execution"] == id {
				approval = ap["id"].(string)
			}
		}
	}
	if approval == "" {
		t.Fatal("the execution asked for no approval")
	}
	if _, got := call(t, "GET", url+"/v1/executions/"+id, "k1", nil); got["status"] != "waiting" {
		t.Fatalf("status while waiting = %v", got["status"])
	}
	if status, body := call(t, "POST", url+"/v1/approvals/"+approval+"/approve", "k1", nil); status != 409 {
		t.Fatalf("approval by the principal who asked = %d %v, want 409", status, body)
	}
	if status, ap := call(t, "POST", url+"/v1/approvals/"+approval+"/approve", "approver-key", nil); status != 200 || ap["decidedBy"] != "oncall" {
		t.Fatalf("approve = %d %v", status, ap)
	}
	var got map[string]any
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, got = call(t, "GET", url+"/v1/executions/"+id, "k1", nil); got["status"] != "waiting" && got["status"] != "running" && got["status"] != "queued" {
			break
		}
	}
	return got
}

// TestProfileGuardedTargetRefusedByTheServer: demo-mcp's chat refuses
// #guarded as guarded (structuredContent {"code": "guarded"}); the post
// waits for an approval and, once approved, is sent again with it.
func TestProfileGuardedTargetRefusedByTheServer(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  chat:
    mcp: { command: %q, args: ["-profile", "chat"] }
allowlists:
  default:
    connections:
      chat: { ops: ["*"] }
apiKeys:
  - { name: oncall, key: approver-key, allowlist: default, roles: [approve] }
`, demoBin))
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": cfg, "PATCHBAY_API_KEYS": "k1",
		"PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
	})
	var doc map[string]any
	if err := json.Unmarshal(typedChat(`{"profile":"chat@^1"}`, `{"channel":"#guarded","text":"hello"}`), &doc); err != nil {
		t.Fatal(err)
	}
	delete(doc, "wait")
	status, ex := call(t, "POST", srv.url+"/v1/executions", "k1", doc)
	if status != 202 {
		t.Fatalf("POST = %d %v", status, ex)
	}
	got := approveParked(t, srv.url, ex["id"].(string))
	if out, _ := got["output"].(map[string]any); got["status"] != "succeeded" || !strings.HasPrefix(fmt.Sprint(out["thread"]), "#guarded/") {
		t.Fatalf("after approval: %v", got)
	}
}
