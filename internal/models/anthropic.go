package models

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/anthropics/anthropic-sdk-go"
	"github.com/anthropics/anthropic-sdk-go/option"
)

// AnthropicOptions configure the Anthropic Messages API provider. Zero values mean defaults.
type AnthropicOptions struct {
	// APIKey is sent as the x-api-key header.
	APIKey string
	// BaseURL defaults to https://api.anthropic.com/ (tests and proxies set it).
	BaseURL string
	// MaxRetries of 429/5xx/connection errors; 0 means DefaultMaxRetries, negative none.
	MaxRetries int
	// MaxRetryAfter caps a server's Retry-After; 0 means DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration
	// DefaultMaxTokens is used when a Request has none (the API requires it); 0 means 4096.
	DefaultMaxTokens int64
	// HTTPClient replaces the SDK's default client.
	HTTPClient *http.Client
}

// Anthropic is a Provider for the Anthropic Messages API (streaming).
type Anthropic struct {
	client    anthropic.Client
	apiKey    string
	maxTokens int64
}

var _ Provider = (*Anthropic)(nil)

// NewAnthropic builds the provider. The SDK's environment defaults are not read.
func NewAnthropic(o AnthropicOptions) *Anthropic {
	opts := []option.RequestOption{
		option.WithoutEnvironmentDefaults(),
		option.WithBaseURL(orDefault(o.BaseURL, "https://api.anthropic.com/")),
		option.WithMaxRetries(retryCount(o.MaxRetries)),
		option.WithMiddleware(capRetryAfter(orDefault(o.MaxRetryAfter, DefaultMaxRetryAfter))),
	}
	if o.APIKey != "" {
		opts = append(opts, option.WithAPIKey(o.APIKey))
	}
	if o.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(o.HTTPClient))
	}
	return &Anthropic{
		client:    anthropic.NewClient(opts...),
		apiKey:    o.APIKey,
		maxTokens: orDefault(o.DefaultMaxTokens, 4096),
	}
}

