package config_test

import (
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
)

func TestLoadModels(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		file  string
		wants []want
		check func(t *testing.T, c *config.Config)
	}{
		{
			name: "hosted and local",
			file: `models:
  anthropic: {type: anthropic, apiKey: "${secret:ANTHROPIC_KEY}"}
  local: {type: openai, baseURL: "http://127.0.0.1:11434/v1"}
  hosted: {type: openai, apiKey: "${env:OPENAI_KEY}", maxRetries: -1}
`,
			check: func(t *testing.T, c *config.Config) {
				m := c.File.Models
				if name, ok := config.SecretRef(m["anthropic"].APIKey); !ok || name != "ANTHROPIC_KEY" {
					t.Errorf("anthropic apiKey = %q, want the secret reference kept", m["anthropic"].APIKey)
				}
				if m["local"].BaseURL != "http://127.0.0.1:11434/v1" || m["local"].APIKey != "" {
					t.Errorf("local = %+v", m["local"])
				}
				if m["hosted"].APIKey != "sk-from-env" || m["hosted"].MaxRetries != -1 {
					t.Errorf("hosted = %+v", m["hosted"])
				}
			},
		},
		{
			name: "bad entries",
			file: `models:
  a: {type: gemini}
  b: {type: openai, baseURL: "ftp://x"}
  c: {type: anthropic}
  d: {type: openai, baseURL: "${secret:URL}"}
  9x: {type: openai}
`,
			wants: []want{
				{"models.9x", "name must be"},
				{"models.a.type", "must be anthropic or openai"},
				{"models.b.baseURL", "http or https"},
				{"models.c.apiKey", "is required"},
				{"models.d.baseURL", "${secret:URL}"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := load(env{"PATCHBAY_CONFIG": "p.yaml", "OPENAI_KEY": "sk-from-env"}, files{"p.yaml": tt.file})
			checkProblems(t, err, tt.wants...)
			if tt.check != nil && err == nil {
				tt.check(t, c)
			}
		})
	}
}
