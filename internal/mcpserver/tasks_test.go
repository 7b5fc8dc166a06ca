package mcpserver_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
)

// The wire of the Tasks feature, exactly as each era's spec words it,
// sent by hand: the TypeScript clients (interop_test.go) drive the same
// flows through their own task APIs.

// rpcMsg is one JSON-RPC answer.
type rpcMsg struct {
	Result map[string]any `json:"result"`
	Error  *struct {
		Code    int            `json:"code"`
		Message string         `json:"message"`
		Data    map[string]any `json:"data"`
	} `json:"error"`
}

// wire is a hand-written client of one era, as one caller.
type wire struct {
	t       *testing.T
	b       *bundle
	key     string
	modern  bool
	session string
	// tasks: a 2026-era client declares the extension.
	tasks bool
	// elicitURL: a 2026-era client takes URL elicitations.
	elicitURL bool
}

func newWire(t *testing.T, b *bundle, key string, modern bool) *wire {
	t.Helper()
	w := &wire{t: t, b: b, key: key, modern: modern, tasks: modern}
	if !modern {
		_, init := w.send("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
			"clientInfo": map[string]any{"name": "wire", "version": "1"}}, nil)
		if init.Error != nil {
			t.Fatalf("initialize: %+v", init.Error)
		}
		if w.session == "" {
			t.Fatal("initialize minted no session")
		}
		w.send("notifications/initialized", nil, nil)
	}
	return w
}

// send posts one request and returns the HTTP status and the answer.
// header adds or (with "") removes headers.
func (w *wire) send(method string, params map[string]any, header map[string]string) (int, rpcMsg) {
	w.t.Helper()
	if params == nil {
		params = map[string]any{}
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "application/json, text/event-stream")
	h.Set("Authorization", "Bearer "+w.key)
	if w.modern {
		caps := map[string]any{}
		if w.tasks {
			caps["extensions"] = map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}
		}
		if w.elicitURL {
			caps["elicitation"] = map[string]any{"url": map[string]any{}}
		}
		meta, _ := params["_meta"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		meta["io.modelcontextprotocol/protocolVersion"] = "2026-07-28"
		meta["io.modelcontextprotocol/clientInfo"] = map[string]any{"name": "wire", "version": "1"}
		meta["io.modelcontextprotocol/clientCapabilities"] = caps
		params["_meta"] = meta
		h.Set("Mcp-Protocol-Version", "2026-07-28")
		h.Set("Mcp-Method", method)
		if name, ok := params["name"].(string); ok {
			h.Set("Mcp-Name", name)
		}
		if id, ok := params["taskId"].(string); ok {
			h.Set("Mcp-Name", id)
		}
	} else {
		h.Set("Mcp-Protocol-Version", "2025-11-25")
		if w.session != "" {
			h.Set("Mcp-Session-Id", w.session)
		}
	}
	for k, v := range header {
		if v == "" {
			h.Del(k)
		} else {
			h.Set(k, v)
		}
	}
	msg := map[string]any{"jsonrpc": "2.0", "method": method, "params": params}
	if !strings.HasPrefix(method, "notifications/") {
		msg["id"] = 7
	}
	body, _ := json.Marshal(msg)
	req, _ := http.NewRequestWithContext(w.t.Context(), http.MethodPost, w.b.url+"/mcp", bytes.NewReader(body))
	req.Header = h
	resp, err := http.DefaultClient.Do(req)
	must(w.t, err)
	defer resp.Body.Close()
	if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" && method == "initialize" {
		w.session = sid
	}
	var out rpcMsg
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// The answer is the last event's data.
		var last string
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				last = data
			}
		}
		_ = json.Unmarshal([]byte(last), &out)
	} else {
		_ = json.NewDecoder(resp.Body).Decode(&out)
	}
	return resp.StatusCode, out
}

// ok sends a request that must succeed and returns its result.
func (w *wire) ok(method string, params map[string]any) map[string]any {
	w.t.Helper()
	status, msg := w.send(method, params, nil)
	if status != http.StatusOK || msg.Error != nil || msg.Result == nil {
		w.t.Fatalf("%s %v: HTTP %d, %+v", method, params, status, msg.Error)
	}
	return msg.Result
}

