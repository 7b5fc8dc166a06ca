package config_test

import (
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
)

func TestLoadAgents(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		file  string
		wants []want
		check func(t *testing.T, c *config.Config)
	}{
		{
			name: "an agent",
			file: `agents:
  codex:
    command: npx
    args: ["-y", "@zed-industries/codex-acp@0.16.0", "${env:CODEX_FLAG}"]
    env: {OPENAI_API_KEY: "${secret:openai.key}", HOME_HINT: "${env:CODEX_FLAG}"}
    cwd: /srv/work
    fs: true
    permissions: {allow: [read, search], deny: ["*"]}
    determinism: replayable
`,
			check: func(t *testing.T, c *config.Config) {
				a := c.File.Agents["codex"]
				if a.Args[2] != "--flag" || a.Env["HOME_HINT"] != "--flag" {
					t.Errorf("codex = %+v, want ${env:…} substituted", a)
				}
				if name, ok := config.SecretRef(a.Env["OPENAI_API_KEY"]); !ok || name != "openai.key" {
					t.Errorf("env OPENAI_API_KEY = %q, want the secret reference kept", a.Env["OPENAI_API_KEY"])
				}
				if a.Timeout() != config.DefaultAgentTimeoutMs || !a.FS || a.Determinism != "replayable" {
					t.Errorf("codex = %+v", a)
				}
			},
		},
		{
			name: "bad entries",
			file: `agents:
  9x: {command: x}
  a: {}
  b: {command: x, cwd: relative}
  c: {command: x, fs: true}
  d: {command: x, timeoutMs: -1, determinism: maybe}
  e: {command: x, permissions: {allow: [shell]}}
  f: {command: x, env: {"1BAD": v}}
`,
			wants: []want{
				{"agents.9x", "name must be"},
				{"agents.a.command", "is required"},
				{"agents.b.cwd", "absolute"},
				{"agents.c.cwd", "is required when fs or terminal is on"},
				{"agents.d.determinism", "replayable or unsafe"},
				{"agents.d.timeoutMs", "must be from 0"},
				{"agents.e.permissions.allow[0]", "tool kind"},
				{"agents.f.env.1BAD", "not a valid environment variable name"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := load(env{"PATCHBAY_CONFIG": "p.yaml", "CODEX_FLAG": "--flag"}, files{"p.yaml": tt.file})
			checkProblems(t, err, tt.wants...)
			if tt.check != nil && err == nil {
				tt.check(t, c)
			}
		})
	}
}
