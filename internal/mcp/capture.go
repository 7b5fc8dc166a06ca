package mcp

import (
	"context"
	"encoding/json"
	"sync"

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

	mu      sync.Mutex
	schemas map[string]json.RawMessage
}

var (
	_ transport.BidirectionalInterface = (*capture)(nil)
	_ transport.HTTPConnection         = (*httpCapture)(nil)
	_ transport.BidirectionalInterface = (*httpCapture)(nil)
)

// SendRequest forwards the request and notes the schemas of a tools/list
// result.
func (c *capture) SendRequest(ctx context.Context, req transport.JSONRPCRequest) (*transport.JSONRPCResponse, error) {
	resp, err := c.Interface.SendRequest(ctx, req)
	if err == nil && resp != nil && resp.Error == nil && req.Method == string(mcp.MethodToolsList) {
		c.note(resp.Result)
	}
	return resp, err
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

// httpCapture is capture over Streamable HTTP.
type httpCapture struct {
	*capture
	http *transport.StreamableHTTP
}

// SetProtocolVersion forwards the negotiated version, which the transport
// sends in the MCP-Protocol-Version header.
func (h *httpCapture) SetProtocolVersion(version string) { h.http.SetProtocolVersion(version) }

// RequiresLegacyProtocol forwards the transport's answer to whether it
// rules out the 2026-07-28 protocol.
func (h *httpCapture) RequiresLegacyProtocol() bool { return h.http.RequiresLegacyProtocol() }
