package mcpserver

// Tasks: a client that declares the Tasks feature gets, for a tools/call, a
// task it can poll, read the result of and cancel, in both eras.
//
//   - 2025-11-25 (core, experimental): initialize says tasks {list, cancel,
//     requests.tools.call}, and every tool says execution.taskSupport
//     "optional". A tools/call with params.task is answered at once with a
//     CreateTaskResult ({task}); tasks/get answers the Task, tasks/result
//     holds like a held call and answers the CallToolResult (with
//     _meta related-task), tasks/list lists the caller's tasks, tasks/cancel
//     cancels (a task already ended: -32602). A tools/call without
//     params.task is held as before.
//   - 2026-07-28 (the io.modelcontextprotocol/tasks extension, SEP-2663):
//     server/discover names the extension. Creation is server-directed: a
//     tools/call whose _meta clientCapabilities declare the extension gets
//     its result when the call ends within taskShortcut, else a flat
//     CreateTaskResult (resultType "task"). tasks/get answers the detailed
//     task (the result inlined once completed); tasks/cancel and
//     tasks/update answer an empty acknowledgement (no task of patchbay's
//     ever asks the client for input, so an update has nothing to answer);
//     all three need the extension declared on the request (-32021) and
//     Mcp-Name naming the task (-32020). tasks/result and tasks/list are
//     not part of the extension (mcp-go answers them -32601).
//
// The task is the execution: its id is the execution's id, and every answer
// is read from the execution's record in Redis, so any replica answers about
// any task, a task outlives the replica (and the session) that created it,
// and nothing — no goroutine, worker or Redis connection — is held for it
// between requests. mcp-go's own task support cannot serve that: it runs the
// tool's handler on the HTTP request's context (cancelled when the request
// ends) and keeps its tasks in one process's memory, in the 2025 shape only.
// So these requests are answered here, in front of mcp-go, and mcp-go never
// sees a task.
//
// Status: queued and running are "working"; an execution waiting for a
// person's approval is "working" too, with a statusMessage naming the
// approval. input_required means the server needs input from the client
// (2025: requests it fetches through tasks/result; 2026: inputRequests it
// answers with tasks/update), and an approval is decided by a person
// elsewhere, not by the client. A call that ended in an error is, as the
// held call answers it, a tool result with isError: "completed" in the 2026
// era (failed is for JSON-RPC errors only), "failed" in the 2025 era (whose
// spec counts an isError tool result as failed); tasks/result answers the
// same tool result either way. A task belongs to the caller that created
// it: another caller's task id is answered as unknown (-32602). Its ttl is
// null: a task lasts as long as its execution is kept
// (PATCHBAY_RETENTION), which patchbay does not shorten.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

const (
	// tasksExtension names the 2026-era Tasks extension.
	tasksExtension = "io.modelcontextprotocol/tasks"
	// taskPollMs is the polling interval a task suggests: one read of
	// the execution's record a second per polling client.
	taskPollMs = 1000
	// taskShortcut is how long a 2026-era call that may become a task is
	// held before its task is answered: a call that ends sooner (most
	// reads) is answered with its result, sparing the client a poll.
	taskShortcut = 500 * time.Millisecond
	// tasksPage is how many tasks one tasks/list page holds at most.
	tasksPage = 50
	// tasksSince is the first protocol revision with tasks in its core.
	tasksSince = "2025-11-25"
)

// The methods of the Tasks feature.
const (
	methodTasksGet    = "tasks/get"
	methodTasksResult = "tasks/result"
	methodTasksList   = "tasks/list"
	methodTasksCancel = "tasks/cancel"
	methodTasksUpdate = "tasks/update"
)

// taskRequest is one JSON-RPC request answered here.
type taskRequest struct {
	id     json.RawMessage
	method string
	raw    json.RawMessage // params as sent
	params map[string]json.RawMessage
	meta   *mcp.Meta
	// modern: the request speaks 2026-07-28 (its _meta or its
	// Mcp-Protocol-Version header says so); version is the _meta's.
	modern  bool
	version string
	session string // the 2025-era session, "" for none
}

