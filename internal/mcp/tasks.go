package mcp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// The Tasks extension (io.modelcontextprotocol/tasks, revision 2026-07-28,
// SEP-2663): a server may answer a tools/call with a task handle
// (resultType "task") instead of the result; the client polls tasks/get
// until the task is terminal, and the completed task carries the call's
// result inline. patchbay declares the extension in its client
// capabilities; a task that turns input_required has its questions
// (inputRequests) answered through the call's Asker and the answers sent
// with tasks/update, after which it is polled as before. A call without
// an Asker fails (ErrTaskInputRequired) and the task is cancelled. mcp-go knows only the 2025-11-25 experimental tasks
// (pollInterval, tasks/result), so the shapes here are read from the raw
// results capture hands back.
const (
	// ExtTasks is the extension's identifier in capabilities.
	ExtTasks = "io.modelcontextprotocol/tasks"
	// TaskPollFloor is the shortest wait between two polls of a task,
	// whatever interval the server suggests.
	TaskPollFloor = 200 * time.Millisecond
	// taskPollDefault is the wait when the server suggests none.
	taskPollDefault = time.Second
	// taskPollCeiling is the longest wait, so status changes still reach
	// the execution's events while a server suggests hours.
	taskPollCeiling = 30 * time.Second
	// taskGetRetries is how many tasks/get failures in a row a wait
	// outlives (a network blip during a long task).
	taskGetRetries = 3
	// taskMessageEvery bounds how often a new status message alone is
	// reported, so a server that words every poll anew does not flood
	// the execution's events (a status change is reported at once).
	taskMessageEvery = 2 * time.Second
)

// Task statuses.
const (
	taskWorking       = "working"
	taskInputRequired = "input_required"
	taskCompleted     = "completed"
	taskFailed        = "failed"
	taskCancelled     = "cancelled"
)

// ErrTaskInputRequired: the server's task asks the client for input
// (elicitation or sampling), which patchbay does not give.
var ErrTaskInputRequired = errors.New("the task requires input, and patchbay declares no elicitation")

// ErrTaskGone: the server no longer knows the task (expired, or the server
// lost its state).
var ErrTaskGone = errors.New("the server no longer knows the task")

// task is a Task as tasks/get and a CreateTaskResult carry it.
type task struct {
	ResultType     string          `json:"resultType"`
	TaskID         string          `json:"taskId"`
	Status         string          `json:"status"`
	StatusMessage  string          `json:"statusMessage"`
	PollIntervalMs *int64          `json:"pollIntervalMs"`
	Result         json.RawMessage `json:"result"`
	Error          *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	// InputRequests are what an input_required task asks, by id.
	InputRequests map[string]json.RawMessage `json:"inputRequests"`
}

// taskSink is where capture puts a tools/call's task handle: mcp-go would
// refuse a result without content, so the handle is taken out and an
// empty result handed on.
type taskSink struct{ task *task }

type taskSinkKey struct{}

func withTaskSink(ctx context.Context) (context.Context, *taskSink) {
	s := &taskSink{}
	return context.WithValue(ctx, taskSinkKey{}, s), s
}

// takeTask moves a task handle out of a tools/call result into the sink
// of ctx, if there is one; it returns the result to hand on.
func takeTask(ctx context.Context, result json.RawMessage) json.RawMessage {
	s, _ := ctx.Value(taskSinkKey{}).(*taskSink)
	if s == nil {
		return result
	}
	if !mayBeResultType(result, "task") {
		return result
	}
	var t task
	if json.Unmarshal(result, &t) != nil || t.ResultType != "task" {
		return result
	}
	s.task = &t
	return json.RawMessage(`{"content":[]}`)
}

func taskTerminal(status string) bool {
	return status == taskCompleted || status == taskFailed || status == taskCancelled
}

// noWatch stands in for a caller that records nothing.
var noWatch = &connect.TaskWatch{
	Started:  func(context.Context, string) error { return nil },
	Progress: func(connect.TaskProgress) {},
	Cancels:  func(context.Context) bool { return false },
}

// follow takes over a task the server answered tools/call with: the
// caller records its id before anything waits on it, then it is waited
// for.
func (c *conn) follow(ctx context.Context, s *session, req connect.CallRequest, w *connect.TaskWatch, t *task) (*mcp.CallToolResult, error) {
	if t.TaskID == "" {
		return nil, fmt.Errorf("mcp %s: call %s: the server answered with a task without a taskId", c.name, req.Op)
	}
	if err := w.Started(ctx, t.TaskID); err != nil {
		// Nobody will wait on it: the run that resumes the call sends it
		// again.
		c.cancelTask(ctx, s, t.TaskID)
		return nil, err
	}
	if t.Status != taskWorking || t.StatusMessage != "" {
		// Started announced the task as working; this says more.
		w.Progress(connect.TaskProgress{ID: t.TaskID, Status: t.Status, Message: t.StatusMessage})
	}
	return c.await(ctx, s, req, w, t)
}