// fails sends a request that must fail with code, and returns the HTTP
// status.
func (w *wire) fails(code int, method string, params map[string]any, header map[string]string) int {
	w.t.Helper()
	status, msg := w.send(method, params, header)
	if msg.Error == nil || msg.Error.Code != code {
		w.t.Errorf("%s %v: HTTP %d, %+v (result %v), want error %d", method, params, status, msg.Error, msg.Result, code)
	}
	return status
}

// until polls tasks/get until cond holds.
func (w *wire) until(id string, cond func(task map[string]any) bool) map[string]any {
	w.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		task := w.ok("tasks/get", map[string]any{"taskId": id})
		if cond(task) {
			return task
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("task %s never got there: last %v", id, task)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func str(m map[string]any, key string) string { s, _ := m[key].(string); return s }

func obj(m map[string]any, key string) map[string]any { o, _ := m[key].(map[string]any); return o }

func resultText(res map[string]any) string {
	var parts []string
	content, _ := res["content"].([]any)
	for _, c := range content {
		parts = append(parts, str(c.(map[string]any), "text"))
	}
	return strings.Join(parts, "")
}

func terminal(task map[string]any) bool {
	switch str(task, "status") {
	case "completed", "failed", "cancelled":
		return true
	}
	return false
}

func execStatus(t *testing.T, b *bundle, id string) harness.ExecState {
	t.Helper()
	ex, err := b.execs.Get(t.Context(), id)
	must(t, err)
	return ex.Status
}

func TestTasksWire2025(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{})
	alice := newWire(t, b, aliceKey, false)
	carol := newWire(t, b, carolKey, false)

	// Advertised: the capability, and every tool's optional task support.
	_, init := newWire(t, b, aliceKey, false).send("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "wire", "version": "1"}}, nil)
	tasks := obj(obj(init.Result, "capabilities"), "tasks")
	if obj(tasks, "list") == nil || obj(tasks, "cancel") == nil || obj(obj(obj(tasks, "requests"), "tools"), "call") == nil {
		t.Errorf("initialize capabilities = %v, want tasks {list, cancel, requests.tools.call}", obj(init.Result, "capabilities"))
	}
	for _, tool := range alice.ok("tools/list", nil)["tools"].([]any) {
		if got := str(obj(tool.(map[string]any), "execution"), "taskSupport"); got != "optional" {
			t.Errorf("tool %v: taskSupport %q, want optional", tool.(map[string]any)["name"], got)
		}
	}

	t.Run("a quick call as a task", func(t *testing.T) {
		created := alice.ok("tools/call", map[string]any{"name": "mem_add", "arguments": map[string]any{"a": 2, "b": 3}, "task": map[string]any{"ttl": 60000}})
		task := obj(created, "task")
		id := str(task, "taskId")
		if id == "" || str(task, "status") != "working" || task["ttl"] != nil || task["pollInterval"] != 1000.0 || str(task, "createdAt") == "" || str(task, "lastUpdatedAt") == "" {
			t.Fatalf("CreateTaskResult = %v, want a working task with ttl null and pollInterval 1000", created)
		}
		if str(obj(created, "_meta"), mcpserver.MetaExecution) != id {
			t.Errorf("CreateTaskResult _meta = %v, want the execution named: the task is the execution", obj(created, "_meta"))
		}
		if done := alice.until(id, terminal); str(done, "status") != "completed" {
			t.Fatalf("task = %v, want completed", done)
		}
		res := alice.ok("tasks/result", map[string]any{"taskId": id})
		if !strings.Contains(resultText(res), `"sum":5`) || res["isError"] == true {
			t.Errorf("tasks/result = %v, want sum 5", res)
		}
		if str(obj(obj(res, "_meta"), "io.modelcontextprotocol/related-task"), "taskId") != id {
			t.Errorf("tasks/result _meta = %v, want related-task %s", obj(res, "_meta"), id)
		}
		if ex, err := b.execs.Get(t.Context(), id); err != nil || ex.Principal != "alice" || ex.Status != harness.ExecSucceeded {
			t.Errorf("execution %s = %+v, %v; want alice's, succeeded", id, ex, err)
		}
	})

	t.Run("a guarded call as a task, approved by another key", func(t *testing.T) {
		id := str(obj(alice.ok("tools/call", map[string]any{"name": "mem_guarded", "task": map[string]any{}}), "task"), "taskId")
		waiting := alice.until(id, func(task map[string]any) bool { return strings.Contains(str(task, "statusMessage"), "approval") })
		if str(waiting, "status") != "working" {
			t.Errorf("a task waiting for approval = %v, want working (the client has no input to give)", waiting)
		}
		// Another caller: as unknown.
		for _, method := range []string{"tasks/get", "tasks/result", "tasks/cancel"} {
			carol.fails(-32602, method, map[string]any{"taskId": id}, nil)
		}
		if strings.Contains(jsonOf(carol.ok("tasks/list", nil)), id) {
			t.Errorf("carol's tasks/list names alice's task %s", id)
		}
		if !strings.Contains(jsonOf(alice.ok("tasks/list", nil)), id) {
			t.Errorf("alice's tasks/list lacks her task %s", id)
		}
		approved := approveWhenWaiting(t, b)
		// tasks/result holds until the approval is decided.
		res := alice.ok("tasks/result", map[string]any{"taskId": id})
		if resultText(res) != "done after approval" {
			t.Errorf("tasks/result = %v, want the approved call's result", res)
		}
		if ap := <-approved; ap == "" || !strings.Contains(str(waiting, "statusMessage"), ap) {
			t.Errorf("approval %q; the waiting task said %q, want it named", ap, str(waiting, "statusMessage"))
		}
		alice.fails(-32602, "tasks/cancel", map[string]any{"taskId": id}, nil) // already ended
	})

	t.Run("a task cancelled", func(t *testing.T) {
		id := str(obj(alice.ok("tools/call", map[string]any{"name": "mem_guarded", "task": map[string]any{}}), "task"), "taskId")
		waitPending(t, b)
		cancelled := alice.ok("tasks/cancel", map[string]any{"taskId": id})
		if str(cancelled, "taskId") != id || str(cancelled, "status") != "cancelled" {
			t.Errorf("tasks/cancel = %v, want the task, cancelled", cancelled)
		}
		if got := execStatus(t, b, id); got != harness.ExecCancelled {
			t.Errorf("the execution is %s, want cancelled", got)
		}
		alice.fails(-32602, "tasks/cancel", map[string]any{"taskId": id}, nil)
		if got := str(alice.ok("tasks/get", map[string]any{"taskId": id}), "status"); got != "cancelled" {
			t.Errorf("tasks/get after cancel: %s", got)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		alice.fails(-32602, "tasks/get", map[string]any{"taskId": "ex_nope"}, nil)
		alice.fails(-32602, "tasks/list", map[string]any{"cursor": "not a cursor"}, nil)
		alice.fails(-32602, "tools/call", map[string]any{"name": "nope", "task": map[string]any{}}, nil)
		// A tool bob is not offered is not his to run as a task either.
		newWire(t, b, bobKey, false).fails(-32602, "tools/call", map[string]any{"name": "mem_leak", "task": map[string]any{}}, nil)
	})
}

func TestTasksWire2026(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{Hold: 300 * time.Millisecond})
	alice := newWire(t, b, aliceKey, true)
	carol := newWire(t, b, carolKey, true)
	plain := newWire(t, b, aliceKey, true)
	plain.tasks = false

	caps := obj(alice.ok("server/discover", nil), "capabilities")
	if obj(obj(caps, "extensions"), "io.modelcontextprotocol/tasks") == nil || caps["tasks"] != nil {
		t.Errorf("server/discover capabilities = %v, want the tasks extension (and no 2025 tasks slot)", caps)
	}

	t.Run("a quick call is answered at once", func(t *testing.T) {
		res := alice.ok("tools/call", map[string]any{"name": "mem_add", "arguments": map[string]any{"a": 2, "b": 3}})
		if str(res, "resultType") != "complete" || !strings.Contains(resultText(res), `"sum":5`) {
			t.Errorf("mem_add = %v, want its result (resultType complete)", res)
		}
	})

	t.Run("a guarded call becomes a task, approved by another key", func(t *testing.T) {
		created := alice.ok("tools/call", map[string]any{"name": "mem_guarded", "arguments": map[string]any{}})
		id := str(created, "taskId")
		if str(created, "resultType") != "task" || id == "" || created["task"] != nil || created["ttlMs"] != nil || created["pollIntervalMs"] != 1000.0 {
			t.Fatalf("CreateTaskResult = %v, want a flat task (resultType task, ttlMs null, pollIntervalMs 1000)", created)
		}
		for _, legacy := range []string{"ttl", "pollInterval", "result", "error", "inputRequests", "requestState"} {
			if _, ok := created[legacy]; ok {
				t.Errorf("CreateTaskResult carries %s: %v", legacy, created)
			}
		}
		if _, ok := created["ttlMs"]; !ok {
			t.Errorf("CreateTaskResult lacks ttlMs: %v", created)
		}
		waiting := alice.until(id, func(task map[string]any) bool { return strings.Contains(str(task, "statusMessage"), "approval") })
		if str(waiting, "status") != "working" || str(waiting, "resultType") != "complete" || waiting["result"] != nil {
			t.Errorf("waiting = %v, want working, resultType complete, no result", waiting)
		}
		// The gates of the extension's methods.
		if status := plain.fails(-32021, "tasks/get", map[string]any{"taskId": id}, nil); status != http.StatusBadRequest {
			t.Errorf("tasks/get without the extension: HTTP %d, want 400", status)
		}
		if status := alice.fails(-32020, "tasks/get", map[string]any{"taskId": id}, map[string]string{"Mcp-Name": "another-task"}); status != http.StatusBadRequest {
			t.Errorf("tasks/get with a mismatched Mcp-Name: HTTP %d, want 400", status)
		}
		alice.fails(-32020, "tasks/get", map[string]any{"taskId": id}, map[string]string{"Mcp-Name": ""})
		carol.fails(-32602, "tasks/get", map[string]any{"taskId": id}, nil)
		carol.fails(-32602, "tasks/cancel", map[string]any{"taskId": id}, nil)
		for _, removed := range []string{"tasks/result", "tasks/list"} {
			alice.fails(-32601, removed, map[string]any{"taskId": id}, nil)
		}
		if ack := alice.ok("tasks/update", map[string]any{"taskId": id, "inputResponses": map[string]any{}}); str(ack, "resultType") != "complete" || ack["taskId"] != nil {
			t.Errorf("tasks/update = %v, want an empty ack", ack)
		}

		approved := approveWhenWaiting(t, b)
		done := alice.until(id, terminal)
		if <-approved == "" {
			t.Error("no approval was asked for")
		}
		res := obj(done, "result")
		if str(done, "status") != "completed" || resultText(res) != "done after approval" || str(res, "resultType") != "complete" {
			t.Errorf("the ended task = %v, want completed with the result inlined", done)
		}
		if obj(res, "_meta")["io.modelcontextprotocol/related-task"] != nil {
			t.Errorf("the inlined result carries related-task: %v", res)
		}
	})

	t.Run("a task cancelled", func(t *testing.T) {
		id := str(alice.ok("tools/call", map[string]any{"name": "mem_guarded", "arguments": map[string]any{}}), "taskId")
		ack := alice.ok("tasks/cancel", map[string]any{"taskId": id})
		if str(ack, "resultType") != "complete" || ack["taskId"] != nil || ack["status"] != nil {
			t.Errorf("tasks/cancel = %v, want an empty ack", ack)
		}
		if got := str(alice.until(id, terminal), "status"); got != "cancelled" {
			t.Errorf("tasks/get after cancel: %s", got)
		}
		if got := execStatus(t, b, id); got != harness.ExecCancelled {
			t.Errorf("the execution is %s, want cancelled", got)
		}
		alice.ok("tasks/cancel", map[string]any{"taskId": id}) // idempotent
	})

	t.Run("a client without the extension is held as before", func(t *testing.T) {
		// Its 2025-style task hint is ignored.
		res := plain.ok("tools/call", map[string]any{"name": "mem_guarded", "arguments": map[string]any{}, "task": map[string]any{}})
		ap := str(obj(res, "_meta"), mcpserver.MetaApproval)
		if str(res, "resultType") != "complete" || res["taskId"] != nil || res["isError"] != true || ap == "" {
			t.Fatalf("tools/call without the extension = %v, want the held call's answer", res)
		}
		if _, err := b.execs.Approvals().Decide(t.Context(), ap, gates.ApprovalDenied, "approver", ""); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("unknown", func(t *testing.T) {
		alice.fails(-32602, "tasks/get", map[string]any{"taskId": "tasks-conformance-nonexistent-12345"}, nil)
		alice.fails(-32602, "tasks/cancel", map[string]any{"taskId": "nope"}, nil)
		alice.fails(-32602, "tools/call", map[string]any{"name": "nope", "arguments": map[string]any{}}, nil)
	})
}

func jsonOf(v any) string {
	data, _ := json.Marshal(v)
	return string(data)
}
