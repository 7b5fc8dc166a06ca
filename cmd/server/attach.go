package main

import (
	"context"
	"log/slog"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/mcp"
)

// mcpAttacher connects the MCP servers documents bring, for one run, with
// their secrets filled in here and nowhere else.
type mcpAttacher struct {
	logger   *slog.Logger
	redactor *secrets.SecretRedactor
}

func (a mcpAttacher) Attach(ctx context.Context, spec document.AttachSpec, secrets map[string]string) (connect.Conn, error) {
	cfg := config.MCP{Name: spec.Name, Type: spec.Type, URL: spec.URL, Command: spec.Command, Args: spec.Args}
	for h, name := range spec.Headers {
		if cfg.Headers == nil {
			cfg.Headers = map[string]string{}
		}
		cfg.Headers[h] = secrets[name]
	}
	for k, name := range spec.Env {
		if cfg.Env == nil {
			cfg.Env = map[string]string{}
		}
		cfg.Env[k] = secrets[name]
	}
	a.redactor.Add(mcp.Secrets(cfg)...)
	return mcp.New(spec.Name, cfg, &mcp.Options{Logger: a.logger}).Connect(ctx)
}
