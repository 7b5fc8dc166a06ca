package acp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
)

// incoming is a request of the agent being handled.
type incoming struct {
	c         *Conn
	id        json.RawMessage
	method    string
	sessionID string
	ctx       context.Context
	cancel    context.CancelFunc
	once      sync.Once
}

// respond answers the request, once: a later answer (a handler returning
// after its session was cancelled) is dropped.
func (in *incoming) respond(result any, rpcErr *RPCError) {
	in.once.Do(func() { in.c.reply(in.id, result, rpcErr) })
}

// handler serves one method of the agent's; it returns the result or an
// error (an *RPCError chooses the code, anything else is internal).
type handler func(in *incoming, params json.RawMessage) (any, error)

// handlerFor returns the handler of method, or nil when patchbay does not
// serve it: the optional capabilities are served only when declared.
func (c *Conn) handlerFor(method string) handler {
	switch method {
	case "session/request_permission":
		return c.requestPermission
	case "fs/read_text_file":
		if c.fs != nil {
			return c.readTextFile
		}
	case "fs/write_text_file":
		if c.fs != nil && c.fs.write {
			return c.writeTextFile
		}
	case "terminal/create", "terminal/output", "terminal/wait_for_exit", "terminal/kill", "terminal/release":
		if c.terms != nil {
			return c.terminal
		}
	}
	return nil
}

// handleRequest answers a request of the agent on a goroutine of its own,
// once the updates sent before it have been delivered.
func (c *Conn) handleRequest(m message) {
	h := c.handlerFor(m.Method)
	if h == nil {
		data, _ := json.Marshal(map[string]string{"method": m.Method})
		c.reply(m.ID, nil, &RPCError{Code: CodeMethodNotFound, Message: "Method not found", Data: data})
		return
	}
	var scope struct {
		SessionID string `json:"sessionId"`
	}
	_ = json.Unmarshal(m.Params, &scope) // a handler rejects bad params
	in := c.track(m, scope.SessionID)
	if in == nil {
		return // the connection has ended
	}
	seq := c.order.queued.Load()
	go func() {
		defer c.handlers.Done()
		defer c.untrack(in)
		if err := c.await(in.ctx, seq); err != nil {
			in.respond(nil, &RPCError{Code: CodeCancelled, Message: "Request cancelled"})
			return
		}
		result, err := h(in, m.Params)
		in.respond(result, rpcError(err))
	}()
}

// track registers a request being handled, or returns nil once the
// connection has ended (Close must not miss a handler it waits for).
func (c *Conn) track(m message, sessionID string) *incoming {
	ctx, cancel := context.WithCancel(c.ctx)
	in := &incoming{c: c, id: m.ID, method: m.Method, sessionID: sessionID, ctx: ctx, cancel: cancel}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		cancel()
		return nil
	}
	c.handlers.Add(1)
	c.inflight[idKey(m.ID)] = in
	return in
}

func (c *Conn) untrack(in *incoming) {
	in.cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight[idKey(in.id)] == in {
		delete(c.inflight, idKey(in.id))
	}
}

// idKey is a request id as a map key: its compact JSON.
func idKey(id json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, id) != nil {
		return string(id)
	}
	return b.String()
}

// cancelIncoming handles $/cancel_request: the agent no longer wants the
// answer to one of its requests, which is answered "cancelled" at once
// and its handler's ctx cancelled.
func (c *Conn) cancelIncoming(params json.RawMessage) {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || p.RequestID == nil {
		return
	}
	c.mu.Lock()
	in := c.inflight[idKey(p.RequestID)]
	c.mu.Unlock()
	if in != nil {
		in.respond(nil, &RPCError{Code: CodeCancelled, Message: "Request cancelled"})
		in.cancel()
	}
}

