package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// conn is one live session: a started child process or an HTTP session.
type conn struct {
	name           string
	kind           string // "stdio", "http" or "sse"
	requestTimeout time.Duration
	connectTimeout time.Duration
	limit          int64
	logger         *slog.Logger

	// The connection's own session (discovery's, and calls without
	// per-call headers); own holds the same three.
	client  *client.Client
	capture *capture // raw tools/list schemas
	// elicitor answers the servers' questions through the calls' Askers.
	elicitor *elicitor
	wire     *wire // http and sse only
	own      *session
	proc     *process // stdio only
	// treeTag is the stdio child's process tree tag (proctree): the one
	// the connect's context carries (a pool records it first), else fresh.
	treeTag string

	// Sessions of tenants, by distinct header set; openTenant opens one
	// (nil over stdio, where per-call headers cannot apply).
	tenants    *tenants
	openTenant func(ctx context.Context, headers map[string]string) (*session, error)
	configured map[string]string // the entry's headers, under the tenant's

	// Set by connect, read-only afterwards.
	era       string
	server    mcp.Implementation
	manifest  connect.Manifest
	invalid   map[string]string   // tool → why its schema was refused
	tools     map[string]mcp.Tool // usable tools, for a tenant's Mcp-Param-* headers
	resources int

	mu       sync.Mutex // identity
	identity connect.Identity

	taskWake taskWakes // waits on tasks, woken by notifications/tasks
	events   serverEvents
	streams  eventStreams // open events/stream requests, by request id

	fault    once
	done     chan struct{}
	doneOnce sync.Once

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var (
	_ connect.Conn          = (*conn)(nil)
	_ connect.EventPoller   = (*conn)(nil)
	_ connect.EventStreamer = (*conn)(nil)
)

func (c *conn) Manifest() connect.Manifest { return c.manifest }

func (c *conn) Identity() connect.Identity {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.identity
}

// Done is closed when the connection is lost (the child exited, its output
// was refused, the SSE stream or the network went away); Err says why. The
// registry watches it to mark the connection unavailable and reconnect.
func (c *conn) Done() <-chan struct{} { return c.done }

// Err is why Done was closed, nil before.
func (c *conn) Err() error { return c.fault.get() }

// fail records the first reason the connection was lost and closes Done.
func (c *conn) fail(err error) {
	if c.fault.set(err) && !c.closed.Load() {
		c.logger.Error("mcp: connection lost", "err", err)
	}
	c.doneOnce.Do(func() { close(c.done) })
}

// Info reports the transport, the protocol era and version, who the server
// says it is and how many tools and resources it listed. It never carries
// header values or the URL, which may hold credentials.
func (c *conn) Info() map[string]any {
	info := map[string]any{
		"transport":       c.kind,
		"era":             c.era,
		"protocolVersion": c.client.ProtocolVersion(),
		"serverName":      c.server.Name,
		"serverVersion":   c.server.Version,
		"tools":           len(c.manifest.Operations),
		"resources":       c.resources,
	}
	if len(c.invalid) > 0 {
		info["invalidTools"] = c.invalid
	}
	if n := len(c.events.get()); n > 0 {
		info["events"] = n
	}
	if e := c.events.lastErr(); e != "" {
		info["eventsError"] = e
	}
	switch c.kind {
	case "http", "sse":
		info["session"] = c.client.GetSessionId() != ""
		info["tenantSessions"] = c.tenants.len()
	case "stdio":
		if pid := c.proc.pid(); pid > 0 {
			info["pid"] = pid
		}
	}
	return info
}

func (c *conn) unavailable(op string, cause error) error {
	return fmt.Errorf("mcp %s: call %s: %w: %w", c.name, op, connect.ErrUnavailable, cause)
}

// Call runs one tool. A result with isError is a *connect.CallError carrying
// the result's text; a failure to get a result at all is wrapped with the
// connection and operation names, and with connect.ErrUnavailable when the
// connection itself is gone.
//
// A call with Headers goes out on the session of its tenant (see
// callTenant); over stdio such a call is refused, since a child process
// has no per-call headers.
func (c *conn) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	if c.closed.Load() {
		return nil, c.unavailable(req.Op, errors.New("closed"))
	}
	if err := c.fault.get(); err != nil {
		return nil, c.unavailable(req.Op, err)
	}
	if _, ok := c.manifest.Operation(req.Op); !ok {
		return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, connect.ErrUnknownOperation)
	}
	if why, bad := c.invalid[req.Op]; bad {
		return nil, fmt.Errorf("mcp %s: call %s: the server declared an unusable tool: %s", c.name, req.Op, why)
	}
	var (
		res *mcp.CallToolResult
		err error
	)
	if len(req.Headers) > 0 {
		res, err = c.callTenant(ctx, req)
	} else {
		res, err = c.callOn(ctx, c.own, req)
	}
	if err != nil {
		return nil, err
	}
	if res.IsError {
		return nil, &connect.CallError{Op: req.Op, Message: errorText(res.Content), Code: errorCode(res)}
	}
	v, err := resultValue(res)
	if err != nil {
		return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, err)
	}
	return v, nil
}

