package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
)

type (
	fsCapabilities struct {
		ReadTextFile  bool `json:"readTextFile"`
		WriteTextFile bool `json:"writeTextFile"`
	}
	clientCapabilities struct {
		FS       fsCapabilities `json:"fs"`
		Terminal bool           `json:"terminal"`
	}
	initializeParams struct {
		ProtocolVersion    int                `json:"protocolVersion"`
		ClientCapabilities clientCapabilities `json:"clientCapabilities"`
		ClientInfo         *Implementation    `json:"clientInfo,omitempty"`
	}
)

// Initialize negotiates the protocol version and capabilities. It declares
// only the client capabilities Options turned on.
func (c *Conn) Initialize(ctx context.Context) (*InitializeResult, error) {
	params := initializeParams{
		ProtocolVersion: ProtocolVersion,
		ClientCapabilities: clientCapabilities{
			FS:       fsCapabilities{ReadTextFile: c.fs != nil, WriteTextFile: c.fs != nil && c.fs.write},
			Terminal: c.terms != nil,
		},
		ClientInfo: c.opts.ClientInfo,
	}
	var raw json.RawMessage
	if err := c.call(ctx, "initialize", params, &raw, false); err != nil {
		return nil, err
	}
	res, err := decodeInitialize(raw)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.init = res
	c.mu.Unlock()
	return res, nil
}

// decodeInitialize reads the agent's answer leniently, as the schema asks:
// a capability of the wrong type is taken as not declared, but the
// protocol version must be ours.
func decodeInitialize(raw json.RawMessage) (*InitializeResult, error) {
	var version struct {
		ProtocolVersion *int `json:"protocolVersion"`
	}
	if err := json.Unmarshal(raw, &version); err != nil || version.ProtocolVersion == nil {
		return nil, fmt.Errorf("acp: initialize: no protocol version in the answer %s", clip(raw, 200))
	}
	if *version.ProtocolVersion != ProtocolVersion {
		return nil, fmt.Errorf("acp: initialize: %w: the agent speaks %d, patchbay %d", ErrProtocolVersion, *version.ProtocolVersion, ProtocolVersion)
	}
	res := &InitializeResult{ProtocolVersion: ProtocolVersion}
	var fields struct {
		AgentCapabilities json.RawMessage `json:"agentCapabilities"`
		AuthMethods       json.RawMessage `json:"authMethods"`
		AgentInfo         json.RawMessage `json:"agentInfo"`
	}
	_ = json.Unmarshal(raw, &fields)
	lenient(fields.AgentCapabilities, &res.AgentCapabilities)
	lenient(fields.AuthMethods, &res.AuthMethods)
	lenient(fields.AgentInfo, &res.AgentInfo)
	return res, nil
}

// lenient decodes what it can of raw into v: encoding/json fills the
// fields that match before it reports a type mismatch.
func lenient(raw json.RawMessage, v any) {
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, v)
	}
}

// Authenticate authenticates with one of the methods the agent offered in
// InitializeResult.AuthMethods.
func (c *Conn) Authenticate(ctx context.Context, methodID string) error {
	return c.call(ctx, "authenticate", struct {
		MethodID string `json:"methodId"`
	}{methodID}, nil, false)
}

type sessionParams struct {
	SessionID  string      `json:"sessionId,omitempty"`
	CWD        string      `json:"cwd"`
	MCPServers []MCPServer `json:"mcpServers"`
}

// NewSession creates a session working in cwd (absolute) with the given
// MCP servers, and returns its id.
func (c *Conn) NewSession(ctx context.Context, cwd string, servers []MCPServer) (string, error) {
	if err := c.checkSession(cwd, servers); err != nil {
		return "", fmt.Errorf("acp: session/new: %w", err)
	}
	var res struct {
		SessionID string `json:"sessionId"`
	}
	if err := c.call(ctx, "session/new", sessionParams{CWD: cwd, MCPServers: nonNil(servers)}, &res, false); err != nil {
		return "", err
	}
	if res.SessionID == "" {
		return "", errors.New("acp: session/new: the agent answered no sessionId")
	}
	c.addSession(res.SessionID)
	return res.SessionID, nil
}

