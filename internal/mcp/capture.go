package mcp

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// capture sits between mcp-go's client and its transport and keeps the raw
// inputSchema of every tool in tools/list responses. mcp-go decodes a
// schema into a struct that keeps only type, properties, required,
// additionalProperties and $defs, so keywords such as oneOf, allOf, enum at
// the top level or $schema would be lost, and patchbay validates arguments
// against the schema the server declared.
//
// The client looks for optional interfaces on its transport, so the wrapper
// must offer exactly the ones the wrapped transport has: capture forwards
// BidirectionalInterface (server-to-client requests), and httpCapture adds
// HTTPConnection and the legacy-protocol check of Streamable HTTP. A stdio
// transport must not look like an HTTPConnection, or the client would stop
// sending notifications/cancelled for abandoned calls.
type capture struct {
	transport.Interface
	wire *wire // HTTP only

	// reissue is set once the session speaks 2026-07-28 over Streamable
	// HTTP: a request whose response stream breaks is sent again.
	reissue atomic.Bool
	// modernOnly refuses the initialize fallback: a tenant's session must
	// speak the era its connection settled on.
	modernOnly bool
	// tools, on a tenant's session, are the connection's listed tools, for
	// the Mcp-Param-* headers mcp-go mirrors only for tools its own client
	// has listed (a tenant's client lists none).
	tools map[string]mcp.Tool

	mu      sync.Mutex
	schemas map[string]json.RawMessage
	// server is the raw result of the last initialize or server/discover,
	// for the capabilities mcp-go's struct does not keep (events).
	server json.RawMessage
}

// serverResult is the raw result of the handshake.
func (c *capture) serverResult() json.RawMessage {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.server
}

// maxReissues bounds how often a request whose 2026-07-28 response stream
// broke is sent again, each time under a new id.
const maxReissues = 2

// ErrStreamBroken: the server's response stream to a 2026-07-28 request
// ended or broke before the response, on every attempt.
var ErrStreamBroken = errors.New("response stream broken")

var (
	_ transport.BidirectionalInterface = (*capture)(nil)
	_ transport.HTTPConnection         = (*httpCapture)(nil)
	_ transport.BidirectionalInterface = (*httpCapture)(nil)
)

// SendRequest forwards the request and notes the schemas of a tools/list
// result.
//
// It also carries out what mcp-go's client cannot be told: an initialize
// after a server/discover that failed with 401, 403, 5xx or no answer is
// refused with that failure (errors are not downgrades), and a listing
// request may carry an explicit cursor, even an empty one, and hand its raw
// result back (see withPage).
func (c *capture) SendRequest(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
	if req.Method == string(mcp.MethodInitialize) && c.wire != nil {
		if err := c.wire.fatalErr(); err != nil {
			return nil, fmt.Errorf("server/discover failed, not falling back to initialize: %w", err)
		}
		if c.modernOnly {
			return nil, errors.New("server/discover failed for this caller's session, and the connection speaks 2026-07-28: not falling back to initialize")
		}
	}
	pg, _ := ctx.Value(pageKey{}).(*page)
	if pg != nil && pg.cursor != nil {
		req.Params = withCursor(req.Params, *pg.cursor)
	}
	if req.Method == string(mcp.MethodToolsCall) {
		req.Params = withResume(ctx, req.Params)
	}
	if req.Method == string(mcp.MethodToolsCall) && c.tools != nil {
		req.Header = c.paramHeaders(req)
	}
	if c.wire != nil && taskMethod(req.Method) {
		req.Header = taskHeaders(req)
	}
	resp, err := c.send(ctx, req)
	if err == nil && req.Method == string(mcp.MethodServerDiscover) && rejectsButSupports(resp) {
		// The server refused the version it says it supports: a modern
		// server that, for whatever reason, wants the request again. Send
		// it once more, under a new id, before anyone concludes the server
		// is not modern.
		retry := req
		retry.ID = mcp.NewRequestId("pb-discover-" + rand.Text())
		resp, err = c.send(ctx, retry)
	}
	if err == nil && resp != nil && resp.Error == nil {
		switch req.Method {
		case string(mcp.MethodInitialize), string(mcp.MethodServerDiscover):
			c.mu.Lock()
			c.server = resp.Result
			c.mu.Unlock()
		case string(mcp.MethodToolsList):
			c.note(resp.Result)
		case string(mcp.MethodToolsCall):
			resp.Result = takeTask(ctx, resp.Result)
			noteInputRequired(ctx, resp.Result)
		}
		if pg != nil {
			pg.raw = resp.Result
		}
	}
	return resp, err
}

// send sends req. On a 2026-07-28 session over Streamable HTTP, a response
// stream that ends or breaks before the response arrives is not resumable
// (there is no session to resume it on), and mcp-go fails the request with
// an error that does not say so; send re-issues the request under a new id,
// at most maxReissues times, then fails with ErrStreamBroken. The params,
// and with them the idempotency key in _meta, stay the same, so a server
// can tell a re-issued call from a new one. A request the caller cancelled
// or timed out, or whose response was too large, is not re-issued.
func (c *capture) send(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
	if c.wire == nil || !c.reissue.Load() {
		return c.Interface.SendRequest(ctx, req)
	}
	for attempt := 1; ; attempt++ {
		wctx, watch := withStreamWatch(ctx)
		resp, err := c.Interface.SendRequest(wctx, req)
		if err == nil || ctx.Err() != nil || !watch.broken() {
			return resp, err
		}
		if attempt > maxReissues {
			return nil, fmt.Errorf("%w: the server's response stream to %s ended before the response on all %d attempts (re-issued with a new request id %d times): %w",
				ErrStreamBroken, req.Method, attempt, maxReissues, err)
		}
		req.ID = mcp.NewRequestId("pb-reissue-" + rand.Text())
	}
}