// await polls task t (seen last as t; nil when resuming) until it is
// terminal and maps its outcome to the call's.
func (c *conn) await(ctx context.Context, s *session, req connect.CallRequest, w *connect.TaskWatch, last *task) (*mcp.CallToolResult, error) {
	id := w.Resume
	if last != nil {
		id = last.TaskID
	}
	failures := 0
	var reported time.Time
	answered := map[string]bool{}
	for {
		if last != nil && last.Status == taskInputRequired && req.Ask != nil {
			if err := c.answerTask(ctx, s, req, last, answered); err != nil {
				return nil, err
			}
		} else if last != nil && (taskTerminal(last.Status) || last.Status == taskInputRequired) {
			return c.taskOutcome(ctx, s, req, last)
		}
		if err := c.pause(ctx, id, last); err != nil {
			if w.Cancels(ctx) {
				c.cancelTask(ctx, s, id)
			}
			return nil, fmt.Errorf("mcp %s: call %s: waiting on task %s: %w", c.name, req.Op, id, err)
		}
		t, err := c.getTask(ctx, s, id)
		switch {
		case err == nil:
			failures = 0
		case errors.Is(err, ErrTaskGone) || ctx.Err() != nil:
			return nil, fmt.Errorf("mcp %s: call %s: task %s: %w", c.name, req.Op, id, err)
		default:
			if failures++; failures > taskGetRetries {
				return nil, fmt.Errorf("mcp %s: call %s: task %s: tasks/get failed %d times in a row: %w", c.name, req.Op, id, failures, err)
			}
			continue
		}
		if newStatus := last == nil || t.Status != last.Status; newStatus ||
			t.StatusMessage != last.StatusMessage && time.Since(reported) >= taskMessageEvery {
			w.Progress(connect.TaskProgress{ID: id, Status: t.Status, Message: t.StatusMessage})
			reported = time.Now()
		}
		last = t
	}
}

// pause waits the server's poll interval (within the floor and ceiling),
// or until a notifications/tasks about the task arrives.
func (c *conn) pause(ctx context.Context, id string, last *task) error {
	d := taskPollDefault
	if last != nil && last.PollIntervalMs != nil {
		d = time.Duration(*last.PollIntervalMs) * time.Millisecond
	}
	d = min(max(d, TaskPollFloor), taskPollCeiling)
	if last == nil {
		d = 0 // resuming: ask at once
	}
	wake := c.taskWake.watch(id)
	defer c.taskWake.unwatch(id, wake)
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
	case <-wake:
	}
	return nil
}

// answerTask answers the questions an input_required task asks (those
// not answered yet) through the call's Asker, and sends the answers with
// tasks/update; the task then goes on, and is polled as before. The
// call's requestTimeoutMs does not apply: a person may take longer.
func (c *conn) answerTask(ctx context.Context, s *session, req connect.CallRequest, t *task, answered map[string]bool) error {
	ir, err := inputRequired(req.Op, &inputRound{Requests: t.InputRequests})
	if err != nil {
		return fmt.Errorf("mcp %s: call %s: task %s: %w", c.name, req.Op, t.TaskID, err)
	}
	resume := &connect.InputResume{Answers: map[string]connect.Answer{}}
	for _, id := range slices.Sorted(maps.Keys(ir.Questions)) {
		if answered[id] {
			continue
		}
		a, err := req.Ask(ctx, ir.Questions[id])
		if err != nil {
			return err
		}
		resume.Answers[id] = a
		answered[id] = true
	}
	if len(resume.Answers) == 0 {
		return nil // answered already; the task has not moved on yet
	}
	params := map[string]any{"taskId": t.TaskID, "inputResponses": resumeParams(resume).InputResponses}
	rctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
	defer cancel()
	// mcp-go's client has no tasks/update: sent through the session's
	// transport, as mcp-go would send a request.
	resp, err := s.capture.SendRequest(rctx, transport.JSONRPCRequest{
		JSONRPC: mcp.JSONRPC_VERSION, ID: mcp.NewRequestId("pb-update-" + rand.Text()), Method: "tasks/update", Params: params,
	})
	switch {
	case err != nil:
		return fmt.Errorf("mcp %s: call %s: task %s: tasks/update: %w", c.name, req.Op, t.TaskID, err)
	case resp != nil && resp.Error != nil:
		return fmt.Errorf("mcp %s: call %s: task %s: tasks/update: %s (code %d)", c.name, req.Op, t.TaskID, resp.Error.Message, resp.Error.Code)
	}
	return nil
}