// cancelPermissions answers every pending permission request of session
// "cancelled", as ACP requires of a client that cancels a turn, and
// cancels their handlers' ctx.
func (c *Conn) cancelPermissions(sessionID string) {
	c.mu.Lock()
	var ins []*incoming
	for _, in := range c.inflight {
		if in.method == "session/request_permission" && in.sessionID == sessionID {
			ins = append(ins, in)
		}
	}
	c.mu.Unlock()
	for _, in := range ins {
		in.respond(permissionResult(PermissionOutcome{}), nil)
		in.cancel()
	}
}

// rpcError is the JSON-RPC error the agent gets for a handler's error.
func rpcError(err error) *RPCError {
	if err == nil {
		return nil
	}
	var re *RPCError
	if errors.As(err, &re) {
		return re
	}
	return &RPCError{Code: CodeInternalError, Message: err.Error()}
}

func invalidParams(format string, args ...any) *RPCError {
	return &RPCError{Code: CodeInvalidParams, Message: fmt.Sprintf(format, args...)}
}

// decodeParams decodes a request's params, or says they are invalid.
func decodeParams(params json.RawMessage, v any) error {
	if err := json.Unmarshal(params, v); err != nil {
		return invalidParams("invalid params: %v", err)
	}
	return nil
}

type permissionOutcomeWire struct {
	Outcome  string `json:"outcome"`
	OptionID string `json:"optionId,omitempty"`
}

func permissionResult(o PermissionOutcome) any {
	w := permissionOutcomeWire{Outcome: "cancelled"}
	if !o.Cancelled() {
		w = permissionOutcomeWire{Outcome: "selected", OptionID: o.OptionID}
	}
	return struct {
		Outcome permissionOutcomeWire `json:"outcome"`
	}{w}
}

// requestPermission asks the Client. An option the agent did not offer is
// refused rather than sent on: the agent could not act on it.
func (c *Conn) requestPermission(in *incoming, params json.RawMessage) (any, error) {
	var r PermissionRequest
	if err := decodeParams(params, &r); err != nil {
		return nil, err
	}
	o, err := c.client.RequestPermission(in.ctx, r)
	if err != nil {
		return nil, err
	}
	if !o.Cancelled() && !r.offers(o.OptionID) {
		return nil, fmt.Errorf("the client chose option %q, which was not offered", o.OptionID)
	}
	return permissionResult(o), nil
}

// knownSession refuses a request about a session this connection did not
// create or load.
func (c *Conn) knownSession(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.sessions[id] {
		return invalidParams("unknown session %q", id)
	}
	return nil
}

// decodeUpdate decodes session/update params: the kind always, the common
// kinds' content when it decodes, and the update raw in any case.
func decodeUpdate(params json.RawMessage) (SessionNotification, error) {
	var p struct {
		SessionID string          `json:"sessionId"`
		Update    json.RawMessage `json:"update"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return SessionNotification{}, fmt.Errorf("session/update: %w", err)
	}
	var head struct {
		Kind UpdateKind `json:"sessionUpdate"`
	}
	if err := json.Unmarshal(p.Update, &head); err != nil || head.Kind == "" {
		return SessionNotification{}, fmt.Errorf("session/update: no sessionUpdate kind in %s", clip(p.Update, 80))
	}
	n := SessionNotification{SessionID: p.SessionID, Kind: head.Kind, Update: p.Update}
	switch head.Kind {
	case UpdateUserMessageChunk, UpdateAgentMessageChunk, UpdateAgentThoughtChunk:
		var chunk struct {
			Content *ContentBlock `json:"content"`
		}
		if json.Unmarshal(p.Update, &chunk) == nil {
			n.Content = chunk.Content
		}
	case UpdateToolCall, UpdateToolCallUpdate:
		var tc ToolCall
		if json.Unmarshal(p.Update, &tc) == nil {
			n.ToolCall = &tc
		}
	case UpdatePlan:
		var plan struct {
			Entries []PlanEntry `json:"entries"`
		}
		if json.Unmarshal(p.Update, &plan) == nil {
			n.Plan = plan.Entries
		}
	}
	return n, nil
}