// Turn implements Provider.
func (p *Anthropic) Turn(ctx context.Context, req Request, onDelta func(Delta)) (*Response, error) {
	params, err := p.params(req)
	if err != nil {
		return nil, err
	}
	stream := p.client.Messages.NewStreaming(ctx, params)
	defer stream.Close()

	type block struct {
		kind     string // "text", "tool_use", other
		call     int    // index into calls for tool_use
		args     strings.Builder
		hasDelta bool
	}
	var (
		resp   Response
		text   strings.Builder
		blocks = map[int64]*block{}
		calls  []*struct {
			id, name string
			args     *strings.Builder
			start    json.RawMessage
		}
	)
	for stream.Next() {
		ev := stream.Current()
		switch ev.Type {
		case "message_start":
			u := ev.Message.Usage
			resp.Usage.InputTokens = u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
			resp.Usage.OutputTokens = u.OutputTokens
		case "content_block_start":
			cb := ev.ContentBlock
			b := &block{kind: cb.Type}
			blocks[ev.Index] = b
			switch cb.Type {
			case "text":
				if cb.Text != "" {
					text.WriteString(cb.Text)
					emit(onDelta, Delta{Text: cb.Text})
				}
			case "tool_use":
				tu := cb.AsToolUse()
				b.call = len(calls)
				calls = append(calls, &struct {
					id, name string
					args     *strings.Builder
					start    json.RawMessage
				}{id: tu.ID, name: tu.Name, args: &b.args, start: tu.Input})
				emit(onDelta, Delta{ToolCall: &ToolCallDelta{Index: b.call, ID: tu.ID, Name: tu.Name}})
			}
		case "content_block_delta":
			b := blocks[ev.Index]
			if b == nil {
				continue
			}
			switch d := ev.Delta; d.Type {
			case "text_delta":
				text.WriteString(d.Text)
				emit(onDelta, Delta{Text: d.Text})
			case "input_json_delta":
				if b.kind != "tool_use" {
					continue
				}
				b.args.WriteString(d.PartialJSON)
				b.hasDelta = true
				emit(onDelta, Delta{ToolCall: &ToolCallDelta{Index: b.call, ArgsFragment: d.PartialJSON}})
			}
		case "message_delta":
			if ev.Delta.StopReason != "" {
				resp.StopReason = StopReason(ev.Delta.StopReason)
			}
			// message_delta usage is cumulative.
			if ev.Usage.OutputTokens > 0 {
				resp.Usage.OutputTokens = ev.Usage.OutputTokens
			}
			if in := ev.Usage.InputTokens + ev.Usage.CacheCreationInputTokens + ev.Usage.CacheReadInputTokens; in > 0 {
				resp.Usage.InputTokens = in
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, p.wrapErr(err)
	}
	resp.Text = text.String()
	for _, c := range calls {
		raw := c.args.String()
		// Without input_json_delta events the input came whole in content_block_start.
		if strings.TrimSpace(raw) == "" && len(c.start) > 0 {
			raw = string(c.start)
		}
		args, err := toolArgs(c.name, raw)
		if err != nil {
			return nil, err
		}
		resp.ToolCalls = append(resp.ToolCalls, ToolCall{ID: c.id, Name: c.name, Args: args})
	}
	return &resp, nil
}

func (p *Anthropic) params(req Request) (anthropic.MessageNewParams, error) {
	params := anthropic.MessageNewParams{
		Model:     anthropic.Model(req.Model),
		MaxTokens: orDefault(req.MaxTokens, p.maxTokens),
	}
	if req.Instructions != "" {
		params.System = []anthropic.TextBlockParam{{Text: req.Instructions}}
	}
	for i, m := range req.Messages {
		var (
			role   anthropic.MessageParamRole
			blocks []anthropic.ContentBlockParamUnion
		)
		switch m.Role {
		case RoleUser:
			role = anthropic.MessageParamRoleUser
			blocks = append(blocks, anthropic.NewTextBlock(m.Text))
		case RoleAssistant:
			role = anthropic.MessageParamRoleAssistant
			if m.Text != "" {
				blocks = append(blocks, anthropic.NewTextBlock(m.Text))
			}
			for _, c := range m.ToolCalls {
				args := c.Args
				if len(args) == 0 {
					args = json.RawMessage(`{}`)
				}
				blocks = append(blocks, anthropic.NewToolUseBlock(c.ID, args, c.Name))
			}
		case RoleTool:
			role = anthropic.MessageParamRoleUser
			for _, r := range m.ToolResults {
				blocks = append(blocks, anthropic.NewToolResultBlock(r.CallID, r.Content, r.IsError))
			}
		default:
			return params, fmt.Errorf("models: message %d: unknown role %q", i, m.Role)
		}
		if len(blocks) == 0 {
			continue
		}
		// The API wants alternating turns: tool results and a following user
		// message share one user turn.
		if n := len(params.Messages); n > 0 && params.Messages[n-1].Role == role {
			params.Messages[n-1].Content = append(params.Messages[n-1].Content, blocks...)
			continue
		}
		params.Messages = append(params.Messages, anthropic.MessageParam{Role: role, Content: blocks})
	}
	for _, t := range req.Tools {
		schema, err := anthropicSchema(t.InputSchema)
		if err != nil {
			return params, fmt.Errorf("models: tool %q: %w", t.Name, err)
		}
		tp := &anthropic.ToolParam{Name: t.Name, InputSchema: schema}
		if t.Description != "" {
			tp.Description = anthropic.String(t.Description)
		}
		params.Tools = append(params.Tools, anthropic.ToolUnionParam{OfTool: tp})
	}
	switch req.ToolChoice {
	case "":
	case ToolChoiceAuto:
		params.ToolChoice = anthropic.ToolChoiceUnionParam{OfAuto: &anthropic.ToolChoiceAutoParam{}}
	case ToolChoiceNone:
		params.ToolChoice = anthropic.ToolChoiceUnionParam{OfNone: &anthropic.ToolChoiceNoneParam{}}
	case ToolChoiceRequired, "any":
		params.ToolChoice = anthropic.ToolChoiceUnionParam{OfAny: &anthropic.ToolChoiceAnyParam{}}
	default:
		params.ToolChoice = anthropic.ToolChoiceParamOfTool(req.ToolChoice)
	}
	return params, nil
}

func anthropicSchema(raw json.RawMessage) (anthropic.ToolInputSchemaParam, error) {
	var s anthropic.ToolInputSchemaParam
	if len(raw) == 0 {
		return s, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return s, fmt.Errorf("input schema: %w", err)
	}
	if t, ok := m["type"]; ok && t != "object" {
		return s, fmt.Errorf("input schema: type must be object, not %v", t)
	}
	s.Properties = m["properties"]
	if req, ok := m["required"].([]any); ok {
		for _, r := range req {
			if name, ok := r.(string); ok {
				s.Required = append(s.Required, name)
			}
		}
	}
	for k, v := range m {
		switch k {
		case "type", "properties", "required":
		default:
			if s.ExtraFields == nil {
				s.ExtraFields = map[string]any{}
			}
			s.ExtraFields[k] = v
		}
	}
	return s, nil
}

func (p *Anthropic) wrapErr(err error) error {
	var apiErr *anthropic.Error
	if errors.As(err, &apiErr) {
		out := &APIError{Provider: "anthropic", StatusCode: apiErr.StatusCode}
		var body struct {
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(apiErr.RawJSON()), &body) == nil {
			out.Type, out.Message = body.Error.Type, body.Error.Message
		}
		return scrub(out, p.apiKey)
	}
	return scrub(fmt.Errorf("anthropic: %w", err), p.apiKey)
}
