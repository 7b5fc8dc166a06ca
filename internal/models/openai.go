package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// OpenAIOptions configure the OpenAI-compatible Chat Completions provider. Zero values mean defaults.
type OpenAIOptions struct {
	// APIKey is sent as "Authorization: Bearer <key>"; empty sends no
	// Authorization header (local servers such as Ollama need none).
	APIKey string
	// BaseURL defaults to https://api.openai.com/v1/; point it at a local
	// server, e.g. http://localhost:11434/v1/ (Ollama), http://localhost:8000/v1/
	// (vLLM) or http://localhost:8080/v1/ (llama.cpp).
	BaseURL string
	// MaxRetries of 429/5xx/connection errors; 0 means DefaultMaxRetries, negative none.
	MaxRetries int
	// MaxRetryAfter caps a server's Retry-After; 0 means DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration
	// LegacyMaxTokens sends Request.MaxTokens as max_tokens instead of
	// max_completion_tokens, for servers that only know the older field.
	LegacyMaxTokens bool
	// NoStreamUsage omits stream_options.include_usage, for servers that reject
	// it; usage is then whatever the server reports unasked (often nothing).
	NoStreamUsage bool
	// HTTPClient replaces the SDK's default client.
	HTTPClient *http.Client
}

// OpenAI is a Provider for OpenAI-compatible Chat Completions (streaming).
type OpenAI struct {
	client openai.Client
	apiKey string
	opts   OpenAIOptions
}

var _ Provider = (*OpenAI)(nil)

// NewOpenAI builds the provider. Environment defaults of the SDK (OPENAI_API_KEY,
// OPENAI_BASE_URL, organisation and project) are overridden or removed.
func NewOpenAI(o OpenAIOptions) *OpenAI {
	opts := []option.RequestOption{
		option.WithBaseURL(orDefault(o.BaseURL, "https://api.openai.com/v1/")),
		option.WithAPIKey(o.APIKey),
		option.WithMaxRetries(retryCount(o.MaxRetries)),
		option.WithMiddleware(capRetryAfter(orDefault(o.MaxRetryAfter, DefaultMaxRetryAfter)), normaliseOpenAIError),
		option.WithHeaderDel("OpenAI-Organization"),
		option.WithHeaderDel("OpenAI-Project"),
	}
	if o.APIKey == "" {
		opts = append(opts, option.WithHeaderDel("Authorization"))
	}
	if o.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(o.HTTPClient))
	}
	return &OpenAI{client: openai.NewClient(opts...), apiKey: o.APIKey, opts: o}
}