// LoadSession resumes session id: the agent replays its history as
// session updates, all delivered before LoadSession returns. Its error
// matches ErrLoadUnsupported when the agent did not declare loadSession.
func (c *Conn) LoadSession(ctx context.Context, id, cwd string, servers []MCPServer) error {
	if err := c.checkSession(cwd, servers); err != nil {
		return fmt.Errorf("acp: session/load: %w", err)
	}
	c.mu.Lock()
	load := c.init.AgentCapabilities.LoadSession
	c.mu.Unlock()
	if !load {
		return fmt.Errorf("acp: session/load: %w", ErrLoadUnsupported)
	}
	// Known before the agent answers: it may call back while replaying.
	c.addSession(id)
	return c.call(ctx, "session/load", sessionParams{SessionID: id, CWD: cwd, MCPServers: nonNil(servers)}, nil, true)
}

// checkSession checks what session/new and session/load require: an
// initialized connection, an absolute cwd, and MCP transports the agent
// declared.
func (c *Conn) checkSession(cwd string, servers []MCPServer) error {
	c.mu.Lock()
	init := c.init
	c.mu.Unlock()
	if init == nil {
		return ErrNotInitialized
	}
	if !filepath.IsAbs(cwd) {
		return fmt.Errorf("cwd %q is not absolute", cwd)
	}
	caps := init.AgentCapabilities.MCPCapabilities
	for _, s := range servers {
		if (s.Type == MCPHTTP && !caps.HTTP) || (s.Type == MCPSSE && !caps.SSE) {
			return fmt.Errorf("%w: %s server %q", ErrMCPUnsupported, s.Type, s.Name)
		}
	}
	return nil
}

func (c *Conn) addSession(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sessions[id] = true
}

type promptParams struct {
	SessionID string         `json:"sessionId"`
	Prompt    []ContentBlock `json:"prompt"`
}

// Prompt sends text as the user's next message in the session and waits
// for the turn to end; the session's updates are all delivered before it
// returns. When ctx is cancelled first, Prompt cancels the turn
// (session/cancel, see Cancel) and waits up to CancelWait for the agent's
// answer, which it returns, normally StopCancelled with no error.
func (c *Conn) Prompt(ctx context.Context, sessionID, text string) (StopReason, error) {
	const method = "session/prompt"
	params := promptParams{SessionID: sessionID, Prompt: []ContentBlock{{Type: "text", Text: text}}}
	id, ch, err := c.request(method, params)
	if err != nil {
		return "", fmt.Errorf("acp: %s: %w", method, err)
	}
	r, err := c.wait(ctx, ch)
	if err != nil && ctx.Err() != nil && c.ended() == nil {
		r, err = c.cancelTurn(sessionID, ch)
	}
	c.forget(id)
	if err == nil {
		err = c.awaitAfter(ctx, r.seq)
	}
	if err != nil {
		return "", fmt.Errorf("acp: %s: %w", method, err)
	}
	var res struct {
		StopReason StopReason `json:"stopReason"`
	}
	if err := decodeResult(method, r, &res); err != nil {
		return "", err
	}
	return res.StopReason, nil
}

// cancelTurn cancels the session's turn and waits, bounded, for the
// agent's answer to the prompt on ch.
func (c *Conn) cancelTurn(sessionID string, ch chan response) (response, error) {
	if err := c.Cancel(sessionID); err != nil {
		return response{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.CancelWait)
	defer cancel()
	r, err := c.wait(ctx, ch)
	if err != nil && ctx.Err() != nil {
		return response{}, fmt.Errorf("the agent did not answer session/cancel within %s: %w", c.opts.CancelWait, context.Canceled)
	}
	return r, err
}

// awaitAfter waits for the updates before a prompt's answer to be
// delivered: within ctx, or CancelWait once ctx is done.
func (c *Conn) awaitAfter(ctx context.Context, seq uint64) error {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), c.opts.CancelWait)
		defer cancel()
	}
	return c.await(ctx, seq)
}

// Cancel cancels the session's current turn: it sends session/cancel and
// answers the agent's pending permission requests of the session
// "cancelled", as ACP requires. The turn's Prompt then returns the agent's
// answer, normally StopCancelled.
func (c *Conn) Cancel(sessionID string) error {
	err := c.notify("session/cancel", struct {
		SessionID string `json:"sessionId"`
	}{sessionID})
	// Answered even when the notification could not be sent: the Client's
	// handlers learn that the turn is over.
	c.cancelPermissions(sessionID)
	if err != nil {
		return fmt.Errorf("acp: session/cancel: %w", err)
	}
	return nil
}
