package main

import (
	"log/slog"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/webhooks"
)

// newTriggers builds the sources, cron, triggers and the webhook receiver
// of the config file. It starts nothing: run starts triggers after the
// connections (unless PATCHBAY_START_TRIGGERS=false).
func newTriggers(st *store.Store, execs *harness.Executions, reg *harness.Registry, cfg *config.Config, logger *slog.Logger, obs triggers.Observer) (*triggers.Service, *webhooks.Receiver, error) {
	svc, err := triggers.New(triggers.Options{Store: st, Executions: execs, Registry: reg, File: &cfg.File, Logger: logger, Observer: obs})
	if err != nil {
		return nil, nil, err
	}
	hooks, err := webhooks.New(cfg.File.Connections, svc, nil)
	if err != nil {
		return nil, nil, err
	}
	return svc, hooks, nil
}
