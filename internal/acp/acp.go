// Package acp owns patchbay's client side of the Agent Client Protocol
// (ACP, protocol version 1): it starts a coding agent (such as codex-acp)
// as a child process, speaks JSON-RPC 2.0 with it over the child's stdin
// and stdout (one JSON message per line), and answers what the agent asks
// of its client: permission for tool calls, session updates, and, when
// Options turn them on, reads and writes of text files under a root
// directory and terminals that run commands there.
//
// The client is written here rather than taken from a library: the Go ACP
// SDK (github.com/coder/acp-go-sdk) is pre-1.0, and patchbay needs control
// over what an SDK decides for it: how the child's process tree is started
// and ended (internal/proctree, as for stdio MCP servers), bounds on every
// line read, and unknown session updates kept raw rather than rejected.
// The wire format follows the ACP v1 JSON schema; testdata/*.golden records
// a whole exchange with the TypeScript SDK's example agent.
//
// # Ordering
//
// Session updates are delivered to Client.SessionUpdate one at a time, in
// the order the agent sent them. A request of the agent (a permission
// request) is handled on a goroutine of its own, once the updates sent
// before it have been delivered; Prompt and LoadSession return once the
// updates sent before their answer have been delivered. So SessionUpdate
// must not call Prompt or LoadSession: they would wait for it.
package acp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// ProtocolVersion is the ACP version this package speaks.
const ProtocolVersion = 1

// Command is how to start an agent: Path with Args, with exactly Env (no
// inherited environment), in Dir. The agent's stderr goes to Stderr
// (discarded when nil).
type Command struct {
	Path   string
	Args   []string
	Env    []string
	Dir    string
	Stderr io.Writer
}

// Options tune a connection. The zero value declares no optional client
// capability: the agent may then only send session updates and ask for
// permission.
type Options struct {
	// ClientInfo names patchbay to the agent in initialize; omitted when
	// nil.
	ClientInfo *Implementation
	// FS, when set, declares fs.readTextFile (and fs.writeTextFile when
	// FS.Write) and serves them confined to FS.Root.
	FS *FSOptions
	// Terminal, when set, declares terminal and runs the agent's commands
	// with their working directory confined to Terminal.Root.
	Terminal *TerminalOptions
	// Wire, when set, is called with every line sent to the agent (out)
	// and received from it, without its newline, before it is handled. It
	// must not keep line. For transcripts and tests.
	Wire func(out bool, line []byte)
	// Logger receives what the connection drops or cannot answer (lines
	// that are not JSON-RPC, responses to no request); discarded when nil.
	Logger *slog.Logger
	// MaxLineBytes bounds one message from the agent; a longer line breaks
	// the connection with ErrLineTooLong. Default 8 MiB.
	MaxLineBytes int
	// CloseGrace is how long Close lets the agent exit after its stdin is
	// closed, and again after SIGTERM, before it kills the agent's tree.
	// Default 1s.
	CloseGrace time.Duration
	// CancelWait bounds how long Prompt waits for the agent's answer once
	// its context is cancelled and session/cancel sent. Default 10s.
	CancelWait time.Duration
}

const (
	defaultMaxLine    = 8 << 20
	defaultCloseGrace = time.Second
	defaultCancelWait = 10 * time.Second
)

func (o Options) withDefaults() Options {
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = defaultMaxLine
	}
	if o.CloseGrace <= 0 {
		o.CloseGrace = defaultCloseGrace
	}
	if o.CancelWait <= 0 {
		o.CancelWait = defaultCancelWait
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Errors of a connection, matched with errors.Is. Methods return them
// wrapped with what failed ("acp: session/prompt: agent exited: exit
// status 1"); Err returns them wrapped with "acp: ".
var (
	// ErrClosed: Close was called.
	ErrClosed = errors.New("connection closed")
	// ErrAgentExited: the agent process exited (the wrapping error says
	// how).
	ErrAgentExited = errors.New("agent exited")
	// ErrLineTooLong: the agent sent a line longer than MaxLineBytes.
	ErrLineTooLong = errors.New("line too long")
	// ErrLoadUnsupported: the agent did not declare loadSession.
	ErrLoadUnsupported = errors.New("the agent does not support session/load")
	// ErrNotInitialized: a session was asked for before Initialize.
	ErrNotInitialized = errors.New("not initialized")
	// ErrMCPUnsupported: an MCP server's transport is one the agent did
	// not declare (mcpCapabilities).
	ErrMCPUnsupported = errors.New("the agent does not support this MCP transport")
	// ErrProtocolVersion: the agent answered initialize with a protocol
	// version other than ProtocolVersion.
	ErrProtocolVersion = errors.New("unsupported protocol version")
)

// JSON-RPC error codes used by ACP.
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternalError  = -32603
	CodeCancelled      = -32800
	CodeAuthRequired   = -32000
	CodeNotFound       = -32002
)

