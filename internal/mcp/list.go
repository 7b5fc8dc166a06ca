package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// maxPages bounds a listing, so a server that never stops paging fails the
// connect at once rather than at its timeout.
const maxPages = 100

// page is one listing request's explicit cursor (nil: none) and, once
// answered, its raw result. mcp-go cannot send an empty cursor nor tell an
// omitted nextCursor from an empty one, so listings go through capture with
// this in the context.
type page struct {
	cursor *string
	raw    json.RawMessage
}

type pageKey struct{}

// ErrListing is a listing that cannot be trusted to be complete.
var ErrListing = errors.New("incomplete listing")

// listPages reads a listing to its end: it follows nextCursor until a page
// omits it (an empty string is a cursor like any other), and fails when a
// page lacks the items array, a cursor repeats, or there are more than
// maxPages pages, rather than dropping items silently.
func listPages(ctx context.Context, what string, fetch func(ctx context.Context) error) ([]json.RawMessage, error) {
	var (
		items  []json.RawMessage
		cursor *string
		seen   = map[string]bool{}
	)
	for n := 1; ; n++ {
		if n > maxPages {
			return nil, fmt.Errorf("%w: %s/list has more than %d pages", ErrListing, what, maxPages)
		}
		pg := &page{cursor: cursor}
		if err := fetch(context.WithValue(ctx, pageKey{}, pg)); err != nil {
			return nil, fmt.Errorf("%s/list page %d: %w", what, n, err)
		}
		var shape map[string]json.RawMessage
		if err := json.Unmarshal(pg.raw, &shape); err != nil {
			return nil, fmt.Errorf("%w: %s/list page %d is not an object", ErrListing, what, n)
		}
		var list []json.RawMessage
		if raw, ok := shape[what]; !ok || json.Unmarshal(raw, &list) != nil || list == nil {
			return nil, fmt.Errorf("%w: %s/list page %d has no %s array", ErrListing, what, n, what)
		}
		items = append(items, list...)
		raw, ok := shape["nextCursor"]
		if !ok || string(raw) == "null" {
			return items, nil
		}
		var next string
		if err := json.Unmarshal(raw, &next); err != nil {
			return nil, fmt.Errorf("%w: %s/list page %d has a nextCursor that is not a string", ErrListing, what, n)
		}
		if seen[next] {
			return nil, fmt.Errorf("%w: %s/list page %d repeats cursor %q", ErrListing, what, n, next)
		}
		seen[next] = true
		cursor = &next
	}
}

// listTools reads every tool. mcp-go's result of each page is used for the
// tools themselves, since it has dropped those with invalid x-mcp-header
// annotations (with a warning), and the raw pages for completeness. When
// mcp-go cannot decode a page at all (one tool's schema has, say, a number
// for its type), the page is decoded tool by tool instead, so one broken
// tool does not take the others down.
func (c *conn) listTools(ctx context.Context) ([]connect.Operation, map[string]string, error) {
	type listed struct {
		tool mcp.Tool
		bad  string // why the tool cannot be used
	}
	var tools []listed
	_, err := listPages(ctx, "tools", func(ctx context.Context) error {
		res, err := c.client.ListToolsByPage(ctx, mcp.ListToolsRequest{})
		if err == nil {
			for _, t := range res.Tools {
				tools = append(tools, listed{tool: t})
			}
			return nil
		}
		pg, _ := ctx.Value(pageKey{}).(*page)
		if pg == nil || pg.raw == nil || !strings.Contains(err.Error(), "unmarshal") {
			return err
		}
		var raw struct {
			Tools []json.RawMessage `json:"tools"`
		}
		if json.Unmarshal(pg.raw, &raw) != nil {
			return err
		}
		for _, r := range raw.Tools {
			var t mcp.Tool
			if terr := json.Unmarshal(r, &t); terr != nil {
				var min struct {
					Name        string          `json:"name"`
					Description string          `json:"description"`
					InputSchema json.RawMessage `json:"inputSchema"`
				}
				_ = json.Unmarshal(r, &min)
				t = mcp.Tool{Name: min.Name, Description: min.Description, RawInputSchema: min.InputSchema}
				why := "the tool definition cannot be decoded: " + terr.Error()
				if serr := checkSchema(min.InputSchema); serr != nil {
					why = serr.Error()
				}
				tools = append(tools, listed{tool: t, bad: why})
				continue
			}
			if c.era == EraModern && c.wire != nil {
				if herr := mcp.ValidateParamHeaderAnnotations(&t); herr != nil {
					c.logger.Warn("mcp: excluding a tool with invalid x-mcp-header annotations", "tool", t.Name, "err", herr)
					continue
				}
			}
			tools = append(tools, listed{tool: t})
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	ops := make([]connect.Operation, 0, len(tools))
	seen := map[string]bool{}
	invalid := map[string]string{}
	c.tools = map[string]mcp.Tool{}
	for _, l := range tools {
		t := l.tool
		if t.Name == "" {
			return nil, nil, fmt.Errorf("%w: a tool has no name", ErrListing)
		}
		if seen[t.Name] {
			return nil, nil, fmt.Errorf("%w: tool %q is listed twice", ErrListing, t.Name)
		}
		seen[t.Name] = true
		op := c.operation(t)
		why := l.bad
		if why == "" {
			if err := checkSchema(op.InputSchema); err != nil {
				why = err.Error()
			}
		}
		if why != "" {
			invalid[t.Name] = why
			c.logger.Warn("mcp: tool is unusable; calls to it will fail", "tool", t.Name, "err", why)
		} else {
			c.tools[t.Name] = t
		}
		ops = append(ops, op)
	}
	return ops, invalid, nil
}

// listResources counts every resource, read to the end like tools.
func (c *conn) listResources(ctx context.Context) (int, error) {
	items, err := listPages(ctx, "resources", func(ctx context.Context) error {
		_, err := c.client.ListResourcesByPage(ctx, mcp.ListResourcesRequest{})
		return err
	})
	return len(items), err
}

// noFetch resolves every remote $ref to an open schema: patchbay never
// fetches schemas from the network on a server's say-so.
type noFetch struct{}

func (noFetch) Load(string) (any, error) { return map[string]any{}, nil }

// checkSchema compiles an inputSchema as JSON Schema (2020-12 unless it
// says otherwise). It must be an object schema.
func checkSchema(raw json.RawMessage) error {
	if len(raw) == 0 {
		return errors.New("no inputSchema")
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
	if err != nil {
		return fmt.Errorf("inputSchema is not JSON: %w", err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return errors.New("inputSchema is not a JSON object")
	}
	comp := jsonschema.NewCompiler()
	comp.UseLoader(noFetch{})
	if err := comp.AddResource("mem://input.json", doc); err != nil {
		return fmt.Errorf("inputSchema is not valid JSON Schema: %w", err)
	}
	if _, err := comp.Compile("mem://input.json"); err != nil {
		return fmt.Errorf("inputSchema is not valid JSON Schema: %w", err)
	}
	return nil
}
