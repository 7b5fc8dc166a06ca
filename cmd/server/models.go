package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/models"
)

// modelRouter serves the harness's model turns from the providers of the
// config file's models: "local/llama3" is model llama3 of provider local.
// An API key given as ${secret:NAME} is resolved through the secret chain
// on a provider's first turn (so a secret PUT after start is found), and
// every key is registered with the redactor before it is used.
type modelRouter struct {
	specs    map[string]config.ModelProvider
	secrets  secrets.SecretStore
	redactor *secrets.SecretRedactor

	mu        sync.Mutex
	providers map[string]models.Provider
}

// newModels returns the harness's Models, or nil when none are configured
// (documents with model nodes are then refused at submission).
func newModels(specs map[string]config.ModelProvider, secrets secrets.SecretStore, redactor *secrets.SecretRedactor) agent.Models {
	if len(specs) == 0 {
		return nil
	}
	for _, s := range specs {
		if _, isSecret := config.SecretRef(s.APIKey); !isSecret && s.APIKey != "" {
			redactor.Add(s.APIKey)
		}
	}
	return &modelRouter{specs: specs, secrets: secrets, redactor: redactor, providers: map[string]models.Provider{}}
}

// Check implements agent.Models.
func (m *modelRouter) Check(ref string) error {
	name, model, ok := strings.Cut(ref, "/")
	if !ok || model == "" {
		return fmt.Errorf("model %q must be \"<provider>/<model>\"", ref)
	}
	if _, ok := m.specs[name]; !ok {
		return fmt.Errorf("no model provider %q is configured (models: %s)", name, strings.Join(slices.Sorted(maps.Keys(m.specs)), ", "))
	}
	return nil
}

func (m *modelRouter) provider(ctx context.Context, name string) (models.Provider, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.providers[name]; ok {
		return p, nil
	}
	spec, ok := m.specs[name]
	if !ok {
		return nil, fmt.Errorf("no model provider %q is configured", name)
	}
	key := spec.APIKey
	if secret, isSecret := config.SecretRef(key); isSecret {
		v, err := m.secrets.Resolve(ctx, secret)
		if err != nil {
			return nil, fmt.Errorf("model provider %s: secret %q could not be resolved", name, secret)
		}
		m.redactor.Add(v)
		key = v
	}
	var p models.Provider
	switch spec.Type {
	case config.ModelAnthropic:
		p = models.NewAnthropic(models.AnthropicOptions{APIKey: key, BaseURL: spec.BaseURL, MaxRetries: spec.MaxRetries, DefaultMaxTokens: spec.MaxTokens})
	default:
		p = models.NewOpenAI(models.OpenAIOptions{APIKey: key, BaseURL: openAIBase(spec.BaseURL), MaxRetries: spec.MaxRetries})
	}
	m.providers[name] = p
	return p, nil
}

// openAIBase gives the SDK the trailing slash it needs to keep a base
// path: without it, ".../v1" + "chat/completions" loses the "/v1".
func openAIBase(u string) string {
	if u != "" && !strings.HasSuffix(u, "/") {
		return u + "/"
	}
	return u
}

// Turn implements agent.Models.
func (m *modelRouter) Turn(ctx context.Context, req agent.ModelRequest, onDelta func(agent.ModelDelta)) (*agent.ModelResponse, error) {
	name, model, _ := strings.Cut(req.Model, "/")
	p, err := m.provider(ctx, name)
	if err != nil {
		return nil, err
	}
	resp, err := p.Turn(ctx, toModelsRequest(model, req), func(d models.Delta) {
		if onDelta == nil {
			return
		}
		hd := agent.ModelDelta{Text: d.Text}
		if tc := d.ToolCall; tc != nil {
			hd.ToolCallIndex, hd.ToolCallID, hd.ToolName, hd.ArgsFragment = tc.Index, tc.ID, tc.Name, tc.ArgsFragment
		}
		onDelta(hd)
	})
	if err != nil {
		return nil, m.redactor.Error(err)
	}
	out := &agent.ModelResponse{Text: resp.Text, StopReason: string(resp.StopReason),
		Usage: agent.ModelUsage{InputTokens: resp.Usage.InputTokens, OutputTokens: resp.Usage.OutputTokens}}
	for _, c := range resp.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, agent.ModelToolCall{ID: c.ID, Name: c.Name, Args: c.Args})
	}
	return out, nil
}

func toModelsRequest(model string, req agent.ModelRequest) models.Request {
	out := models.Request{Model: model, Instructions: req.Instructions, ToolChoice: req.ToolChoice, MaxTokens: req.MaxTokens, OutputSchema: req.OutputSchema}
	for _, msg := range req.Messages {
		mm := models.Message{Role: models.Role(msg.Role), Text: msg.Text}
		for _, c := range msg.ToolCalls {
			mm.ToolCalls = append(mm.ToolCalls, models.ToolCall{ID: c.ID, Name: c.Name, Args: c.Args})
		}
		for _, r := range msg.ToolResults {
			mm.ToolResults = append(mm.ToolResults, models.ToolResult{CallID: r.CallID, Content: r.Content, IsError: r.IsError})
		}
		out.Messages = append(out.Messages, mm)
	}
	for _, t := range req.Tools {
		out.Tools = append(out.Tools, models.Tool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema})
	}
	return out
}
