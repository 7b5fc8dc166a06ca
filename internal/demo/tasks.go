package demo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// The demo runs slow_job as a task of the MCP Tasks extension
// (io.modelcontextprotocol/tasks, revision 2026-07-28): a tools/call that
// declares the extension in its _meta client capabilities is answered at
// once with a task handle, and tasks/get, tasks/update and tasks/cancel
// follow it. mcp-go serves only the 2025-11-25 experimental tasks, so
// Jobs answers those methods itself, in front of mcp-go's Streamable HTTP
// handler (Handler). A call without the extension, or over stdio, runs
// slow_job in place: it blocks for its seconds and returns the result.
const (
	extTasks        = "io.modelcontextprotocol/tasks"
	clientCapsMeta  = "io.modelcontextprotocol/clientCapabilities"
	defaultJobPoll  = 250 * time.Millisecond
	jobTTL          = time.Hour
	maxJobSeconds   = 600
	maxRequestBytes = 1 << 20
)

var slowJobTool = mcp.NewTool("slow_job",
	mcp.WithDescription("Works for the given number of seconds, reporting its progress, and returns a summary. A client that declares the Tasks extension gets a task to poll; others wait for the result. With input: true the job asks for input halfway (an elicitation), which a client without elicitation cannot give."),
	mcp.WithNumber("seconds", mcp.Required(), mcp.Description("How long the job works, 0 to 600."), mcp.Min(0), mcp.Max(maxJobSeconds)),
	mcp.WithBoolean("input", mcp.Description("Ask for input halfway through.")),
	hints("Slow job", true, false, true),
)

// Jobs is the task store of one demo server: its slow_job tasks and the
// counts a test reads to see what reached the server.
type Jobs struct {
	// Poll is the poll interval suggested to clients; zero means 250 ms.
	Poll time.Duration

	mu    sync.Mutex
	jobs  map[string]*job
	stats JobStats
}

// JobStats counts what the server saw.
type JobStats struct {
	Calls     int      // slow_job tools/call answered with a task
	Gets      int      // tasks/get
	Cancelled []string // task ids tasks/cancel was sent for
	Updates   int      // tasks/update
	// Answers are the confirm answers tasks/update brought, in order.
	Answers []string
}

type job struct {
	id        string
	created   time.Time
	seconds   float64
	input     bool
	answer    *jobAnswer // the confirm question's answer, once given
	cancelled *time.Time
	idemKey   string
}

// jobAnswer is the answer to a job's confirm question.
type jobAnswer struct {
	Action  string         `json:"action"`
	Content map[string]any `json:"content"`
}

type jobArgs struct {
	Seconds *float64 `json:"seconds"`
	Input   bool     `json:"input"`
}

// NewJobs returns an empty task store.
func NewJobs() *Jobs { return &Jobs{jobs: map[string]*job{}} }

// Stats returns a copy of the counts.
func (j *Jobs) Stats() JobStats {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.stats
	s.Cancelled = append([]string(nil), s.Cancelled...)
	return s
}

// Tool is slow_job for an mcp-go server: the handler answers the calls
// that do not run as tasks, in place.
func (j *Jobs) Tool() server.ServerTool {
	return server.ServerTool{Tool: slowJobTool, Handler: j.runInPlace}
}

func (j *Jobs) runInPlace(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args jobArgs
	if res := bind(req, &args); res != nil {
		return res, nil
	}
	if msg := args.invalid(); msg != "" {
		return mcp.NewToolResultError(msg), nil
	}
	if args.Input {
		return mcp.NewToolResultError("slow_job with input: true needs a client that declares the Tasks extension"), nil
	}
	t := time.NewTimer(time.Duration(*args.Seconds * float64(time.Second)))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
	}
	key, _ := req.Params.Meta.GetMetaField(idempotencyKeyMeta).(string)
	return jobResult("", *args.Seconds, key, false), nil
}

func (a jobArgs) invalid() string {
	switch {
	case a.Seconds == nil:
		return `missing required argument "seconds"`
	case *a.Seconds < 0 || *a.Seconds > maxJobSeconds:
		return fmt.Sprintf("seconds must be between 0 and %d", maxJobSeconds)
	}
	return ""
}

