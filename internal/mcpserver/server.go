// Package mcpserver is patchbay's MCP face: /mcp serves the connections'
// operations to any MCP client, as tools, through the same gates a
// workflow's calls pass, as the caller.
//
// mcp-go's server does the protocol: both eras on one endpoint
// (2026-07-28 per request: server/discover, Mcp-Method/Mcp-Name, resultType;
// 2025-11-25 and 2025-06-18 with initialize and Mcp-Session-Id), JSON-RPC,
// pagination, progress notifications. This package adds what it lacks:
//
//   - Who calls: the api package authenticates the request (an API key or
//     an OAuth access token) and hands the caller to ServeMCP; the caller
//     and the tools its allowlist grants ride in the request's context.
//   - Per-caller tools: mcp-go keeps one tool table per server, so every
//     name any caller is offered is registered once, with one handler, and
//     a tool filter answers tools/list with the caller's own tools (their
//     schemas included) and refuses at tools/call a name the caller is not
//     offered. Sessions' own tool tables cannot serve: a 2026-era request
//     has no session.
//   - Calls: each tools/call runs as an execution the caller owns (see
//     harness.CallTool for why one per call); the client is held while it
//     runs or waits for an approval, with progress notifications, up to a
//     bound, then answered with a tool error naming the approval.
//   - Session ownership and caps: a session id is bound to the caller that
//     opened it (another caller gets 404), and sessions and calls in flight
//     are capped per caller (429 with Retry-After).
package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// Engine is what the face needs of the harness.
type Engine interface {
	Tools(ctx context.Context, c harness.ToolCaller) (*harness.ToolOffer, error)
	CallTool(ctx context.Context, tc harness.ToolCall) (*harness.Execution, error)
	Wait(ctx context.Context, id string, d time.Duration) (*harness.Execution, error)
	// Get, List and Cancel serve the Tasks feature: a task is a tool
	// call's execution (tasks.go).
	Get(ctx context.Context, id string) (*harness.Execution, error)
	List(ctx context.Context, opts harness.ListOptions) (harness.Page, error)
	Cancel(ctx context.Context, id string) (*harness.Execution, error)
	// RenewHeld and ReleaseHeld keep and end the pool leases a session
	// holds across its calls.
	RenewHeld(ctx context.Context, scope string)
	ReleaseHeld(ctx context.Context, scope string)
	// BridgeTools and BridgeCall serve an acp-agent node's agent (a
	// caller with Bridge set): the node's tools, its calls as steps of
	// the node's execution.
	BridgeTools(id string) (*harness.ToolOffer, error)
	BridgeCall(ctx context.Context, id, tool string, args map[string]any) (agent.ModelToolResult, error)
	// Questions is the queue of the questions servers ask: one a call's
	// server asks is forwarded to a client that takes elicitations.
	Questions() *gates.Questions
}

// Options configure the face; zero values are the defaults.
type Options struct {
	Engine Engine
	// Hold is how long a tools/call is held while its call runs or
	// waits for approval before it is answered with a tool error naming
	// the approval. Default 30s.
	Hold time.Duration
	// SessionsPerPrincipal and CallsPerPrincipal cap one caller's open
	// sessions and tools/call requests in flight (in this process).
	// Default 64 and 16.
	SessionsPerPrincipal int
	CallsPerPrincipal    int
	// SessionIdle ends a 2025-era session unused this long. Default 30m.
	SessionIdle time.Duration
	// ListCheck is how often Watch looks for changed tool lists.
	// Default 5s.
	ListCheck time.Duration
	// PageSize is how many tools one tools/list page holds. Default 100.
	PageSize int
	// PublicURL is where browsers reach patchbay (PATCHBAY_PUBLIC_URL):
	// a caller that must sign in to a per-user connection is sent there.
	PublicURL string
	// Version is patchbay's, as serverInfo says.
	Version string
	Logger  *slog.Logger
}

// Server serves /mcp.
type Server struct {
	o    Options
	mcp  *server.MCPServer
	http *server.StreamableHTTPServer

	mu         sync.Mutex
	registered map[string]bool
	sessions   *sessions
	calls      map[string]int // principal → tools/call in flight
}

// Meta keys patchbay reads and writes in _meta.
const (
	// MetaCallID names a call across retries (see harness.ToolCall).
	MetaCallID = "io.patchbay/call-id"
	// MetaExecution is the execution a call ran as, in its result.
	MetaExecution = "io.patchbay/execution"
	// MetaApproval is the approval a held call waits for.
	MetaApproval = "io.patchbay/approval"
)

