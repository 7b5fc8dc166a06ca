// Package models owns the model-provider layer of patchbay: one provider-neutral
// Provider interface for a single model turn, and its implementations for the
// Anthropic Messages API and OpenAI-compatible Chat Completions (OpenAI itself,
// and local servers such as Ollama, vLLM or llama.cpp through a base URL).
//
// A turn always streams: text and tool-call fragments are handed to onDelta as
// they arrive (so they can become execution events), and the complete Response
// is assembled from the same stream. The package knows nothing about
// connections, gates, the ledger or the agent loop; those build on top of it.
//
// Choices worth knowing:
//   - Retries are the SDKs' own (both are Stainless-generated and share one
//     algorithm): 408, 409, 429, 5xx and connection errors are retried with
//     exponential backoff (0.5s doubling to 8s, jittered), and a Retry-After /
//     Retry-After-Ms header replaces the backoff. The number of retries is set
//     with option.WithMaxRetries (default 3 here). A middleware caps any
//     Retry-After at MaxRetryAfter so a provider cannot park a turn for hours.
//     Retries happen before the stream body is read, so onDelta never sees a
//     fragment twice; an error in the middle of a stream is not retried.
//   - The API key is passed explicitly; the SDKs' environment defaults
//     (ANTHROPIC_API_KEY, OPENAI_API_KEY, base URLs, …) are not consulted, so
//     what is configured is what is sent. Errors returned never contain the key.
//   - Structured output (Request.OutputSchema) is a response_format for
//     OpenAI-compatible servers and nothing on the wire for Anthropic; the
//     caller validates the answer either way.
//   - Tool-call arguments that are not valid JSON after the stream ends are an
//     error (ErrToolArguments) rather than passed on half-formed.
package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Provider runs one model turn: it sends the transcript and tools and returns
// what the model said or asked to call. onDelta may be nil.
type Provider interface {
	Turn(ctx context.Context, req Request, onDelta func(Delta)) (*Response, error)
}

// Role of a transcript message.
type Role string

const (
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	// RoleTool carries the results of the previous assistant message's tool calls.
	RoleTool Role = "tool"
)

// Tool choices understood by every provider; any other non-empty value names a tool.
const (
	ToolChoiceAuto     = "auto"
	ToolChoiceNone     = "none"
	ToolChoiceRequired = "required" // "any" is accepted as a synonym
)

// Request is one turn, provider-neutral.
type Request struct {
	// Model is the provider's model name (without the "provider/" prefix).
	Model string
	// Instructions become the system prompt.
	Instructions string
	Messages     []Message
	Tools        []Tool
	// ToolChoice is "", "auto", "none", "required" (or "any"), or a tool name.
	ToolChoice string
	// MaxTokens bounds the output; Anthropic requires one, so 0 means the
	// provider's DefaultMaxTokens there and "unset" for OpenAI-compatible servers.
	MaxTokens int64
	// OutputSchema is the JSON Schema the final answer must match, or nil.
	// Callers also ask for it in Instructions (the portable way); the
	// OpenAI-compatible provider adds response_format json_schema (strict
	// off, so any schema is accepted) when the schema is an object
	// schema. Anthropic gets the instruction only: its output_config
	// format accepts a subset of JSON Schema and only on some models, so a
	// document's schema could fail the whole request.
	OutputSchema json.RawMessage
}

// Message is one transcript entry. Which fields are used depends on Role:
// user has Text; assistant has Text and/or ToolCalls; tool has ToolResults.
type Message struct {
	Role        Role
	Text        string
	ToolCalls   []ToolCall
	ToolResults []ToolResult
}

// ToolResult answers the tool call with id CallID. Content must already be
// redacted: the provider layer sends it as it is.
type ToolResult struct {
	CallID  string
	Content string
	IsError bool
}

// Tool offered to the model. InputSchema is a JSON Schema of type object.
type Tool struct {
	Name        string
	Description string
	InputSchema json.RawMessage
}

