package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

var _ connect.ResourceReader = (*conn)(nil)

// ReadResource reads one resource, for a binding whose profile read names
// a resource rather than a tool. It goes out on the connection's own
// session. A read carrying a principal's credentials is refused rather
// than sent as the connection's own account: resource reads do not ride
// the per-tenant sessions calls use.
//
// Its value is the resource's one content (several: a list of them): a
// text parsed as JSON when it is JSON, else the text; a blob as
// {"blob": base64, "mimeType": …}.
func (c *conn) ReadResource(ctx context.Context, uri string, headers map[string]string) (any, error) {
	what := "read resource " + uri
	if c.closed.Load() {
		return nil, c.unavailable(what, errors.New("closed"))
	}
	if err := c.fault.get(); err != nil {
		return nil, c.unavailable(what, err)
	}
	if len(headers) > 0 {
		return nil, fmt.Errorf("mcp %s: %s: a principal's own credentials are not sent with resource reads; bind the read to a tool", c.name, what)
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, c.requestTimeout)
	defer cancel()
	ctx, s := withSlot(ctx)
	var req mcp.ReadResourceRequest
	req.Params.URI = uri
	res, err := c.own.client.ReadResource(ctx, req)
	switch {
	case err == nil:
		return resourceValue(res.Contents), nil
	case s.isTooLarge() || errors.Is(err, ErrResponseTooLarge):
		return nil, fmt.Errorf("mcp %s: %s: %w: the response exceeded the %d-byte limit (maxResponseBytes)", c.name, what, ErrResponseTooLarge, c.limit)
	case parent.Err() == nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return nil, fmt.Errorf("mcp %s: %s: no answer within %s (requestTimeoutMs): %w", c.name, what, c.requestTimeout, context.DeadlineExceeded)
	}
	return nil, fmt.Errorf("mcp %s: %s: %w", c.name, what, err)
}

func resourceValue(contents []mcp.ResourceContents) any {
	vals := make([]any, 0, len(contents))
	for _, rc := range contents {
		switch x := rc.(type) {
		case mcp.TextResourceContents:
			var v any
			if json.Unmarshal([]byte(x.Text), &v) != nil {
				v = x.Text
			}
			vals = append(vals, v)
		case mcp.BlobResourceContents:
			vals = append(vals, map[string]any{"blob": x.Blob, "mimeType": x.MIMEType})
		}
	}
	if len(vals) == 1 {
		return vals[0]
	}
	return vals
}