// rpcError is a JSON-RPC error answered here.
type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

func rpcErr(code int, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// errTaskNotFound answers a task id that is not the caller's (or not a
// task at all), without saying which.
func errTaskNotFound() *rpcError {
	return rpcErr(mcp.INVALID_PARAMS, "Failed to retrieve task: Task not found")
}

// serveTasks answers the requests of the Tasks feature (see the top of this
// file) and reports whether it did; everything else, including a tools/call
// no one asked to run as a task, is left to mcp-go. p is the caller, method
// the request's JSON-RPC method.
func (s *Server) serveTasks(w http.ResponseWriter, r *http.Request, p authz.Principal, method string) bool {
	switch method {
	case string(mcp.MethodToolsCall), methodTasksGet, methodTasksResult, methodTasksList, methodTasksCancel, methodTasksUpdate:
	default:
		return false
	}
	req, ok := readTaskRequest(r, method)
	if !ok {
		return false // not a request (or not one mcp-go would take): it answers
	}
	switch method {
	case string(mcp.MethodToolsCall):
		task := req.params["task"]
		asked := len(task) > 0 && string(task) != "null"
		if req.modern && !declaresTasks(req.meta) {
			if asked {
				// A 2025-style task hint from a client that did not declare
				// the extension is tolerated and ignored: the call runs as
				// any other (mcp-go would otherwise make its own task of it).
				stripTaskParam(r, req)
			}
			return false
		}
		if !req.modern && !asked {
			return false
		}
	case methodTasksResult, methodTasksList:
		if req.modern {
			return false // not in the extension
		}
	case methodTasksUpdate:
		if !req.modern {
			return false // not in 2025-11-25
		}
	}
	if !validTaskPost(w, r, req) {
		return true
	}
	if req.modern {
		if e := modernTransportError(r, req); e != nil {
			writeRPC(w, req, nil, e)
			return true
		}
		if method != string(mcp.MethodToolsCall) && !declaresTasks(req.meta) {
			writeRPC(w, req, nil, &rpcError{Code: mcp.MISSING_REQUIRED_CLIENT_CAPABILITY,
				Message: "Missing required client capability: declare the " + tasksExtension + " extension in _meta " + mcp.MetaKeyClientCapabilities,
				Data:    map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{tasksExtension: map[string]any{}}}}})
			return true
		}
	}
	ctx := r.Context()
	var (
		result any
		e      *rpcError
	)
	switch method {
	case string(mcp.MethodToolsCall):
		if !s.enter(p.Name) {
			writeProblem(w, http.StatusTooManyRequests, codeTooManyCalls, "too many tools/call requests in flight for this caller")
			return true
		}
		defer s.leave(p.Name)
		offer, ok := s.offer(w, r, p)
		if !ok {
			return true
		}
		result, e = s.startTask(ctx, p, req, offer)
	case methodTasksResult:
		// Held as a call is, so bounded with the calls.
		if !s.enter(p.Name) {
			writeProblem(w, http.StatusTooManyRequests, codeTooManyCalls, "too many tools/call and tasks/result requests in flight for this caller")
			return true
		}
		defer s.leave(p.Name)
		result, e = s.taskResult(ctx, p, req)
	case methodTasksGet:
		result, e = s.taskGet(ctx, p, req)
	case methodTasksList:
		result, e = s.taskList(ctx, p, req)
	case methodTasksCancel:
		result, e = s.taskCancel(ctx, p, req)
	case methodTasksUpdate:
		// Nothing of patchbay's asks a client for input, so no response
		// is outstanding: the spec has them ignored, and the update
		// acknowledged.
		if _, e = s.ownTask(ctx, p, req); e == nil {
			result = s.ack()
		}
	}
	if e == nil && ctx.Err() != nil {
		return true // the client is gone
	}
	writeRPC(w, req, result, e)
	return true
}