// RPCError is a JSON-RPC error: one the agent answered a request with
// (match it with errors.As), or one a Client method returns to choose the
// code the agent gets (otherwise an internal error).
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *RPCError) Error() string {
	if len(e.Data) > 0 && len(e.Data) <= 200 {
		return fmt.Sprintf("%s (code %d, data %s)", e.Message, e.Code, e.Data)
	}
	return fmt.Sprintf("%s (code %d)", e.Message, e.Code)
}

// Implementation names a client or an agent.
type Implementation struct {
	Name    string `json:"name"`
	Title   string `json:"title,omitempty"`
	Version string `json:"version"`
}

// StopReason is why the agent ended a prompt turn.
type StopReason string

// The stop reasons of ACP v1.
const (
	StopEndTurn         StopReason = "end_turn"
	StopMaxTokens       StopReason = "max_tokens"
	StopMaxTurnRequests StopReason = "max_turn_requests"
	StopRefusal         StopReason = "refusal"
	StopCancelled       StopReason = "cancelled"
)

// InitializeResult is the agent's answer to initialize.
type InitializeResult struct {
	ProtocolVersion   int               `json:"protocolVersion"`
	AgentCapabilities AgentCapabilities `json:"agentCapabilities"`
	AuthMethods       []AuthMethod      `json:"authMethods"`
	AgentInfo         *Implementation   `json:"agentInfo,omitempty"`
}

// AgentCapabilities is what the agent declared it supports.
type AgentCapabilities struct {
	LoadSession        bool               `json:"loadSession"`
	PromptCapabilities PromptCapabilities `json:"promptCapabilities"`
	MCPCapabilities    MCPCapabilities    `json:"mcpCapabilities"`
}

// PromptCapabilities says which content besides text a prompt may carry.
type PromptCapabilities struct {
	Image           bool `json:"image"`
	Audio           bool `json:"audio"`
	EmbeddedContext bool `json:"embeddedContext"`
}

// MCPCapabilities says which MCP transports besides stdio the agent
// connects to.
type MCPCapabilities struct {
	HTTP bool `json:"http"`
	SSE  bool `json:"sse"`
}

// AuthMethod is a way to authenticate the agent offers (see Authenticate).
type AuthMethod struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
}

// Header is an HTTP header of an MCP server.
type Header struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// EnvVar is an environment variable of a stdio MCP server or a terminal.
type EnvVar struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// MCP server transports.
const (
	MCPStdio = ""
	MCPHTTP  = "http"
	MCPSSE   = "sse"
)

// MCPServer is an MCP server the agent is to connect to for a session:
// Type MCPHTTP or MCPSSE with URL and Headers, or MCPStdio with Command,
// Args and Env.
type MCPServer struct {
	Type    string
	Name    string
	URL     string
	Headers []Header
	Command string
	Args    []string
	Env     []EnvVar
}