// New builds the face.
func New(o Options) *Server {
	if o.Hold == 0 {
		o.Hold = 30 * time.Second
	}
	if o.SessionsPerPrincipal <= 0 {
		o.SessionsPerPrincipal = 64
	}
	if o.CallsPerPrincipal <= 0 {
		o.CallsPerPrincipal = 16
	}
	if o.SessionIdle <= 0 {
		o.SessionIdle = 30 * time.Minute
	}
	if o.ListCheck <= 0 {
		o.ListCheck = 5 * time.Second
	}
	if o.PageSize <= 0 {
		o.PageSize = 100
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{o: o, registered: map[string]bool{}, sessions: newSessions(o.SessionIdle), calls: map[string]int{}}
	hooks := &server.Hooks{}
	advertiseTasks(hooks)
	hooks.AddOnUnregisterSession(func(ctx context.Context, session server.ClientSession) {
		if p, ok := s.sessions.end(session.SessionID()); ok {
			s.o.Engine.ReleaseHeld(context.WithoutCancel(ctx), sessionScope(p, session.SessionID()))
		}
	})
	hooks.AddAfterInitialize(func(ctx context.Context, _ any, req *mcp.InitializeRequest, res *mcp.InitializeResult) {
		cs, c := server.ClientSessionFromContext(ctx), callerFrom(ctx)
		if cs != nil && c != nil {
			s.sessions.hello(cs.SessionID(), c.Principal, req.Params.ClientInfo.Name, req.Params.ClientInfo.Version, res.ProtocolVersion)
		}
	})
	s.mcp = server.NewMCPServer("patchbay", o.Version,
		server.WithToolCapabilities(true),
		server.WithToolFilter(s.filter),
		server.WithPaginationLimit(o.PageSize),
		server.WithHooks(hooks),
		server.WithRecovery(),
		server.WithLogger(o.Logger),
		server.WithInstructions("patchbay's connections as tools: every call passes patchbay's gates (policy, approval, secrets) as you, and is recorded as an execution you own (GET /v1/executions)."),
	)
	s.http = server.NewStreamableHTTPServer(s.mcp,
		server.WithEndpointPath("/mcp"),
		server.WithSessionIdleTTL(o.SessionIdle),
		server.WithStreamableHTTPLogger(o.Logger),
		// The api package serves /mcp behind authentication on the
		// configured address; DNS-rebinding protection for a loopback
		// listener is the bearer credential a browser page cannot send.
		server.WithDisableLocalhostProtection(true),
	)
	return s
}

// Sessions lists the live MCP clients of this process, most recent call
// first.
func (s *Server) Sessions() []Session { return s.sessions.list() }

// callerKey carries the request's caller in its context.
type callerKey struct{}

// caller is who sends the request and what it is offered.
type caller struct {
	authz.Principal
	// offer is what the caller was offered in this request: the call
	// is checked against it, not against the grants read again.
	offer  *harness.ToolOffer
	tools  []mcp.Tool
	byName map[string]bool
	// calling: the request is a tools/call, whose filter check passes
	// the one tool called.
	calling bool
}

func callerFrom(ctx context.Context) *caller {
	c, _ := ctx.Value(callerKey{}).(*caller)
	return c
}

// ServeMCP serves one /mcp request of an authenticated caller.
func (s *Server) ServeMCP(w http.ResponseWriter, r *http.Request, p authz.Principal) {
	sid := r.Header.Get(server.HeaderKeySessionID)
	if sid == "" && r.Method != http.MethodPost {
		// A GET stream or a DELETE belongs to a 2025-era session; the
		// 2026 era has neither (its spec answers them 405 too).
		w.Header().Set("Allow", http.MethodPost)
		writeProblem(w, http.StatusMethodNotAllowed, codeMethodNotAllowed, "GET and DELETE need the Mcp-Session-Id of a session this caller opened")
		return
	}
	if sid != "" && !s.sessions.ownedBy(sid, p.Name) {
		// Another caller's session (or one this process never opened):
		// as unknown, so that its existence is not disclosed.
		writeProblem(w, http.StatusNotFound, codeSessionNotFound, "no such MCP session: initialize a new one")
		return
	}
	method := requestMethod(r)
	if s.serveTasks(w, r, p, method) {
		return // the Tasks feature, answered in front of mcp-go (tasks.go)
	}
	switch {
	case method == string(mcp.MethodInitialize) && s.sessions.count(p.Name) >= s.o.SessionsPerPrincipal:
		writeProblem(w, http.StatusTooManyRequests, codeTooManySessions, "too many open MCP sessions for this caller; close one (DELETE /mcp) or wait for one to idle out")
		return
	case method == string(mcp.MethodToolsCall):
		if !s.enter(p.Name) {
			writeProblem(w, http.StatusTooManyRequests, codeTooManyCalls, "too many tools/call requests in flight for this caller")
			return
		}
		defer s.leave(p.Name)
	}
	c := &caller{Principal: p, calling: method == string(mcp.MethodToolsCall)}
	if method == string(mcp.MethodToolsList) || method == string(mcp.MethodToolsCall) {
		var ok bool
		if c.offer, ok = s.offer(w, r, p); !ok {
			return
		}
		c.tools, c.byName = s.register(c.offer.List())
	}
	ctx := context.WithValue(r.Context(), callerKey{}, c)
	if method == string(mcp.MethodInitialize) {
		w = &sessionCapture{ResponseWriter: w, opened: func(id string) { s.sessions.open(id, p.Name) }}
	}
	s.http.ServeHTTP(w, r.WithContext(ctx))
}

// offer reads what the caller is offered; when it cannot, the request is
// answered 503 and ok is false.
func (s *Server) offer(w http.ResponseWriter, r *http.Request, p authz.Principal) (offer *harness.ToolOffer, ok bool) {
	var err error
	if p.Bridge != "" {
		offer, err = s.o.Engine.BridgeTools(p.Bridge)
	} else {
		offer, err = s.o.Engine.Tools(r.Context(), harness.ToolCaller{Principal: p.Name, Allowlist: p.Allowlist})
	}
	if errors.Is(err, harness.ErrBridgeClosed) {
		writeProblem(w, http.StatusUnauthorized, codeBridgeClosed, "the node run this credential was minted for has ended")
		return nil, false
	}
	if err != nil {
		s.o.Logger.Error("mcp: list tools", "principal", p.Name, "err", err)
		writeProblem(w, http.StatusServiceUnavailable, codeToolsUnavailable, "the caller's tools could not be read; retry")
		return nil, false
	}
	return offer, true
}

// requestMethod peeks at a POST's JSON-RPC method, leaving the body for
// the transport to read (the api package bounds its size).
func requestMethod(r *http.Request) string {
	if r.Method != http.MethodPost || r.Body == nil {
		return ""
	}
	body, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return ""
	}
	var msg struct {
		Method string `json:"method"`
	}
	_ = json.Unmarshal(body, &msg) // a batch or bad JSON: the transport answers
	return msg.Method
}