// readTaskRequest reads a JSON-RPC request for the Tasks feature, leaving
// the body for mcp-go to read if it is not answered here.
func readTaskRequest(r *http.Request, method string) (*taskRequest, bool) {
	body, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return nil, false
	}
	var env struct {
		ID     json.RawMessage `json:"id"`
		Params json.RawMessage `json:"params"`
	}
	if json.Unmarshal(body, &env) != nil || len(env.ID) == 0 || string(env.ID) == "null" {
		return nil, false
	}
	req := &taskRequest{id: env.ID, method: method, raw: env.Params, session: r.Header.Get(server.HeaderKeySessionID)}
	if len(env.Params) > 0 && string(env.Params) != "null" {
		if json.Unmarshal(env.Params, &req.params) != nil {
			return nil, false
		}
	}
	if m, ok := req.params["_meta"]; ok {
		var meta mcp.Meta
		if json.Unmarshal(m, &meta) == nil {
			req.meta = &meta
		}
	}
	req.version = req.meta.ProtocolVersion()
	req.modern = mcp.IsModernProtocol(req.version) || mcp.IsModernProtocol(r.Header.Get(mcp.HeaderProtocolVersion))
	if req.modern {
		req.session = "" // the 2026 era has none; mcp-go ignores the header
	}
	return req, true
}

// declaresTasks reports whether a request's _meta declares the 2026-era
// Tasks extension among its client capabilities.
func declaresTasks(meta *mcp.Meta) bool {
	caps := meta.ClientCapabilities()
	if caps == nil {
		return false
	}
	_, ok := caps.Extensions[tasksExtension].(map[string]any)
	return ok
}

// stripTaskParam drops params.task from the body mcp-go will read.
func stripTaskParam(r *http.Request, req *taskRequest) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	var msg map[string]json.RawMessage
	if json.Unmarshal(body, &msg) != nil {
		r.Body = io.NopCloser(bytes.NewReader(body))
		return
	}
	params := maps.Clone(req.params)
	delete(params, "task")
	if msg["params"], err = json.Marshal(params); err == nil {
		if stripped, err := json.Marshal(msg); err == nil {
			body = stripped
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
}

// validTaskPost checks what mcp-go checks of a POST before the protocol,
// answering as it does when the check fails.
func validTaskPost(w http.ResponseWriter, r *http.Request, req *taskRequest) bool {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, "Invalid content type: must be 'application/json'", http.StatusBadRequest)
		return false
	}
	if v := r.Header.Get(mcp.HeaderProtocolVersion); !req.modern && v != "" && !mcp.IsValidProtocolVersion(v) {
		http.Error(w, "Bad Request: Unsupported protocol version: "+v, http.StatusBadRequest)
		return false
	}
	return true
}