// ToolCall is a complete call the model asked for.
type ToolCall struct {
	ID   string
	Name string
	Args json.RawMessage
}

// StopReason says why the model stopped, normalised across providers.
type StopReason string

const (
	StopEndTurn       StopReason = "end_turn"
	StopToolUse       StopReason = "tool_use"
	StopMaxTokens     StopReason = "max_tokens"
	StopSequence      StopReason = "stop_sequence"
	StopRefusal       StopReason = "refusal"
	StopPauseTurn     StopReason = "pause_turn"
	StopContentFilter StopReason = "content_filter"
)

// Usage is the token use of one turn, as reported by the provider.
type Usage struct {
	InputTokens  int64
	OutputTokens int64
}

// Response of one turn, assembled from the stream.
type Response struct {
	Text       string
	ToolCalls  []ToolCall
	StopReason StopReason
	Usage      Usage
}

// Delta is one streamed fragment: either Text or a ToolCall fragment.
type Delta struct {
	Text     string
	ToolCall *ToolCallDelta
}

// ToolCallDelta is a fragment of the tool call at Index (its position in
// Response.ToolCalls). ID and Name are set on the first fragment of a call;
// ArgsFragment is the next piece of its JSON arguments.
type ToolCallDelta struct {
	Index        int
	ID           string
	Name         string
	ArgsFragment string
}

// ErrToolArguments is returned when a streamed tool call's arguments are not valid JSON.
var ErrToolArguments = errors.New("models: tool call arguments are not valid JSON")

// APIError is a provider's HTTP error after retries (or one not retried, such as 400).
type APIError struct {
	Provider   string // "anthropic" or "openai"
	StatusCode int
	// Type is the provider's error type or code, when it gave one.
	Type    string
	Message string
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("%s: HTTP %d %s", e.Provider, e.StatusCode, http.StatusText(e.StatusCode))
	if e.Type != "" {
		s += " (" + e.Type + ")"
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Retryable reports whether the status is one the SDK retries (so seeing it
// here means the retries were used up).
func (e *APIError) Retryable() bool {
	return e.StatusCode == http.StatusTooManyRequests || e.StatusCode >= 500 ||
		e.StatusCode == http.StatusRequestTimeout || e.StatusCode == http.StatusConflict
}

// Defaults shared by both providers.
const (
	DefaultMaxRetries    = 3
	DefaultMaxRetryAfter = 60 * time.Second
)

// scrubbedError keeps the chain of err for errors.Is/As but prints with secrets removed.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// scrub removes every secret (and its URL-escaped form) from err's message.
func scrub(err error, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	changed := false
	for _, s := range secrets {
		if s == "" {
			continue
		}
		for _, form := range []string{s, urlEscape(s)} {
			if strings.Contains(msg, form) {
				msg = strings.ReplaceAll(msg, form, "<redacted>")
				changed = true
			}
		}
	}
	if !changed {
		return err
	}
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Error() == err.Error() {
		cp := *apiErr
		for _, s := range secrets {
			if s != "" {
				cp.Message = strings.ReplaceAll(cp.Message, s, "<redacted>")
				cp.Message = strings.ReplaceAll(cp.Message, urlEscape(s), "<redacted>")
			}
		}
		return &cp
	}
	return &scrubbedError{msg: msg, err: err}
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// retryCount maps the options' MaxRetries (0 = default, negative = none) to the SDK's.
func retryCount(n int) int {
	switch {
	case n < 0:
		return 0
	case n == 0:
		return DefaultMaxRetries
	}
	return n
}

// toolArgs validates assembled arguments; an empty string means no arguments.
func toolArgs(name, raw string) (json.RawMessage, error) {
	if strings.TrimSpace(raw) == "" {
		return json.RawMessage(`{}`), nil
	}
	if !json.Valid([]byte(raw)) {
		return nil, fmt.Errorf("%w: tool %q", ErrToolArguments, name)
	}
	return json.RawMessage(raw), nil
}

func emit(onDelta func(Delta), d Delta) {
	if onDelta != nil {
		onDelta(d)
	}
}
