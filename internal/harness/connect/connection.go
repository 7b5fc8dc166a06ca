// Package connect is the contract between the engine and the providers of
// connections (internal/mcp, internal/openapi, internal/drive,
// internal/githubapp, internal/pools): a Provider connects and gives a Conn,
// which has a Manifest of Operations, an Identity and a Call; a connection
// may also offer server events (EventPoller, EventStreamer,
// EventSubscriber), tasks (TaskWatch) and leases (Leaser). It also names
// tools for models (ToolIDs) and checks path arguments (CheckPathArgs). A
// provider author reads this package and nothing else of the engine; it
// imports nothing of patchbay.
package connect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// State is where a connection is in its life.
type State string

// Connection states, as shown in status.
const (
	StateConnecting  State = "connecting"
	StateReady       State = "ready"
	StateUnavailable State = "unavailable"
	StateNeedsSignIn State = "needs_sign_in"
	StateClosed      State = "closed"
)

// Annotations are the behaviour hints an operation declares. Pointers keep
// "not declared" apart from "declared false", as MCP does.
type Annotations struct {
	Title           string `json:"title,omitempty"`
	ReadOnlyHint    *bool  `json:"readOnlyHint,omitempty"`
	DestructiveHint *bool  `json:"destructiveHint,omitempty"`
	IdempotentHint  *bool  `json:"idempotentHint,omitempty"`
	OpenWorldHint   *bool  `json:"openWorldHint,omitempty"`
}