func jobResult(id string, seconds float64, key string, confirmed bool) *mcp.CallToolResult {
	out := map[string]any{"seconds": seconds, "done": true}
	if confirmed {
		out["confirmed"] = true
	}
	if id != "" {
		out["task"] = id
	}
	if key != "" {
		out["idempotencyKey"] = key
	}
	return structured(out)
}

// Handler answers the Tasks extension's requests and slow_job calls that
// declare the extension, and hands everything else to next (mcp-go's
// Streamable HTTP handler).
func (j *Jobs) Handler(next http.Handler) http.Handler {
	return rpcHandler(next, j.handle)
}

// rpcHandler answers the JSON-RPC requests handle takes (ok true) and
// hands every other message to next, with its body intact.
func rpcHandler(next http.Handler, handle func(method string, params json.RawMessage) (result any, rpcErr *mcp.JSONRPCErrorDetails, ok bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		msg, ok := peekRequest(r)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		result, rpcErr, ok := handle(msg.Method, msg.Params)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		writeResponse(w, msg.ID, result, rpcErr)
	})
}

// rpcRequest is a JSON-RPC request as the extension handlers read it.
type rpcRequest struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// peekRequest reads the JSON-RPC request a POST carries, leaving the body
// for whoever serves it; ok is false for anything else.
func peekRequest(r *http.Request) (rpcRequest, bool) {
	var msg rpcRequest
	if r.Method != http.MethodPost {
		return msg, false
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxRequestBytes+1))
	// mcp-go reads the request as it was, whatever was peeked at.
	r.Body = readCloser{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
	if err != nil || len(body) > maxRequestBytes {
		return msg, false // no extension request is that large
	}
	if json.Unmarshal(body, &msg) != nil || len(msg.ID) == 0 {
		return msg, false
	}
	return msg, true
}