// callTenant sends a call with per-call headers on the session of its
// tenant: the configured headers overlaid by the call's, one session per
// distinct set, opened on first use and reused after, never the
// connection's own session nor another set's. Whatever goes wrong on a
// tenant's session fails that tenant's call only.
func (c *conn) callTenant(ctx context.Context, req connect.CallRequest) (*mcp.CallToolResult, error) {
	if c.openTenant == nil {
		return nil, fmt.Errorf("mcp %s: call %s: per-call headers (credentials of principal %q) cannot be sent to a %s server: refused rather than sent without them",
			c.name, req.Op, req.Principal, c.kind)
	}
	headers, key, err := tenantHeaders(c.configured, req.Headers)
	if err != nil {
		return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, err)
	}
	t, err := c.tenants.acquire(ctx, key, func() (*session, error) {
		// Bounded by timeoutMs, not by this call: others may wait on it.
		octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.connectTimeout)
		defer cancel()
		return c.openTenant(octx, headers)
	})
	if err != nil {
		if errors.Is(err, errTenantsClosed) {
			return nil, c.unavailable(req.Op, err)
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, ctx.Err())
		}
		return nil, fmt.Errorf("mcp %s: call %s: open a session for principal %q: %w", c.name, req.Op, req.Principal, tenantErr(err))
	}
	defer c.tenants.release(t)
	res, err := c.callOn(ctx, t.sess, req)
	if err != nil && t.sess.lost.get() != nil {
		c.tenants.lose(t)
	}
	return res, err
}

// tenantErr marks a tenant's 401 as a sign-in the principal needs: the
// server refused the credentials resolved for it.
func tenantErr(err error) error {
	var se *StatusError
	if errors.Is(err, transport.ErrAuthorizationRequired) || errors.As(err, &se) && se.Status == http.StatusUnauthorized {
		return fmt.Errorf("%w: the server answered HTTP 401 to this caller's credentials: %w", connect.ErrNeedsSignIn, err)
	}
	return err
}

// callOn sends a call on session s and, when the server answers with a
// task, waits for the task on the same session (a task is bound to the
// credentials that made it); a call resuming a task sends no call and
// waits on it.
func (c *conn) callOn(ctx context.Context, s *session, req connect.CallRequest) (*mcp.CallToolResult, error) {
	w := req.Task
	if w == nil {
		w = noWatch
	}
	if w.Resume != "" {
		return c.await(ctx, s, req, w, nil)
	}
	ctx, sink := withTaskSink(ctx)
	res, err := c.send(ctx, s, req)
	if err != nil || sink.task == nil {
		return res, err
	}
	return c.follow(ctx, s, req, w, sink.task)
}

// send sends a call on session s. When the server expired a 2025
// session, it is re-initialized once and the call sent again; expiring
// again straight away fails the call rather than looping.
func (c *conn) send(ctx context.Context, s *session, req connect.CallRequest) (*mcp.CallToolResult, error) {
	gen := s.generation()
	res, err := c.callOnce(ctx, s, req)
	if err == nil || !errors.Is(err, transport.ErrSessionTerminated) || c.era != EraLegacy || ctx.Err() != nil {
		return res, err
	}
	if rerr := c.reinit(ctx, s, gen); rerr != nil {
		rerr = fmt.Errorf("session expired and re-initialize failed: %w", rerr)
		if s.tenant {
			s.lost.set(rerr)
			return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, tenantErr(rerr))
		}
		c.fail(rerr)
		return nil, c.unavailable(req.Op, rerr)
	}
	res, err = c.callOnce(ctx, s, req)
	if err != nil && errors.Is(err, transport.ErrSessionTerminated) {
		return nil, fmt.Errorf("mcp %s: call %s: the server expired the session again right after it was re-initialized; not retrying: %w",
			c.name, req.Op, transport.ErrSessionTerminated)
	}
	return res, err
}