// Turn implements Provider.
func (p *OpenAI) Turn(ctx context.Context, req Request, onDelta func(Delta)) (*Response, error) {
	params, err := p.params(req)
	if err != nil {
		return nil, err
	}
	stream := p.client.Chat.Completions.NewStreaming(ctx, params)
	defer stream.Close()

	type call struct {
		id, name string
		args     strings.Builder
	}
	var (
		resp   Response
		text   strings.Builder
		calls  []*call
		byWire = map[int64]int{} // wire index -> position in calls
		finish string
	)
	for stream.Next() {
		chunk := stream.Current()
		if chunk.JSON.Usage.Valid() {
			resp.Usage = Usage{InputTokens: chunk.Usage.PromptTokens, OutputTokens: chunk.Usage.CompletionTokens}
		}
		for _, ch := range chunk.Choices {
			if ch.Index != 0 {
				continue // n > 1 is never requested
			}
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
			if ch.Delta.Content != "" {
				text.WriteString(ch.Delta.Content)
				emit(onDelta, Delta{Text: ch.Delta.Content})
			}
			for _, tc := range ch.Delta.ToolCalls {
				pos, ok := byWire[tc.Index]
				// Some servers reuse index 0 for every call; a new id starts a new call.
				if ok && tc.ID != "" && calls[pos].id != "" && tc.ID != calls[pos].id {
					ok = false
				}
				d := ToolCallDelta{ArgsFragment: tc.Function.Arguments}
				if !ok {
					pos = len(calls)
					byWire[tc.Index] = pos
					calls = append(calls, &call{id: tc.ID, name: tc.Function.Name})
					d.ID, d.Name = tc.ID, tc.Function.Name
				} else {
					c := calls[pos]
					if c.id == "" && tc.ID != "" {
						c.id, d.ID = tc.ID, tc.ID
					}
					if c.name == "" && tc.Function.Name != "" {
						c.name, d.Name = tc.Function.Name, tc.Function.Name
					}
				}
				calls[pos].args.WriteString(tc.Function.Arguments)
				d.Index = pos
				emit(onDelta, Delta{ToolCall: &d})
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, p.wrapErr(err)
	}
	resp.Text = text.String()
	for i, c := range calls {
		args, err := toolArgs(c.name, c.args.String())
		if err != nil {
			return nil, err
		}
		id := c.id
		if id == "" { // some local servers omit ids; the transcript needs one
			id = fmt.Sprintf("call_%d", i)
		}
		resp.ToolCalls = append(resp.ToolCalls, ToolCall{ID: id, Name: c.name, Args: args})
	}
	resp.StopReason = openAIStop(finish, len(calls) > 0)
	return &resp, nil
}

func openAIStop(finish string, hasCalls bool) StopReason {
	switch finish {
	case "stop":
		if hasCalls { // some local servers say "stop" after tool calls
			return StopToolUse
		}
		return StopEndTurn
	case "tool_calls", "function_call":
		return StopToolUse
	case "length":
		return StopMaxTokens
	case "content_filter":
		return StopContentFilter
	case "":
		if hasCalls {
			return StopToolUse
		}
		return StopEndTurn
	}
	return StopReason(finish)
}

func (p *OpenAI) params(req Request) (openai.ChatCompletionNewParams, error) {
	params := openai.ChatCompletionNewParams{Model: shared.ChatModel(req.Model)}
	if !p.opts.NoStreamUsage {
		params.StreamOptions.IncludeUsage = openai.Bool(true)
	}
	if req.MaxTokens > 0 {
		if p.opts.LegacyMaxTokens {
			params.MaxTokens = openai.Int(req.MaxTokens)
		} else {
			params.MaxCompletionTokens = openai.Int(req.MaxTokens)
		}
	}
	if req.Instructions != "" {
		params.Messages = append(params.Messages, openai.SystemMessage(req.Instructions))
	}
	for i, m := range req.Messages {
		switch m.Role {
		case RoleUser:
			params.Messages = append(params.Messages, openai.UserMessage(m.Text))
		case RoleAssistant:
			am := &openai.ChatCompletionAssistantMessageParam{}
			if m.Text != "" {
				am.Content.OfString = openai.String(m.Text)
			}
			for _, c := range m.ToolCalls {
				args := string(c.Args)
				if args == "" {
					args = "{}"
				}
				am.ToolCalls = append(am.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
					OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
						ID:       c.ID,
						Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: args},
					},
				})
			}
			params.Messages = append(params.Messages, openai.ChatCompletionMessageParamUnion{OfAssistant: am})
		case RoleTool:
			for _, r := range m.ToolResults {
				content := r.Content
				if r.IsError && !strings.HasPrefix(content, "Error") {
					// Chat Completions has no error flag on tool results.
					content = "Error: " + content
				}
				params.Messages = append(params.Messages, openai.ToolMessage(content, r.CallID))
			}
		default:
			return params, fmt.Errorf("models: message %d: unknown role %q", i, m.Role)
		}
	}
	for _, t := range req.Tools {
		fd := shared.FunctionDefinitionParam{Name: t.Name}
		if t.Description != "" {
			fd.Description = openai.String(t.Description)
		}
		if len(t.InputSchema) > 0 {
			var schema shared.FunctionParameters
			if err := json.Unmarshal(t.InputSchema, &schema); err != nil {
				return params, fmt.Errorf("models: tool %q: input schema: %w", t.Name, err)
			}
			fd.Parameters = schema
		}
		params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(fd))
	}
	if format, ok := responseFormat(req.OutputSchema); ok {
		params.ResponseFormat = format
	}
	switch req.ToolChoice {
	case "":
	case ToolChoiceAuto, ToolChoiceNone, ToolChoiceRequired:
		params.ToolChoice.OfAuto = openai.String(req.ToolChoice)
	case "any":
		params.ToolChoice.OfAuto = openai.String(ToolChoiceRequired)
	default:
		params.ToolChoice.OfFunctionToolChoice = &openai.ChatCompletionNamedToolChoiceParam{
			Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: req.ToolChoice},
		}
	}
	return params, nil
}

func (p *OpenAI) wrapErr(err error) error {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		out := &APIError{Provider: "openai", StatusCode: apiErr.StatusCode, Message: apiErr.Message}
		out.Type = orDefault(apiErr.Code, apiErr.Type)
		return scrub(out, p.apiKey)
	}
	return scrub(fmt.Errorf("openai: %w", err), p.apiKey)
}

// responseFormat asks an OpenAI-compatible server for JSON matching schema.
// Strict mode is off: it accepts only a subset of JSON Schema, and the
// caller validates the answer anyway. Only an object schema is sent
// (servers refuse others as a response format); any other is left to the
// instructions.
func responseFormat(schema json.RawMessage) (openai.ChatCompletionNewParamsResponseFormatUnion, bool) {
	var m map[string]any
	if len(schema) == 0 || json.Unmarshal(schema, &m) != nil || m["type"] != "object" {
		return openai.ChatCompletionNewParamsResponseFormatUnion{}, false
	}
	return openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
		JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "output", Schema: m, Strict: openai.Bool(false)},
	}}, true
}