// paramHeaders adds the Mcp-Param-* headers of a tools/call to its headers.
func (c *capture) paramHeaders(req transport.JSONRPCRequest) http.Header {
	params, err := json.Marshal(req.Params)
	if err != nil {
		return req.Header
	}
	var call struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(params, &call) != nil {
		return req.Header
	}
	tool, ok := c.tools[call.Name]
	if !ok {
		return req.Header
	}
	extra := mcp.GenerateParamHeaders(&tool, params)
	if len(extra) == 0 {
		return req.Header
	}
	h := req.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	for k, v := range extra {
		h.Set(k, v)
	}
	return h
}

// rejectsButSupports reports whether resp is an UnsupportedProtocolVersion
// error whose supported list has the 2026-07-28 version mcp-go asked for.
func rejectsButSupports(resp *transport.JSONRPCResponse) bool {
	if resp == nil || resp.Error == nil || resp.Error.Code != mcp.UNSUPPORTED_PROTOCOL_VERSION {
		return false
	}
	b, err := json.Marshal(resp.Error.Data)
	if err != nil {
		return false
	}
	var data struct {
		Supported []string `json:"supported"`
	}
	if json.Unmarshal(b, &data) != nil {
		return false
	}
	return slices.Contains(data.Supported, mcp.LATEST_PROTOCOL_VERSION)
}

// withCursor sets params.cursor, which mcp-go omits when empty.
func withCursor(params any, cursor string) any {
	fields := map[string]json.RawMessage{}
	if params != nil {
		if b, err := json.Marshal(params); err == nil {
			_ = json.Unmarshal(b, &fields)
		}
	}
	fields["cursor"], _ = json.Marshal(cursor)
	return fields
}

// SetRequestHandler forwards to the transport when it takes server-to-client
// requests.
func (c *capture) SetRequestHandler(h transport.RequestHandler) {
	if b, ok := c.Interface.(transport.BidirectionalInterface); ok {
		b.SetRequestHandler(h)
	}
}

func (c *capture) note(result json.RawMessage) {
	var page struct {
		Tools []struct {
			Name        string          `json:"name"`
			InputSchema json.RawMessage `json:"inputSchema"`
		} `json:"tools"`
	}
	if json.Unmarshal(result, &page) != nil {
		return // mcp-go reports the malformed result
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.schemas == nil {
		c.schemas = map[string]json.RawMessage{}
	}
	for _, t := range page.Tools {
		if len(t.InputSchema) > 0 && string(t.InputSchema) != "null" {
			c.schemas[t.Name] = t.InputSchema
		}
	}
}

// schema is the raw inputSchema last listed for the tool.
func (c *capture) schema(name string) (json.RawMessage, bool) {
	if c == nil {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	raw, ok := c.schemas[name]
	return raw, ok
}

// httpCapture is capture over Streamable HTTP or legacy SSE.
type httpCapture struct {
	*capture
	http interface {
		SetProtocolVersion(version string)
	}
}

// SetProtocolVersion forwards the negotiated version, which the transport
// sends in the MCP-Protocol-Version header.
func (h *httpCapture) SetProtocolVersion(version string) { h.http.SetProtocolVersion(version) }

// RequiresLegacyProtocol says whether the transport rules out the
// 2026-07-28 protocol: legacy SSE does. Streamable HTTP is built with
// continuous listening, for which mcp-go's transport says it does, but its
// listener stands down on a modern connection, so 2026-07-28 is still
// probed first; on a 2025 session the GET stream carries the server's own
// requests (pings, and elicitations patchbay refuses).
func (h *httpCapture) RequiresLegacyProtocol() bool {
	_, streamable := h.http.(*transport.StreamableHTTP)
	return !streamable
}

// SetConnectionLostHandler forwards to transports that report a lost
// connection (legacy SSE).
func (h *httpCapture) SetConnectionLostHandler(f func(error)) {
	if s, ok := h.http.(interface{ SetConnectionLostHandler(func(error)) }); ok {
		s.SetConnectionLostHandler(f)
	}
}

func taskMethod(m string) bool {
	return m == string(mcp.MethodTasksGet) || m == string(mcp.MethodTasksCancel) || m == "tasks/update"
}

// taskHeaders adds the Mcp-Name header the Tasks extension asks for on
// tasks/* over Streamable HTTP (the task id), so a load balancer can route
// the request to the instance holding the task; mcp-go sets it only for
// tools, prompts and resources.
func taskHeaders(req transport.JSONRPCRequest) http.Header {
	params, err := json.Marshal(req.Params)
	if err != nil {
		return req.Header
	}
	var p struct {
		TaskID string `json:"taskId"`
	}
	if json.Unmarshal(params, &p) != nil || p.TaskID == "" {
		return req.Header
	}
	h := req.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Set(mcp.HeaderName, p.TaskID)
	return h
}
