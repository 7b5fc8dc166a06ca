package demo

import (
	"context"
	"fmt"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// ChatVersion is the version of profile chat the demo server declares.
const ChatVersion = "1.0.0"

// BrokenChannel is a channel chat.post answers without a thread, against
// chat@1, so tests can see a server contradict its profile.
const BrokenChannel = "#broken"

// GuardedChannel is a channel chat.post refuses as guarded (a tool error
// with structuredContent {"code": "guarded"}) unless the call carries an
// approval under _meta["io.patchbay/approval"].
const GuardedChannel = "#guarded"

// NewChatServer is NewServer that also speaks chat@1: it declares the
// profile under the io.patchbay/profiles capability and serves chat.post
// and chat.reply over an in-memory channel list, and the read
// chat.thread.recent as a tool of that name.
func NewChatServer(opts ...server.ServerOption) *server.MCPServer {
	opts = append(opts, server.WithExperimental(map[string]any{
		profiles.DeclarationKey: map[string]any{"chat": ChatVersion},
	}))
	s := NewServer(opts...)
	c := &chat{}
	s.AddTools(
		server.ServerTool{Tool: chatPostTool, Handler: c.post},
		server.ServerTool{Tool: chatReplyTool, Handler: c.reply},
		server.ServerTool{Tool: chatRecentTool, Handler: c.recent},
	)
	return s
}

var (
	chatPostTool = mcp.NewTool("chat.post",
		mcp.WithDescription("Starts a thread in a channel with a first message (chat@1)."),
		mcp.WithString("channel", mcp.Required(), mcp.Description("The channel, e.g. #general.")),
		mcp.WithString("text", mcp.Required(), mcp.Description("The message.")),
		hints("Post", false, false, false),
	)
	chatReplyTool = mcp.NewTool("chat.reply",
		mcp.WithDescription("Replies in a thread (chat@1)."),
		mcp.WithString("thread", mcp.Required(), mcp.Description("The thread, as chat.post returned it.")),
		mcp.WithString("text", mcp.Required(), mcp.Description("The message.")),
		hints("Reply", false, false, false),
	)
	// chatRecentTool is chat@1's read chat.thread.recent, served as a
	// tool of the read's name: patchbay's convention for declaring
	// servers.
	chatRecentTool = mcp.NewTool("chat.thread.recent",
		mcp.WithDescription("The last few messages posted (chat@1 read)."),
		hints("Recent messages", true, false, true),
	)
)

// recentMessages is how many messages chat.thread.recent answers with.
const recentMessages = 5

// chat numbers messages; a thread is named by its first message.
type chat struct {
	mu   sync.Mutex
	next int
	log  []map[string]any // the messages posted, oldest first
}

// add numbers a message and logs it; a first message (no thread) starts
// the thread "<channel>/<id>".
func (c *chat) add(channel, thread, text string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	id := fmt.Sprintf("m%d", c.next)
	if thread == "" {
		thread = channel + "/" + id
	}
	c.log = append(c.log, map[string]any{"message": id, "thread": thread, "author": "patchbay", "text": text})
	return id
}

func (c *chat) recent(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	msgs := []any{}
	for _, m := range c.log[max(0, len(c.log)-recentMessages):] {
		msgs = append(msgs, m)
	}
	return structured(map[string]any{"messages": msgs}), nil
}

func (c *chat) post(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args struct {
		Channel string `json:"channel"`
		Text    string `json:"text"`
	}
	if res := bind(req, &args); res != nil {
		return res, nil
	}
	if args.Channel == GuardedChannel && !approved(req) {
		res := mcp.NewToolResultStructured(map[string]any{"code": "guarded"}, GuardedChannel+" needs an approval")
		res.IsError = true
		return res, nil
	}
	id := c.add(args.Channel, "", args.Text)
	if args.Channel == BrokenChannel {
		return structured(map[string]any{"message": id}), nil
	}
	return structured(map[string]any{"message": id, "thread": args.Channel + "/" + id}), nil
}

func (c *chat) reply(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var args struct {
		Thread string `json:"thread"`
		Text   string `json:"text"`
	}
	if res := bind(req, &args); res != nil {
		return res, nil
	}
	return structured(map[string]any{"message": c.add("", args.Thread, args.Text), "thread": args.Thread}), nil
}

// approved reports whether a call carries an approval's id.
func approved(req mcp.CallToolRequest) bool {
	if req.Params.Meta == nil {
		return false
	}
	id, _ := req.Params.Meta.AdditionalFields["io.patchbay/approval"].(string)
	return id != ""
}