// modernTransportError is what a 2026-era request fails of the transport's
// rules (SEP-2575, SEP-2243, and SEP-2663's Mcp-Name for the task
// methods), nil when it passes: mcp-go's own checks, for the requests it
// does not see.
func modernTransportError(r *http.Request, req *taskRequest) *rpcError {
	header := r.Header.Get(mcp.HeaderProtocolVersion)
	switch {
	case r.Header.Get(mcp.HeaderLastEventID) != "":
		return rpcErr(mcp.HEADER_MISMATCH, "Last-Event-ID is not supported in protocol version %s", mcp.ProtocolVersion20260728)
	case header == "":
		return rpcErr(mcp.HEADER_MISMATCH, "%s header is required for requests carrying %s", mcp.HeaderProtocolVersion, mcp.MetaKeyProtocolVersion)
	case req.version == "":
		return rpcErr(mcp.INVALID_PARAMS, "missing or invalid _meta field %s", mcp.MetaKeyProtocolVersion)
	case header != req.version:
		return rpcErr(mcp.HEADER_MISMATCH, "%s header %s does not match request %s %s", mcp.HeaderProtocolVersion, header, mcp.MetaKeyProtocolVersion, req.version)
	case !mcp.IsValidProtocolVersion(req.version):
		e := mcp.UnsupportedProtocolVersionError{Version: req.version, Supported: mcp.ValidProtocolVersions}.JSONRPCError().Error
		return &rpcError{Code: e.Code, Message: e.Message, Data: e.Data}
	case req.meta.ClientCapabilities() == nil:
		return rpcErr(mcp.INVALID_PARAMS, "missing or invalid _meta field %s", mcp.MetaKeyClientCapabilities)
	}
	if err := mcp.ValidateStandardHeaders(r.Header.Get, req.version, mcp.MCPMethod(req.method), req.raw); err != nil {
		return rpcErr(mcp.HEADER_MISMATCH, "%s", err.Error())
	}
	if req.method == string(mcp.MethodToolsCall) {
		return nil
	}
	name, ok := mcp.DecodeHeaderValue(strings.TrimSpace(r.Header.Get(mcp.HeaderName)))
	switch id, _ := taskID(req); {
	case r.Header.Get(mcp.HeaderName) == "":
		return rpcErr(mcp.HEADER_MISMATCH, "header mismatch: %s: missing required header for method %q", mcp.HeaderName, req.method)
	case !ok:
		return rpcErr(mcp.HEADER_MISMATCH, "header mismatch: %s: invalid Base64 encoding", mcp.HeaderName)
	case name != id:
		return rpcErr(mcp.HEADER_MISMATCH, "header mismatch: %s: header value %q does not match params.taskId %q", mcp.HeaderName, name, id)
	}
	return nil
}

