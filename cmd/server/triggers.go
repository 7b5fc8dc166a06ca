package main

import (
	"log/slog"
	"maps"
	"slices"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/seal"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/webhooks"
)

// How webhook secrets of MCP event subscriptions are sealed: a key of
// their own, derived from PATCHBAY_SECRET_KEY.
const (
	hookSealPurpose = "patchbay mcp event webhook secrets v1"
	hookSealLabel   = "patchbay mcp hooks\x00"
)

// newTriggers builds the sources, cron, triggers and the webhook receiver
// of the config file. It starts nothing: run starts triggers after the
// connections (unless PATCHBAY_START_TRIGGERS=false).
func newTriggers(st *store.Store, execs *harness.Executions, reg *registry.Registry, cfg *config.Config, logger *slog.Logger, obs triggers.Observer) (*triggers.Service, *webhooks.Receiver, error) {
	box, err := hookSeal(cfg, st, logger)
	if err != nil {
		return nil, nil, err
	}
	svc, err := triggers.New(triggers.Options{Store: st, Executions: execs, Registry: reg, File: &cfg.File, Logger: logger, Observer: obs, PublicURL: cfg.PublicURL, Seal: box})
	if err != nil {
		return nil, nil, err
	}
	hooks, err := webhooks.New(cfg.File.Connections, svc, nil)
	if err != nil {
		return nil, nil, err
	}
	return svc, hooks, nil
}

// hookSeal is what seals the webhook secrets of MCP event subscriptions,
// or nil when webhook delivery is off: no PATCHBAY_PUBLIC_URL, no MCP
// connection with events wanted, or a shared Redis without
// PATCHBAY_SECRET_KEY (said in the log; those subscriptions poll, or
// record why they cannot).
func hookSeal(cfg *config.Config, st *store.Store, logger *slog.Logger) (*seal.Box, error) {
	if cfg.PublicURL == "" || !wantsServerEvents(&cfg.File) {
		return nil, nil
	}
	if cfg.SecretKey == "" && !st.Embedded() {
		logger.Warn("no PATCHBAY_SECRET_KEY: MCP server events are not delivered by webhook (their secrets would be stored unencrypted on a shared Redis)")
		return nil, nil
	}
	keyID, key, err := sealKey(cfg, st, logger, "webhook delivery of MCP server events", "webhook secrets")
	if err != nil {
		return nil, err
	}
	return seal.New(key, keyID, hookSealPurpose, hookSealLabel)
}

// wantsServerEvents reports whether some MCP connection has a trigger or
// a subscribe list.
func wantsServerEvents(f *config.File) bool {
	return slices.ContainsFunc(slices.Collect(maps.Values(f.Connections)), func(c config.Connection) bool { return c.MCP != nil && len(c.MCP.Subscribe) > 0 }) ||
		slices.ContainsFunc(f.Triggers, func(t config.Trigger) bool { return f.Connections[t.Connection].MCP != nil })
}