// taskOutcome maps a terminal (or input_required) task to the call's
// result or error.
func (c *conn) taskOutcome(ctx context.Context, s *session, req connect.CallRequest, t *task) (*mcp.CallToolResult, error) {
	prefix := fmt.Sprintf("mcp %s: call %s: task %s", c.name, req.Op, t.TaskID)
	switch t.Status {
	case taskCompleted:
		if len(t.Result) == 0 {
			return nil, fmt.Errorf("%s completed without a result", prefix)
		}
		res, err := mcp.ParseCallToolResult(&t.Result)
		if err != nil {
			return nil, fmt.Errorf("%s: its result is no tool result: %w", prefix, err)
		}
		return res, nil
	case taskFailed:
		if t.Error != nil {
			return nil, fmt.Errorf("%s failed: %s (code %d)", prefix, t.Error.Message, t.Error.Code)
		}
		return nil, fmt.Errorf("%s failed: %s", prefix, t.StatusMessage)
	case taskCancelled:
		return nil, fmt.Errorf("%s was cancelled by the server: %s", prefix, t.StatusMessage)
	}
	// Nobody will answer: the task is given up rather than left waiting
	// for its TTL.
	c.cancelTask(ctx, s, t.TaskID)
	return nil, fmt.Errorf("%s: %w (%s)", prefix, ErrTaskInputRequired, t.StatusMessage)
}

// getTask sends tasks/get and reads the raw Task it answers with.
func (c *conn) getTask(ctx context.Context, s *session, id string) (*task, error) {
	rctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
	defer cancel()
	pg := &page{}
	_, err := s.client.GetTask(context.WithValue(rctx, pageKey{}, pg), mcp.GetTaskRequest{Params: mcp.GetTaskParams{TaskId: id}})
	if pg.raw == nil {
		if errors.Is(err, mcp.ErrInvalidParams) {
			return nil, fmt.Errorf("%w: %w", ErrTaskGone, err)
		}
		if err == nil {
			err = errors.New("no result")
		}
		return nil, fmt.Errorf("tasks/get: %w", err)
	}
	// mcp-go reads the 2025-11-25 shape; the raw result is what counts.
	var t task
	if err := json.Unmarshal(pg.raw, &t); err != nil {
		return nil, fmt.Errorf("tasks/get: the result is no Task: %w", err)
	}
	if t.TaskID != id || t.Status == "" {
		return nil, fmt.Errorf("tasks/get: the result is not task %s (taskId %q, status %q)", id, t.TaskID, t.Status)
	}
	return &t, nil
}

// cancelTask sends tasks/cancel, bounded by the request timeout and not by
// ctx (which has usually ended). Cancellation is cooperative; a failure is
// logged, since the call's outcome is decided already.
func (c *conn) cancelTask(ctx context.Context, s *session, id string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.requestTimeout)
	defer cancel()
	pg := &page{}
	_, err := s.client.CancelTask(context.WithValue(cctx, pageKey{}, pg), mcp.CancelTaskRequest{Params: mcp.CancelTaskParams{TaskId: id}})
	if err != nil && pg.raw == nil {
		c.logger.WarnContext(cctx, "mcp: tasks/cancel failed", "task", id, "err", err)
	}
}

// taskWakes lets a notifications/tasks wake the wait on its task before
// the poll interval is up. Servers send them only to clients that
// subscribe (subscriptions/listen), which patchbay does not do yet, so
// polling is what decides; a notification merely shortens a wait.
type taskWakes struct {
	mu sync.Mutex
	m  map[string][]chan struct{}
}

func (w *taskWakes) watch(id string) chan struct{} {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string][]chan struct{}{}
	}
	w.m[id] = append(w.m[id], ch)
	return ch
}

func (w *taskWakes) unwatch(id string, ch chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.m[id] = slices.DeleteFunc(w.m[id], func(c chan struct{}) bool { return c == ch })
	if len(w.m[id]) == 0 {
		delete(w.m, id)
	}
}

// notified wakes the waits on the task a notifications/tasks is about.
func (w *taskWakes) notified(n mcp.JSONRPCNotification) {
	if n.Method != methodTaskNotification {
		return
	}
	id, _ := n.Params.AdditionalFields["taskId"].(string)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ch := range w.m[id] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// methodTaskNotification is the extension's status notification.
const methodTaskNotification = "notifications/tasks"