// Operation is one callable thing a connection offers (an MCP tool).
type Operation struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"inputSchema,omitempty"`
	Annotations Annotations     `json:"annotations"`
	// HTTP is the request an OpenAPI operation sends; nil for the other
	// kinds. It is shown to people (status, the admin UI), not models.
	HTTP *HTTPRoute `json:"http,omitempty"`
}

// HTTPRoute is an HTTP method and path template (/pets/{petId}).
type HTTPRoute struct {
	Method string `json:"method"`
	Path   string `json:"path"`
}

// Manifest is what a connection declares it can do.
type Manifest struct {
	Operations []Operation `json:"operations"`
	// Profiles are the profiles the server declares it speaks, name →
	// version (see package profiles).
	Profiles map[string]string `json:"profiles,omitempty"`
	// Events are the event types the server offers (MCP events/list),
	// which triggers and wait nodes may name; empty for most connections.
	Events []EventType `json:"events,omitempty"`
}

// Operation returns the named operation and whether it exists.
func (m Manifest) Operation(name string) (Operation, bool) {
	for _, op := range m.Operations {
		if op.Name == name {
			return op, true
		}
	}
	return Operation{}, false
}

// Identity says which concrete thing a connection is talking to. Instance
// changes when that thing is replaced (a new server process or session), so
// recorded results can be judged against the identity they were made with.
type Identity struct {
	Surface  string `json:"surface"`
	Instance string `json:"instance"`
	Epoch    int64  `json:"epoch"`
}

// CallRequest is one call to an operation.
type CallRequest struct {
	Op   string
	Args map[string]any
	// IdempotencyKey is sent with the call so a server can drop a repeat.
	IdempotencyKey string
	// Approval is the id of the approval a person gave the call, sent
	// when the call waited for one (a guarded operation or target).
	Approval string
	// Principal is who the execution runs for (an API key's or user's
	// name); empty for trusted host runs.
	Principal string
	// Headers are credentials resolved for this call's principal at gate 6
	// (an OAuth bearer token, say). A provider keeps one session per
	// distinct set, so one tenant never rides on another's session. Nil:
	// the connection's own configured credentials.
	Headers map[string]string
	// Task ties the call to the long-running task a server may answer it
	// with (the MCP Tasks extension). Nil: a task is waited for but
	// neither recorded nor resumed.
	Task *TaskWatch
	// Ask puts a question the server asks while it answers this call (an
	// MCP elicitation) to whoever answers for the call, and returns the
	// answer. Nil: every question is declined.
	Ask Asker
	// Park: a server that asks its questions in its answer (a 2026-07-28
	// input_required result) is not answered through Ask; the call fails
	// with *InputRequired instead, for the harness to park the run and
	// send the call again with Resume once the questions are answered.
	Park bool
	// Resume sends the call again with the answers to the questions an
	// earlier InputRequired asked.
	Resume *InputResume
}

// InputRequired is a call the server answered with questions to answer
// before it completes (see CallRequest.Park).
type InputRequired struct {
	Op           string
	RequestState string
	// Questions by the server's id of each.
	Questions map[string]Question
}

func (e *InputRequired) Error() string {
	return fmt.Sprintf("call %s: the server asks %d question(s) before it answers", e.Op, len(e.Questions))
}

// InputResume answers an InputRequired: its state, echoed, and an answer
// per question id.
type InputResume struct {
	RequestState string            `json:"requestState"`
	Answers      map[string]Answer `json:"answers"`
}

// Question is what a server asks the client mid-call: a form to fill in
// (Message and RequestedSchema, a flat object of primitive fields) or a
// URL to open (Message, URL and ElicitationID).
type Question struct {
	Mode            string // "form" or "url"
	Message         string
	RequestedSchema map[string]any
	URL             string
	ElicitationID   string
}

// Answer is the client's reply to a question: Action "accept" (with the
// form's Content; none for a URL), "decline" or "cancel".
type Answer struct {
	Action  string         `json:"action"`
	Content map[string]any `json:"content,omitempty"`
}

// Answer actions.
const (
	AnswerAccept  = "accept"
	AnswerDecline = "decline"
	AnswerCancel  = "cancel"
)

// Asker answers the questions of one call (see CallRequest.Ask). It may
// take as long as a person does; ctx bounds it.
type Asker func(ctx context.Context, q Question) (Answer, error)

// TaskWatch is how a provider whose server answers a call with a task
// (an id to poll instead of a result) hands that task to the harness, so
// a runner that dies mid-task leaves the id in the step's pending ledger
// entry and the run that resumes it waits on the same task instead of
// calling again.
type TaskWatch struct {
	// Resume is the id of the task an earlier run of this call started:
	// the provider waits on it and sends no call.
	Resume string
	// Started records a new task before the provider waits on it. On an
	// error the provider cancels the task (nobody will wait on it) and
	// fails the call with that error.
	Started func(ctx context.Context, id string) error
	// Progress reports each change of the task's status or message.
	Progress func(t TaskProgress)
	// Cancels reports whether a call whose context ended should cancel
	// its task upstream: yes when the execution was cancelled, no when
	// the runner stops (the task is resumed, not abandoned).
	Cancels func(ctx context.Context) bool
}

// TaskProgress is one observed state of a server task.
type TaskProgress struct {
	ID      string
	Status  string // working, input_required, completed, failed, cancelled
	Message string
}

// CallError is a call the remote side answered with an error of its own
// (MCP isError: true), as opposed to a transport failure.
type CallError struct {
	Op      string
	Message string
	// Code is the server's own code for the refusal, when it gave one
	// (an MCP tool error's structuredContent {"code": ...}); CodeGuarded
	// asks for a person's approval.
	Code string
}

// CodeGuarded is the CallError code of a server refusing a target as
// guarded: the call waits for an approval and is sent again, once, with
// the approval's id (CallRequest.Approval).
const CodeGuarded = "guarded"

func (e *CallError) Error() string { return "operation " + e.Op + " failed: " + e.Message }

// Excerpt is the start of a failed answer's text for a CallError message:
// trimmed, and cut to at most n bytes on a rune boundary with "…" after.
func Excerpt(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) <= n {
		return s
	}
	return CutOnRune(s, n) + "…"
}

// CutOnRune is s cut to at most n bytes without splitting a rune.
func CutOnRune(s string, n int) string {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Sentinel errors of the connection contract.
var (
	// ErrUnavailable: the connection is not ready; calls fail fast.
	ErrUnavailable = errors.New("connection unavailable")
	// ErrUnknownOperation: the manifest declares no such operation.
	ErrUnknownOperation = errors.New("unknown operation")
)

// Conn is a live session with the thing behind a connection, opened by a
// Provider. Implementations must be safe for concurrent use.
type Conn interface {
	// Manifest is read once after connecting and may be cached by the caller.
	Manifest() Manifest
	Identity() Identity
	// Call runs one operation. A remote error is a *CallError; anything else
	// is a failure of the connection itself.
	Call(ctx context.Context, req CallRequest) (any, error)
	// Info carries provider details shown in status (protocol era, version).
	Info() map[string]any
	// Close releases the session and anything it started (child processes).
	Close() error
}

// Credentials resolves a principal's credentials for a connection at gate
// 6, just before a call is sent. ok is false when the connection has no
// per-caller credentials (the call goes out with the connection's own).
// An error refuses the call; ErrNeedsSignIn says the principal must sign
// in first.
type Credentials interface {
	Headers(ctx context.Context, connection, principal string) (headers map[string]string, ok bool, err error)
}

// CredentialRefresher is implemented by Credentials that can replace
// credentials a server rejected before they were due to expire (an OAuth
// token revoked or rotated early). The harness asks once per call, when
// the call failed with ErrNeedsSignIn, and sends it again with the result.
type CredentialRefresher interface {
	Refresh(ctx context.Context, connection, principal string, rejected map[string]string) (map[string]string, error)
}

// ErrNeedsSignIn: the connection needs a sign-in (OAuth) before it can be
// called for this principal.
var ErrNeedsSignIn = errors.New("sign-in needed")

// Provider opens the Conn behind one configured connection. Connect is
// called at Start and again when the harness reconnects.
type Provider interface {
	Connect(ctx context.Context) (Conn, error)
}

// ProviderFunc lets a function serve as a Provider.
type ProviderFunc func(ctx context.Context) (Conn, error)

// Connect calls f.
func (f ProviderFunc) Connect(ctx context.Context) (Conn, error) { return f(ctx) }

// ResourceReader is implemented by a Conn that can read a resource by
// URI, for bindings whose reads name a resource. headers are the
// principal's credentials, as CallRequest.Headers.
type ResourceReader interface {
	ReadResource(ctx context.Context, uri string, headers map[string]string) (any, error)
}
