package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/harness"
)

// conn is one live session: a started child process or an HTTP session.
type conn struct {
	name           string
	kind           string // "stdio" or "http"
	requestTimeout time.Duration
	logger         *slog.Logger
	identity       harness.Identity

	client  *client.Client
	capture *capture // raw tools/list schemas
	proc    *process // stdio only

	// Set by connect, read-only afterwards.
	server   mcp.Implementation
	manifest harness.Manifest

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ harness.Conn = (*conn)(nil)

func (c *conn) Manifest() harness.Manifest { return c.manifest }

func (c *conn) Identity() harness.Identity { return c.identity }

// Info reports the transport, the negotiated protocol version and who the
// server says it is. It never carries header values or the URL, which may
// hold credentials.
func (c *conn) Info() map[string]any {
	info := map[string]any{
		"transport":       c.kind,
		"protocolVersion": c.client.ProtocolVersion(),
		"serverName":      c.server.Name,
		"serverVersion":   c.server.Version,
	}
	switch c.kind {
	case "http":
		info["session"] = c.client.GetSessionId() != ""
	case "stdio":
		if pid := c.proc.pid(); pid > 0 {
			info["pid"] = pid
		}
	}
	return info
}

// Call runs one tool. A result with isError is a *harness.CallError carrying
// the result's text; a failure to get a result at all is wrapped with the
// connection and operation names.
func (c *conn) Call(ctx context.Context, req harness.CallRequest) (any, error) {
	if c.closed.Load() {
		return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, harness.ErrUnavailable)
	}
	if _, ok := c.manifest.Operation(req.Op); !ok {
		return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, harness.ErrUnknownOperation)
	}
	ctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
	defer cancel()

	var call mcp.CallToolRequest
	call.Params.Name = req.Op
	call.Params.Arguments = req.Args
	if req.Args == nil {
		call.Params.Arguments = map[string]any{}
	}
	if req.IdempotencyKey != "" {
		call.Params.Meta = mcp.NewMetaFromMap(map[string]any{MetaIdempotencyKey: req.IdempotencyKey})
	}
	res, err := c.client.CallTool(ctx, call)
	if err != nil {
		if errors.Is(err, transport.ErrTransportClosed) || errors.Is(err, syscall.EPIPE) {
			// The server went away (a stdio child exited): the connection,
			// not the call, is what failed.
			return nil, fmt.Errorf("mcp %s: call %s: %w: %w", c.name, req.Op, harness.ErrUnavailable, err)
		}
		return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, err)
	}
	if res.IsError {
		return nil, &harness.CallError{Op: req.Op, Message: errorText(res.Content)}
	}
	v, err := resultValue(res)
	if err != nil {
		return nil, fmt.Errorf("mcp %s: call %s: %w", c.name, req.Op, err)
	}
	return v, nil
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
		done := make(chan error, 1)
		go func() { done <- c.client.Close() }()
		if c.proc == nil {
			c.closeErr = <-done
			return
		}
		err := c.proc.stop(done, closeGrace)
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