func (c *conn) callOnce(ctx context.Context, sess *session, req connect.CallRequest) (*mcp.CallToolResult, error) {
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timeout := &pausable{d: c.requestTimeout, cancel: cancel}
	timeout.timer = time.AfterFunc(c.requestTimeout, func() { cancel(errRequestTimeout) })
	defer timeout.timer.Stop()
	ctx, s := withSlot(ctx)
	s.ask, s.callCtx, s.timeout, s.park, s.resumeWith = req.Ask, parent, timeout, req.Park, req.Resume
	if req.Ask != nil {
		c.elicitor.enter(s)
		defer c.elicitor.leave(s)
	}

	var fields [4]metaField
	meta := fields[:0]
	if req.IdempotencyKey != "" {
		meta = append(meta, metaField{key: MetaIdempotencyKey, value: req.IdempotencyKey})
	}
	if req.Approval != "" {
		meta = append(meta, metaField{key: MetaApproval, value: req.Approval})
	}
	meta = c.traceCall(ctx, sess, req.Op, meta)
	var (
		res *mcp.CallToolResult
		err error
	)
	if sess.direct != nil {
		res, err = sess.direct.call(ctx, req.Op, req.Args, meta)
	} else {
		res, err = sess.client.CallTool(ctx, callToolRequest(req.Op, req.Args, meta))
	}
	if err == nil {
		return res, nil
	}
	if r := s.input(); r != nil && s.park && errors.Is(err, errParked) {
		ir, ierr := inputRequired(req.Op, r)
		if ierr != nil {
			return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, ierr)
		}
		return nil, ir
	}
	switch {
	case s.isTooLarge() || errors.Is(err, ErrResponseTooLarge):
		return nil, fmt.Errorf("mcp %s: call %s: %w: the response exceeded the %d-byte limit (maxResponseBytes)", c.name, req.Op, ErrResponseTooLarge, c.limit)
	case c.proc != nil && (errors.Is(err, transport.ErrTransportClosed) || errors.Is(err, syscall.EPIPE) || c.fault.get() != nil):
		// The server went away (the child exited, or its output was
		// refused): the connection, not the call, is what failed.
		if f := c.waitFault(); f != nil {
			return nil, c.unavailable(req.Op, f)
		}
		return nil, c.unavailable(req.Op, err)
	case parent.Err() != nil:
		return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, parent.Err())
	case errors.Is(context.Cause(ctx), errRequestTimeout):
		return nil, fmt.Errorf("mcp %s: call %s: no answer within %s (requestTimeoutMs): %w", c.name, req.Op, c.requestTimeout, context.DeadlineExceeded)
	case errors.Is(err, ErrStreamBroken):
		return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, err)
	case sess.tenant && errors.Is(err, transport.ErrAuthorizationRequired):
		return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, tenantErr(err))
	case sess.wire != nil && isNetwork(err):
		if sess.tenant {
			// This tenant's session is suspect; the connection's own
			// session answers for the server.
			sess.lost.set(fmt.Errorf("network: %w", err))
			return nil, fmt.Errorf("mcp %s: call %s: network: %w", c.name, req.Op, err)
		}
		c.fail(fmt.Errorf("network: %w", err))
		return nil, c.unavailable(req.Op, err)
	}
	return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, err)
}

// callToolRequest is the request mcp-go's CallTool is given for a call:
// its arguments ({} for none) and patchbay's _meta fields, if any.
func callToolRequest(op string, args map[string]any, meta []metaField) mcp.CallToolRequest {
	var call mcp.CallToolRequest
	call.Params.Name = op
	call.Params.Arguments = args
	if args == nil {
		call.Params.Arguments = map[string]any{}
	}
	if len(meta) > 0 {
		m := make(map[string]any, len(meta))
		for _, f := range meta {
			m[f.key] = f.value
		}
		call.Params.Meta = mcp.NewMetaFromMap(m)
	}
	return call
}

// waitFault gives the process watcher a moment to record why a stdio
// server went away, since mcp-go may notice first.
func (c *conn) waitFault() error {
	select {
	case <-c.done:
	case <-time.After(time.Second):
	}
	return c.fault.get()
}

func isNetwork(err error) bool {
	var uerr *url.Error
	var nerr net.Error
	return errors.As(err, &uerr) || errors.As(err, &nerr) || errors.Is(err, io.ErrUnexpectedEOF)
}