// MarshalJSON writes the schema's shape for the server's transport, with
// the arrays it requires present even when empty.
func (s MCPServer) MarshalJSON() ([]byte, error) {
	switch s.Type {
	case MCPHTTP, MCPSSE:
		return json.Marshal(struct {
			Type    string   `json:"type"`
			Name    string   `json:"name"`
			URL     string   `json:"url"`
			Headers []Header `json:"headers"`
		}{s.Type, s.Name, s.URL, nonNil(s.Headers)})
	case MCPStdio:
		return json.Marshal(struct {
			Name    string   `json:"name"`
			Command string   `json:"command"`
			Args    []string `json:"args"`
			Env     []EnvVar `json:"env"`
		}{s.Name, s.Command, nonNil(s.Args), nonNil(s.Env)})
	}
	return nil, fmt.Errorf("acp: MCP server %q: unknown type %q", s.Name, s.Type)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// UpdateKind is the sessionUpdate discriminator of a session update.
type UpdateKind string

// The update kinds this package decodes; others are passed on raw.
const (
	UpdateUserMessageChunk  UpdateKind = "user_message_chunk"
	UpdateAgentMessageChunk UpdateKind = "agent_message_chunk"
	UpdateAgentThoughtChunk UpdateKind = "agent_thought_chunk"
	UpdateToolCall          UpdateKind = "tool_call"
	UpdateToolCallUpdate    UpdateKind = "tool_call_update"
	UpdatePlan              UpdateKind = "plan"
	UpdateAvailableCommands UpdateKind = "available_commands_update"
	UpdateCurrentMode       UpdateKind = "current_mode_update"
)

// SessionNotification is one session/update from the agent. Update is the
// update object exactly as sent, whatever its kind; the common kinds are
// also decoded into Content, ToolCall or Plan (nil when the kind is
// another, or the update does not decode).
type SessionNotification struct {
	SessionID string
	Kind      UpdateKind
	Update    json.RawMessage

	Content  *ContentBlock // the *_message_chunk and agent_thought_chunk kinds
	ToolCall *ToolCall     // tool_call and tool_call_update
	Plan     []PlanEntry   // plan
}

// ContentBlock is a piece of content. Only text is decoded; other types
// (image, audio, resource) keep their type here and their data in the
// raw update.
type ContentBlock struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
}

// ToolCall is a tool call the agent reports (tool_call), updates
// (tool_call_update: empty fields are unchanged) or asks permission for.
// Content is kept raw: it holds content, diffs and terminals.
type ToolCall struct {
	ToolCallID string             `json:"toolCallId"`
	Title      string             `json:"title,omitempty"`
	Kind       string             `json:"kind,omitempty"`
	Status     string             `json:"status,omitempty"`
	Locations  []ToolCallLocation `json:"locations,omitempty"`
	RawInput   json.RawMessage    `json:"rawInput,omitempty"`
	RawOutput  json.RawMessage    `json:"rawOutput,omitempty"`
	Content    json.RawMessage    `json:"content,omitempty"`
}

// ToolCallLocation is a file a tool call touches.
type ToolCallLocation struct {
	Path string `json:"path"`
	Line *int   `json:"line,omitempty"`
}

// PlanEntry is one step of the agent's plan.
type PlanEntry struct {
	Content  string `json:"content"`
	Priority string `json:"priority"`
	Status   string `json:"status"`
}

// PermissionOptionKind says what choosing a permission option means.
type PermissionOptionKind string

// The permission option kinds of ACP v1.
const (
	AllowOnce    PermissionOptionKind = "allow_once"
	AllowAlways  PermissionOptionKind = "allow_always"
	RejectOnce   PermissionOptionKind = "reject_once"
	RejectAlways PermissionOptionKind = "reject_always"
)

// PermissionOption is one answer the agent offers to a permission request.
type PermissionOption struct {
	OptionID string               `json:"optionId"`
	Name     string               `json:"name"`
	Kind     PermissionOptionKind `json:"kind"`
}

// PermissionRequest is the agent asking whether it may run a tool call.
type PermissionRequest struct {
	SessionID string             `json:"sessionId"`
	ToolCall  ToolCall           `json:"toolCall"`
	Options   []PermissionOption `json:"options"`
}

// PermissionOutcome answers a permission request: the option chosen, or
// cancelled when OptionID is empty (the zero value).
type PermissionOutcome struct {
	OptionID string
}

// Cancelled reports whether o answers "cancelled".
func (o PermissionOutcome) Cancelled() bool { return o.OptionID == "" }

// Pick returns the outcome choosing the first option offered of the first
// of kinds that has one, or cancelled when none is offered. Pick(AllowOnce,
// AllowAlways) allows; Pick(RejectOnce, RejectAlways) denies.
func (r PermissionRequest) Pick(kinds ...PermissionOptionKind) PermissionOutcome {
	for _, k := range kinds {
		for _, o := range r.Options {
			if o.Kind == k {
				return PermissionOutcome{OptionID: o.OptionID}
			}
		}
	}
	return PermissionOutcome{}
}

func (r PermissionRequest) offers(id string) bool {
	for _, o := range r.Options {
		if o.OptionID == id {
			return true
		}
	}
	return false
}
