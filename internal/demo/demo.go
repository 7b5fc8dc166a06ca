// Package demo owns the tools of patchbay's demo MCP server: echo, add,
// note_put, note_get and fail, and slow_job, which Jobs runs as a task of
// the MCP Tasks extension over HTTP. cmd/demo-mcp serves them over stdio or
// Streamable HTTP, and the tests of internal/mcp serve them in-process, so
// both exercise the same server.
//
// The tools are deliberately small but cover what a provider has to map:
// structured and text results, tool errors (isError), state kept between
// calls, and the idempotency key patchbay sends in _meta, which echo reports
// back so a test can see it arrive.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// Name and Version identify the demo server in its serverInfo.
const (
	Name    = "patchbay-demo"
	Version = "0.1.0"
)

// idempotencyKeyMeta is the _meta key patchbay sends its idempotency key
// under. It is spelled out here rather than imported from internal/mcp so the
// demo server depends on nothing of the client it is used to test.
const idempotencyKeyMeta = "io.patchbay/idempotency-key"

// NewServer returns an MCP server with the demo tools and an empty note
// store of its own. opts are passed to mcp-go (tests use them, for example,
// to add tools or set a pagination limit).
func NewServer(opts ...server.ServerOption) *server.MCPServer {
	opts = append([]server.ServerOption{
		server.WithToolCapabilities(false),
		server.WithRecovery(),
		server.WithInstructions("A demo server for patchbay: echo text, add numbers, keep notes, and fail on purpose."),
	}, opts...)
	s := server.NewMCPServer(Name, Version, opts...)
	n := &notes{m: map[string]string{}}
	s.AddTools(
		server.ServerTool{Tool: echoTool, Handler: echo},
		server.ServerTool{Tool: addTool, Handler: add},
		server.ServerTool{Tool: notePutTool, Handler: n.put},
		server.ServerTool{Tool: noteGetTool, Handler: n.get},
		server.ServerTool{Tool: failTool, Handler: fail},
	)
	return s
}

// hints sets every annotation explicitly, because mcp.NewTool defaults to
// the most cautious values (destructive, open world), which would make every
// demo tool look dangerous to patchbay's policy.
func hints(title string, readOnly, destructive, idempotent bool) mcp.ToolOption {
	return mcp.WithToolAnnotation(mcp.ToolAnnotation{
		Title:           title,
		ReadOnlyHint:    mcp.ToBoolPtr(readOnly),
		DestructiveHint: mcp.ToBoolPtr(destructive),
		IdempotentHint:  mcp.ToBoolPtr(idempotent),
		OpenWorldHint:   mcp.ToBoolPtr(false),
	})
}

var (
	echoTool = mcp.NewTool("echo",
		mcp.WithDescription("Returns the text it is given. When the call carries a patchbay idempotency key in _meta, the structured result reports it as idempotencyKey."),
		mcp.WithString("text", mcp.Required(), mcp.Description("The text to echo back.")),
		hints("Echo", true, false, true),
	)
	addTool = mcp.NewTool("add",
		mcp.WithDescription("Adds two numbers and returns their sum."),
		mcp.WithNumber("a", mcp.Required(), mcp.Description("The first addend.")),
		mcp.WithNumber("b", mcp.Required(), mcp.Description("The second addend.")),
		hints("Add", true, false, true),
	)
	notePutTool = mcp.NewTool("note_put",
		mcp.WithDescription("Stores a note under a key, replacing any note already there. Notes live in memory until the server exits."),
		mcp.WithString("key", mcp.Required(), mcp.Description("The name of the note.")),
		mcp.WithString("value", mcp.Required(), mcp.Description("The text of the note.")),
		hints("Put note", false, false, true),
	)
	noteGetTool = mcp.NewTool("note_get",
		mcp.WithDescription("Returns the note stored under a key; a key with no note is a tool error."),
		mcp.WithString("key", mcp.Required(), mcp.Description("The name of the note.")),
		hints("Get note", true, false, true),
	)
	failTool = mcp.NewTool("fail",
		mcp.WithDescription("Always fails with a tool error (isError), for testing error handling."),
		mcp.WithString("message", mcp.Description(`The error message; default "this tool always fails".`)),
		hints("Fail", true, false, true),
	)
)

// bind decodes a call's arguments into v, answering a tool error when they
// do not fit, so a bad call is reported to the caller rather than as a
// protocol failure.
func bind(req mcp.CallToolRequest, v any) *mcp.CallToolResult {
	if err := req.BindArguments(v); err != nil {
		return mcp.NewToolResultError("invalid arguments: " + err.Error())
	}
	return nil
}

func missing(name string) *mcp.CallToolResult {
	return mcp.NewToolResultError(fmt.Sprintf("missing required argument %q", name))
}

// structured answers with structuredContent and, for clients that only read
// content, the same value as a JSON text block.
func structured(v map[string]any) *mcp.CallToolResult {
	b, err := json.Marshal(v)
	if err != nil {
		return mcp.NewToolResultError("encode result: " + err.Error())
	}
	return mcp.NewToolResultStructured(v, string(b))
}

func echo(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args struct {
		Text *string `json:"text"`
	}
	if res := bind(req, &args); res != nil {
		return res, nil
	}
	if args.Text == nil {
		return missing("text"), nil
	}
	out := map[string]any{"text": *args.Text}
	if key, ok := req.Params.Meta.GetMetaField(idempotencyKeyMeta).(string); ok && key != "" {
		out["idempotencyKey"] = key
	}
	return mcp.NewToolResultStructured(out, *args.Text), nil
}

func add(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args struct {
		A *float64 `json:"a"`
		B *float64 `json:"b"`
	}
	if res := bind(req, &args); res != nil {
		return res, nil
	}
	switch {
	case args.A == nil:
		return missing("a"), nil
	case args.B == nil:
		return missing("b"), nil
	}
	return structured(map[string]any{"sum": *args.A + *args.B}), nil
}

// notes is the in-memory note store of one server. Tool calls run
// concurrently, hence the mutex.
type notes struct {
	mu sync.Mutex
	m  map[string]string
}

func (n *notes) put(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args struct {
		Key   *string `json:"key"`
		Value *string `json:"value"`
	}
	if res := bind(req, &args); res != nil {
		return res, nil
	}
	switch {
	case args.Key == nil:
		return missing("key"), nil
	case args.Value == nil:
		return missing("value"), nil
	}
	n.mu.Lock()
	n.m[*args.Key] = *args.Value
	n.mu.Unlock()
	return structured(map[string]any{"key": *args.Key, "stored": true}), nil
}

func (n *notes) get(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args struct {
		Key *string `json:"key"`
	}
	if res := bind(req, &args); res != nil {
		return res, nil
	}
	if args.Key == nil {
		return missing("key"), nil
	}
	n.mu.Lock()
	value, ok := n.m[*args.Key]
	n.mu.Unlock()
	if !ok {
		return mcp.NewToolResultError("no note named " + *args.Key), nil
	}
	return structured(map[string]any{"key": *args.Key, "value": value}), nil
}

func fail(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args struct {
		Message string `json:"message"`
	}
	if res := bind(req, &args); res != nil {
		return res, nil
	}
	if args.Message == "" {
		args.Message = "this tool always fails"
	}
	return mcp.NewToolResultError(args.Message), nil
}