// reinit runs the handshake again on s after the server expired its
// session, unless another call did since generation gen. The identity's
// epoch moves on but its instance stays: a remote server's instance is
// derived from its URL because it is the same server whichever replica or
// session reaches it (each replica has sessions of its own, and every
// replica must judge recorded results alike), and one caller's expired
// session must not make every other caller's results look stale.
func (c *conn) reinit(ctx context.Context, s *session, gen int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen {
		return nil // another call re-initialized it already
	}
	if _, err := s.client.Initialize(ctx, mcp.InitializeRequest{
		Params: mcp.InitializeParams{ClientInfo: mcp.Implementation{Name: "patchbay", Version: buildVersion()}},
	}); err != nil {
		return err
	}
	s.gen++
	c.mu.Lock()
	c.identity.Epoch++
	c.mu.Unlock()
	if s.tenant {
		c.logger.InfoContext(ctx, "mcp: a caller's session expired; re-initialized")
	} else {
		c.logger.InfoContext(ctx, "mcp: session expired; re-initialized")
	}
	return nil
}

// resultValue maps a tool result to the value a step sees: the structured
// content when there is any; else the first text block, decoded when it is
// JSON; else nil.
func resultValue(res *mcp.CallToolResult) (any, error) {
	if raw := res.RawStructuredContent; len(raw) > 0 && string(raw) != "null" {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("decode structuredContent: %w", err)
		}
		return v, nil
	}
	if res.StructuredContent != nil {
		// Built in process rather than decoded from the wire: normalise it to
		// what decoding would give, so callers see one shape.
		b, err := json.Marshal(res.StructuredContent)
		if err != nil {
			return nil, fmt.Errorf("encode structuredContent: %w", err)
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("decode structuredContent: %w", err)
		}
		return v, nil
	}
	for _, content := range res.Content {
		text, ok := textOf(content)
		if !ok {
			continue
		}
		var v any
		if json.Valid([]byte(text)) && json.Unmarshal([]byte(text), &v) == nil {
			return v, nil
		}
		return text, nil
	}
	return nil, nil
}

func textOf(content mcp.Content) (string, bool) {
	switch t := content.(type) {
	case mcp.TextContent:
		return t.Text, true
	case *mcp.TextContent:
		return t.Text, true
	}
	return "", false
}

// errorText joins the text blocks of an isError result.
func errorText(contents []mcp.Content) string {
	var parts []string
	for _, content := range contents {
		if text, ok := textOf(content); ok && text != "" {
			parts = append(parts, text)
		}
	}
	if len(parts) == 0 {
		return "the tool reported an error without a message"
	}
	return strings.Join(parts, "\n")
}

// closeGrace is how long a stdio server gets to exit after its stdin is
// closed, and again after SIGTERM, before its process group is killed.
const closeGrace = 2 * time.Second

// Close ends the session. For stdio it closes the server's stdin, signals
// its process group if it lingers, and finally kills whatever is left of the
// group, so nothing the server started outlives the connection. The child's
// exit status is not an error: it was asked to stop.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		if c.tenants != nil {
			c.tenants.closeAll()
		}
		if c.proc != nil {
			c.proc.remember()
		}
		var err error
		if c.client != nil {
			err = c.client.Close()
		}
		if c.proc != nil {
			err = c.proc.stop(closeGrace)
		}
		c.doneOnce.Do(func() { close(c.done) })
		if err != nil {
			c.closeErr = fmt.Errorf("mcp %s: close: %w", c.name, err)
		}
	})
	return c.closeErr
}

func (c *conn) schema(t mcp.Tool) json.RawMessage {
	if raw, ok := c.capture.schema(t.Name); ok {
		return raw
	}
	var (
		b   []byte
		err error
	)
	if t.RawInputSchema != nil {
		b = t.RawInputSchema
	} else if b, err = json.Marshal(t.InputSchema); err != nil {
		c.logger.Warn("mcp: encode input schema", "tool", t.Name, "err", err)
		return nil
	}
	return json.RawMessage(b)
}

// errorCode is the code a tool error gives in its structured content
// ({"code": "guarded"}), or "".
func errorCode(res *mcp.CallToolResult) string {
	v, err := resultValue(&mcp.CallToolResult{RawStructuredContent: res.RawStructuredContent, StructuredContent: res.StructuredContent})
	if m, ok := v.(map[string]any); ok && err == nil {
		if code, ok := m["code"].(string); ok {
			return code
		}
	}
	return ""
}
