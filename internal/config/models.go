package config

import (
	"maps"
	"net/url"
	"regexp"
	"slices"
)

// Model provider types.
const (
	ModelAnthropic = "anthropic" // the Anthropic Messages API
	ModelOpenAI    = "openai"    // OpenAI-compatible Chat Completions (OpenAI, Ollama, vLLM, llama.cpp)
)

// ModelProvider is one entry under models: a provider that "<name>/<model>"
// in a model node selects.
type ModelProvider struct {
	// Type is the API the provider speaks: anthropic (the Anthropic
	// Messages API) or openai (OpenAI-compatible Chat Completions: OpenAI,
	// Ollama, vLLM, llama.cpp); required.
	Type string `yaml:"type"`
	// APIKey may be ${env:NAME} or ${secret:NAME}; a secret is left as
	// the reference here and resolved through the secret chain by the
	// server (see SecretRef), so its value never sits in the config.
	APIKey string `yaml:"apiKey" json:"-"`
	// BaseURL is the http(s) root requests go to, such as a local server's
	// http://127.0.0.1:11434/v1; default the type's hosted API
	// (https://api.anthropic.com/, https://api.openai.com/v1/). ${env:NAME}
	// may stand in it.
	BaseURL string `yaml:"baseURL"`
	// MaxRetries of 429/5xx answers (default 3, -1 none).
	MaxRetries int `yaml:"maxRetries"`
	// MaxTokens is the output bound sent when a node sets none.
	MaxTokens int64 `yaml:"maxTokens"`
}

var secretRefRE = regexp.MustCompile(`^\$\{secret:([A-Za-z0-9._-]+)\}$`)

// SecretRef reports whether s is exactly a ${secret:NAME} reference, and
// the name.
func SecretRef(s string) (string, bool) {
	m := secretRefRE.FindStringSubmatch(s)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// substituteModels replaces ${env:NAME} in model entries; an apiKey that
// is exactly ${secret:NAME} is kept for the server to resolve.
func (f *File) substituteModels(getenv func(string) string, ps *problems) {
	for _, name := range slices.Sorted(maps.Keys(f.Models)) {
		m := f.Models[name]
		path := "models." + name
		if _, ok := SecretRef(m.APIKey); !ok {
			m.APIKey = substituteString(m.APIKey, path+".apiKey", getenv, ps)
		}
		m.BaseURL = substituteString(m.BaseURL, path+".baseURL", getenv, ps)
		f.Models[name] = m
	}
}

func (f *File) validateModels(ps *problems) {
	for _, name := range slices.Sorted(maps.Keys(f.Models)) {
		m, path := f.Models[name], "models."+name
		if !ValidName(name) {
			ps.add(path, "name must be a letter followed by letters, digits, '_' or '-', at most 64 characters")
		}
		switch m.Type {
		case ModelAnthropic, ModelOpenAI:
		case "":
			ps.add(path+".type", "is required: anthropic or openai")
		default:
			ps.add(path+".type", "must be anthropic or openai, not %q", m.Type)
		}
		if m.BaseURL != "" {
			u, err := url.Parse(m.BaseURL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				ps.add(path+".baseURL", "must be an http or https URL, such as http://127.0.0.1:11434/v1")
			}
		}
		if m.Type == ModelAnthropic && m.APIKey == "" && m.BaseURL == "" {
			ps.add(path+".apiKey", "is required for the hosted Anthropic API (use ${secret:NAME} or ${env:NAME})")
		}
		if m.MaxRetries < -1 || m.MaxRetries > 10 {
			ps.add(path+".maxRetries", "must be from -1 (none) to 10, not %d", m.MaxRetries)
		}
		if m.MaxTokens < 0 || m.MaxTokens > 1_000_000 {
			ps.add(path+".maxTokens", "must be from 0 (the default) to 1000000, not %d", m.MaxTokens)
		}
	}
}