func (s *Server) enter(principal string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls[principal] >= s.o.CallsPerPrincipal {
		return false
	}
	s.calls[principal]++
	return true
}

func (s *Server) leave(principal string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls[principal]--; s.calls[principal] <= 0 {
		delete(s.calls, principal)
	}
}

// register makes sure every tool the caller is offered has a name in
// mcp-go's table (one handler serves them all), and returns the caller's
// tools as MCP tools.
func (s *Server) register(tools []agent.ModelTool) ([]mcp.Tool, map[string]bool) {
	out := make([]mcp.Tool, 0, len(tools))
	names := make(map[string]bool, len(tools))
	var fresh []server.ServerTool
	s.mu.Lock()
	for _, t := range tools {
		mt := toMCPTool(t)
		out = append(out, mt)
		names[t.Name] = true
		if !s.registered[t.Name] {
			s.registered[t.Name] = true
			fresh = append(fresh, server.ServerTool{Tool: mt, Handler: s.call})
		}
	}
	s.mu.Unlock()
	// mcp-go pages a list by name (its cursor is the last name given),
	// so the list must be in name order.
	slices.SortFunc(out, func(a, b mcp.Tool) int { return strings.Compare(a.Name, b.Name) })
	if len(fresh) > 0 {
		// Tells open sessions their lists may have changed: a name new
		// to this process is usually a connection or a grant just added.
		s.mcp.AddTools(fresh...)
	}
	return out, names
}

func toMCPTool(t agent.ModelTool) mcp.Tool {
	mt := mcp.NewToolWithRawSchema(t.Name, t.Description, t.InputSchema)
	a := t.Annotations
	mt.Annotations = mcp.ToolAnnotation{Title: a.Title, ReadOnlyHint: a.ReadOnlyHint, DestructiveHint: a.DestructiveHint,
		IdempotentHint: a.IdempotentHint, OpenWorldHint: a.OpenWorldHint}
	// A 2025-era client may call any tool as a task, or be held as before
	// (tasks.go); the 2026 era ignores the field (its tasks are the
	// server's to decide).
	mt.Execution = &mcp.ToolExecution{TaskSupport: mcp.TaskSupportOptional}
	return mt
}

// filter answers tools/list with the caller's tools and, at tools/call,
// keeps the requested tool only when the caller is offered it.
func (s *Server) filter(ctx context.Context, tools []mcp.Tool) []mcp.Tool {
	c := callerFrom(ctx)
	if c == nil {
		return nil
	}
	if !c.calling {
		return c.tools
	}
	var kept []mcp.Tool
	for _, t := range tools {
		if c.byName[t.Name] {
			kept = append(kept, t)
		}
	}
	return kept
}