// writeRPC answers a request with its result or error; a 2026-era error
// takes the HTTP status its code maps to, as mcp-go's do.
func writeRPC(w http.ResponseWriter, req *taskRequest, result any, e *rpcError) {
	msg := map[string]any{"jsonrpc": mcp.JSONRPC_VERSION, "id": req.id}
	status := http.StatusOK
	if e != nil {
		msg["error"] = e
		if req.modern {
			switch e.Code {
			case mcp.METHOD_NOT_FOUND:
				status = http.StatusNotFound
			case mcp.HEADER_MISMATCH, mcp.MISSING_REQUIRED_CLIENT_CAPABILITY, mcp.UNSUPPORTED_PROTOCOL_VERSION,
				mcp.INVALID_REQUEST, mcp.INVALID_PARAMS, mcp.PARSE_ERROR:
				status = http.StatusBadRequest
			}
		}
	} else {
		msg["result"] = result
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(msg)
}

// startTask starts a tools/call as a task: the call's execution is the
// task. A call refused before it could start has no task: in the 2026 era
// it is answered as a held call's refusal is (a tool result), in the 2025
// era (which owes a task-augmented request a task) with a JSON-RPC error.
func (s *Server) startTask(ctx context.Context, p authz.Principal, req *taskRequest, offer *harness.ToolOffer) (any, *rpcError) {
	var call struct {
		Name      string         `json:"name"`
		Arguments map[string]any `json:"arguments"`
	}
	if err := json.Unmarshal(req.raw, &call); err != nil || call.Name == "" {
		return nil, rpcErr(mcp.INVALID_PARAMS, "invalid tools/call params")
	}
	offered := false
	for _, t := range offer.List() {
		offered = offered || t.Name == call.Name
	}
	if !offered {
		return nil, rpcErr(mcp.INVALID_PARAMS, "tool '%s' not found: tool not found", call.Name)
	}
	s.countTask(p.Name, req)
	tc := toolCall(p, offer, req.session, req.meta, call.Name, call.Arguments)
	callID := tc.CallID
	ex, err := s.o.Engine.CallTool(ctx, tc)
	if err != nil {
		res, err := refusal(err)
		switch {
		case err != nil:
			s.o.Logger.Error("mcp: start a task", "principal", p.Name, "tool", call.Name, "err", err)
			return nil, rpcErr(mcp.INTERNAL_ERROR, "the call could not be started; retry")
		case req.modern:
			return s.modernResult(res), nil
		}
		return nil, rpcErr(mcp.INVALID_PARAMS, "%s", toolText(res))
	}
	if req.modern {
		if done, err := s.o.Engine.Wait(ctx, ex.ID, taskShortcut); err == nil {
			ex = done
		}
		if o := harness.OutcomeOf(ex); o.Done {
			return s.modernResult(s.result(ex, o)), nil
		}
		created := taskOf(ex, true)
		created["resultType"] = "task"
		created["_meta"] = s.resultMeta(map[string]any{MetaExecution: ex.ID, MetaCallID: callID})
		return created, nil
	}
	return map[string]any{
		"task": taskOf(ex, false),
		"_meta": map[string]any{
			MetaExecution: ex.ID, MetaCallID: callID,
			// What a host may hand its model while the task runs.
			mcp.ModelImmediateResponseMetaKey: fmt.Sprintf("The call runs as task %s; its result comes when it ends (an approval it needs is decided by a person).", ex.ID),
		},
	}, nil
}

// countTask notes a task's call on its client for the admin UI, as count
// does for a call through mcp-go.
func (s *Server) countTask(principal string, req *taskRequest) {
	var client, version string
	if ci := req.meta.ClientInfo(); ci != nil {
		client, version = ci.Name, ci.Version
	}
	era := req.version
	if !req.modern {
		era = ""
	}
	s.sessions.called(req.session, principal, client, version, era)
}

// taskGet answers tasks/get: the task (2026: with its result or error
// inlined once it has ended).
func (s *Server) taskGet(ctx context.Context, p authz.Principal, req *taskRequest) (any, *rpcError) {
	ex, e := s.ownTask(ctx, p, req)
	if e != nil {
		return nil, e
	}
	t := taskOf(ex, req.modern)
	if req.modern {
		if o := harness.OutcomeOf(ex); o.Done && ex.Status != harness.ExecCancelled {
			t["result"] = s.modernResult(s.result(ex, o))
		}
		t["resultType"] = mcp.ResultTypeComplete
		t["_meta"] = s.resultMeta(nil)
	}
	return t, nil
}

// taskResult answers tasks/result (2025 era): held while the call runs or
// waits, as a held call is, then its CallToolResult.
func (s *Server) taskResult(ctx context.Context, p authz.Principal, req *taskRequest) (any, *rpcError) {
	ex, e := s.ownTask(ctx, p, req)
	if e != nil {
		return nil, e
	}
	res, err := s.await(ctx, mcp.CallToolRequest{}, ex, callIDOf(ex))
	if err != nil {
		if ctx.Err() == nil {
			s.o.Logger.Error("mcp: task result", "principal", p.Name, "task", ex.ID, "err", err)
		}
		return nil, rpcErr(mcp.INTERNAL_ERROR, "the task's result could not be read; retry")
	}
	if res.Meta == nil {
		res.Meta = &mcp.Meta{}
	}
	res.Meta.SetMetaField(mcp.RelatedTaskMetaKey, map[string]any{"taskId": ex.ID})
	return res, nil
}

// taskList answers tasks/list (2025 era): the caller's tasks, newest
// first — every tool-call execution it owns, whether it was called as a
// task or held.
func (s *Server) taskList(ctx context.Context, p authz.Principal, req *taskRequest) (any, *rpcError) {
	var params struct {
		Cursor string `json:"cursor"`
	}
	if len(req.raw) > 0 && string(req.raw) != "null" && json.Unmarshal(req.raw, &params) != nil {
		return nil, rpcErr(mcp.INVALID_PARAMS, "invalid tasks/list params")
	}
	page, err := s.o.Engine.List(ctx, harness.ListOptions{Principal: p.Name, Cursor: params.Cursor, Limit: tasksPage})
	switch {
	case errors.Is(err, harness.ErrBadCursor):
		return nil, rpcErr(mcp.INVALID_PARAMS, "invalid cursor")
	case err != nil:
		s.o.Logger.Error("mcp: list tasks", "principal", p.Name, "err", err)
		return nil, rpcErr(mcp.INTERNAL_ERROR, "the tasks could not be listed; retry")
	}
	tasks := []map[string]any{}
	for _, ex := range page.Items {
		if isToolCall(ex) {
			tasks = append(tasks, taskOf(ex, false))
		}
	}
	out := map[string]any{"tasks": tasks}
	if page.Next != "" {
		out["nextCursor"] = page.Next
	}
	return out, nil
}

// taskCancel answers tasks/cancel: the execution is cancelled as
// POST /v1/executions/{id}/cancel cancels it. 2025: a task already ended is
// refused (-32602), else the task, cancelled, is answered; 2026: an empty
// acknowledgement, whatever the task's state.
func (s *Server) taskCancel(ctx context.Context, p authz.Principal, req *taskRequest) (any, *rpcError) {
	ex, e := s.ownTask(ctx, p, req)
	if e != nil {
		return nil, e
	}
	if ex.Status.Terminal() {
		if req.modern {
			return s.ack(), nil
		}
		return nil, rpcErr(mcp.INVALID_PARAMS, "Cannot cancel task: it has already ended (%s)", taskStatus(ex, false))
	}
	cancelled, err := s.o.Engine.Cancel(ctx, ex.ID)
	if err != nil {
		s.o.Logger.Error("mcp: cancel a task", "principal", p.Name, "task", ex.ID, "err", err)
		return nil, rpcErr(mcp.INTERNAL_ERROR, "the task could not be cancelled; retry")
	}
	if req.modern {
		return s.ack(), nil
	}
	return taskOf(cancelled, false), nil
}

// ownTask reads the task a request names, if it is the caller's.
func (s *Server) ownTask(ctx context.Context, p authz.Principal, req *taskRequest) (*harness.Execution, *rpcError) {
	id, ok := taskID(req)
	if !ok {
		return nil, rpcErr(mcp.INVALID_PARAMS, "params.taskId is required")
	}
	ex, err := s.o.Engine.Get(ctx, id)
	switch {
	case errors.Is(err, fault.ErrNotFound):
		return nil, errTaskNotFound()
	case err != nil:
		s.o.Logger.Error("mcp: read a task", "principal", p.Name, "task", id, "err", err)
		return nil, rpcErr(mcp.INTERNAL_ERROR, "the task could not be read; retry")
	case ex.Principal != p.Name || !isToolCall(ex):
		return nil, errTaskNotFound()
	}
	return ex, nil
}

func taskID(req *taskRequest) (string, bool) {
	var id string
	if json.Unmarshal(req.params["taskId"], &id) != nil || id == "" {
		return "", false
	}
	return id, true
}

// ack is the empty acknowledgement of tasks/cancel and tasks/update.
func (s *Server) ack() map[string]any {
	return map[string]any{"resultType": mcp.ResultTypeComplete, "_meta": s.resultMeta(nil)}
}

// modernResult is a CallToolResult as the 2026 era answers it: with its
// resultType, and the server named in _meta as mcp-go names it.
func (s *Server) modernResult(res *mcp.CallToolResult) *mcp.CallToolResult {
	res.ResultType = mcp.ResultTypeComplete
	if res.Meta == nil {
		res.Meta = &mcp.Meta{}
	}
	res.Meta.SetServerInfo(mcp.Implementation{Name: "patchbay", Version: s.o.Version})
	return res
}

// resultMeta is the _meta of a 2026-era result answered here.
func (s *Server) resultMeta(fields map[string]any) map[string]any {
	meta := maps.Clone(fields)
	if meta == nil {
		meta = map[string]any{}
	}
	meta[mcp.MetaKeyServerInfo] = mcp.Implementation{Name: "patchbay", Version: s.o.Version}
	return meta
}

// isToolCall reports whether an execution is a tool call's, the only kind a
// task is: its ledger holds nothing but its tool step (none yet while it
// is queued).
func isToolCall(ex *harness.Execution) bool {
	for _, st := range ex.Steps {
		if !strings.HasPrefix(st.ID, harness.ToolStepID("")) {
			return false
		}
	}
	return true
}

// callIDOf is the call id of a tool call's execution, "" before it runs.
func callIDOf(ex *harness.Execution) string {
	if len(ex.Steps) == 0 {
		return ""
	}
	return strings.TrimPrefix(ex.Steps[0].ID, harness.ToolStepID(""))
}

// taskOf is the Task an execution is, in the era's field names.
func taskOf(ex *harness.Execution, modern bool) map[string]any {
	status, message := taskStatus(ex, modern), taskMessage(ex)
	created, updated := ex.CreatedAt, ex.CreatedAt
	later := func(t *time.Time) {
		if t != nil && t.After(updated) {
			updated = *t
		}
	}
	later(ex.StartedAt)
	later(ex.FinishedAt)
	for _, st := range ex.Steps {
		later(&st.StartedAt)
		later(st.FinishedAt)
	}
	t := map[string]any{
		"taskId":        ex.ID,
		"status":        status,
		"createdAt":     created.UTC().Format(time.RFC3339Nano),
		"lastUpdatedAt": updated.UTC().Format(time.RFC3339Nano),
	}
	if message != "" {
		t["statusMessage"] = message
	}
	if modern {
		t["ttlMs"], t["pollIntervalMs"] = nil, taskPollMs
	} else {
		t["ttl"], t["pollInterval"] = nil, taskPollMs
	}
	return t
}

// taskStatus is the status of the task an execution is (see the top of
// this file).
func taskStatus(ex *harness.Execution, modern bool) string {
	switch ex.Status {
	case harness.ExecSucceeded:
		return "completed"
	case harness.ExecFailed:
		if modern {
			return "completed"
		}
		return "failed"
	case harness.ExecCancelled:
		return "cancelled"
	}
	return "working"
}

func taskMessage(ex *harness.Execution) string {
	o := harness.OutcomeOf(ex)
	switch {
	case o.Approval != "":
		return fmt.Sprintf("waiting for approval %s: a person decides it in the admin UI or through POST /v1/approvals/%s/approve", o.Approval, o.Approval)
	case ex.Status == harness.ExecWaiting:
		return "waiting"
	case ex.Status == harness.ExecQueued:
		return "queued"
	case ex.Status == harness.ExecRunning:
		return "running"
	case ex.Error != nil:
		return ex.Error.Code + ": " + ex.Error.Message
	}
	return ""
}

// toolText is the text of a tool result.
func toolText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		switch tc := c.(type) {
		case mcp.TextContent:
			parts = append(parts, tc.Text)
		case *mcp.TextContent:
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, " ")
}

// advertiseTasks adds the hooks that advertise the Tasks feature: the
// tasks capability in a 2025-era initialize (from 2025-11-25 on) and the
// extension in server/discover.
func advertiseTasks(hooks *server.Hooks) {
	hooks.AddAfterInitialize(func(_ context.Context, _ any, _ *mcp.InitializeRequest, res *mcp.InitializeResult) {
		if res.ProtocolVersion >= tasksSince {
			res.Capabilities.Tasks = &mcp.TasksCapability{List: &struct{}{}, Cancel: &struct{}{},
				Requests: &mcp.TaskRequestsCapability{Tools: &struct {
					Call *struct{} `json:"call,omitempty"`
				}{Call: &struct{}{}}}}
		}
	})
	hooks.AddAfterDiscover(func(_ context.Context, _ any, _ *mcp.DiscoverRequest, res *mcp.DiscoverResult) {
		ext := maps.Clone(res.Capabilities.Extensions)
		if ext == nil {
			ext = map[string]any{}
		}
		ext[tasksExtension] = map[string]any{}
		res.Capabilities.Extensions = ext
	})
}