// writeResponse writes one JSON-RPC response.
func writeResponse(w http.ResponseWriter, id json.RawMessage, result any, rpcErr *mcp.JSONRPCErrorDetails) {
	resp := map[string]any{"jsonrpc": "2.0", "id": id}
	if rpcErr != nil {
		resp["error"] = rpcErr
	} else {
		resp["result"] = result
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// handle answers one request; ok is false for what mcp-go serves.
func (j *Jobs) handle(method string, raw json.RawMessage) (result any, rpcErr *mcp.JSONRPCErrorDetails, ok bool) {
	var p struct {
		Name      string               `json:"name"`
		Arguments json.RawMessage      `json:"arguments"`
		TaskID    string               `json:"taskId"`
		Meta      map[string]any       `json:"_meta"`
		Responses map[string]jobAnswer `json:"inputResponses"`
	}
	if json.Unmarshal(raw, &p) != nil {
		return nil, nil, false
	}
	switch method {
	case "tools/call":
		return j.start(p.Name, p.Arguments, p.Meta)
	case "tasks/get", "tasks/cancel", "tasks/update":
		r, e := j.taskRequest(method, p.TaskID, p.Responses)
		return r, e, true
	}
	return nil, nil, false
}

// start creates a task for a slow_job call from a client that declared
// the extension; anything else is left to mcp-go.
func (j *Jobs) start(name string, rawArgs json.RawMessage, meta map[string]any) (any, *mcp.JSONRPCErrorDetails, bool) {
	if name != slowJobTool.Name || !declaresTasks(meta) {
		return nil, nil, false
	}
	var args jobArgs
	if json.Unmarshal(rawArgs, &args) != nil || args.invalid() != "" {
		return nil, nil, false // mcp-go's handler answers the tool error
	}
	key, _ := meta[idempotencyKeyMeta].(string)
	jb := &job{id: rand.Text(), created: time.Now(), seconds: *args.Seconds, input: args.Input, idemKey: key}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.purge(jb.created)
	j.jobs[jb.id] = jb
	j.stats.Calls++
	t := j.view(jb, time.Now())
	t["resultType"] = "task"
	return t, nil, true
}

// purge forgets the jobs whose TTL has passed, as the extension lets a
// server do; a poll for one is then "task not found". Callers hold j.mu.
func (j *Jobs) purge(now time.Time) {
	for id, jb := range j.jobs {
		if now.Sub(jb.created) > jobTTL {
			delete(j.jobs, id)
		}
	}
}

// readCloser reads r and closes c.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (rc readCloser) Close() error { return rc.c.Close() }

func declaresTasks(meta map[string]any) bool {
	caps, _ := meta[clientCapsMeta].(map[string]any)
	ext, _ := caps["extensions"].(map[string]any)
	_, ok := ext[extTasks]
	return ok
}

func (j *Jobs) taskRequest(method, id string, responses map[string]jobAnswer) (any, *mcp.JSONRPCErrorDetails) {
	j.mu.Lock()
	defer j.mu.Unlock()
	jb, ok := j.jobs[id]
	if !ok {
		return nil, &mcp.JSONRPCErrorDetails{Code: mcp.INVALID_PARAMS, Message: "Failed to retrieve task: Task not found"}
	}
	now := time.Now()
	switch method {
	case "tasks/get":
		j.stats.Gets++
		t := j.view(jb, now)
		t["resultType"] = "complete"
		return t, nil
	case "tasks/cancel":
		j.stats.Cancelled = append(j.stats.Cancelled, id)
		if jb.cancelled == nil && !terminal(jb.status(now)) {
			jb.cancelled = &now
		}
	case "tasks/update":
		// The confirm answer lets the job go on (accepted with ok) or
		// ends it (anything else); an update with no answer to it is
		// counted and ignored.
		j.stats.Updates++
		if a, ok := responses["confirm"]; ok && jb.answer == nil && jb.status(now) == "input_required" {
			jb.answer = &a
			j.stats.Answers = append(j.stats.Answers, fmt.Sprintf("%s %v", a.Action, a.Content["ok"]))
		}
	}
	return map[string]any{"resultType": "complete"}, nil
}

// status is where a job is at now: it works for its seconds (with input,
// it stops halfway to ask), unless cancelled first.
func (jb *job) status(now time.Time) string {
	if jb.cancelled != nil {
		return "cancelled"
	}
	elapsed := now.Sub(jb.created).Seconds()
	switch {
	case jb.input && jb.answer == nil && elapsed >= jb.seconds/2:
		return "input_required"
	case jb.answer != nil && (jb.answer.Action != "accept" || jb.answer.Content["ok"] != true):
		return "failed"
	case elapsed >= jb.seconds:
		return "completed"
	}
	return "working"
}

func terminal(status string) bool {
	return status == "completed" || status == "failed" || status == "cancelled"
}

// view is the job as a DetailedTask.
func (j *Jobs) view(jb *job, now time.Time) map[string]any {
	poll := j.Poll
	if poll <= 0 {
		poll = defaultJobPoll
	}
	status := jb.status(now)
	updated := now
	if jb.cancelled != nil {
		updated = *jb.cancelled
	}
	t := map[string]any{
		"taskId": jb.id, "status": status,
		"createdAt":     jb.created.UTC().Format(time.RFC3339Nano),
		"lastUpdatedAt": updated.UTC().Format(time.RFC3339Nano),
		"ttlMs":         jobTTL.Milliseconds(), "pollIntervalMs": poll.Milliseconds(),
	}
	switch status {
	case "working":
		done := min(now.Sub(jb.created).Seconds()/max(jb.seconds, 0.001), 1)
		t["statusMessage"] = fmt.Sprintf("%d%% done", int(done*100))
	case "input_required":
		t["statusMessage"] = "waiting for the user to confirm"
		t["inputRequests"] = map[string]any{"confirm": map[string]any{
			"method": "elicitation/create",
			"params": map[string]any{"mode": "form", "message": "Go on with the job?", "requestedSchema": map[string]any{
				"type": "object", "properties": map[string]any{"ok": map[string]any{"type": "boolean"}}, "required": []string{"ok"},
			}},
		}}
	case "completed":
		t["statusMessage"] = "done"
		t["result"] = jobResult(jb.id, jb.seconds, jb.idemKey, jb.answer != nil)
	case "failed":
		t["statusMessage"] = "the user did not confirm"
		t["error"] = map[string]any{"code": -32000, "message": "not confirmed: " + jb.answer.Action}
	case "cancelled":
		t["statusMessage"] = "cancelled by the client"
	}
	return t
}
