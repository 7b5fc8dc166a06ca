package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/telemetry"
)

// shutdownTelemetry flushes the spans still buffered, bounded so that an
// unreachable collector does not hold up the exit.
func shutdownTelemetry(tel *telemetry.Telemetry, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		logger.Warn("flushing traces", "err", err)
	}
}

// watchHealth feeds the health metrics that read the store: Redis round
// trips, pending approvals and pool usage at each scrape.
func watchHealth(metrics *api.Metrics, st *store.Store, execs *harness.Executions, cfg *config.Config, logger *slog.Logger) {
	st.Observe(metrics.RedisDone)
	metrics.WatchApprovals(execs.Approvals().PendingApprovals)
	var watched []*pools.Pool
	for _, name := range sortedNames(cfg.File.Connections) {
		spec := cfg.File.Connections[name]
		if spec.Pool == nil {
			continue
		}
		p, err := pools.New(st, name, spec.Pool.Max, &pools.Options{ReclaimAfter: cfg.PoolReclaimAfter})
		if err != nil {
			continue // the connection itself reports it
		}
		watched = append(watched, p)
	}
	metrics.WatchPools(func(ctx context.Context) []api.PoolUsage {
		out := make([]api.PoolUsage, 0, len(watched))
		for _, p := range watched {
			u, err := p.Status(ctx)
			if err != nil {
				logger.Debug("pool usage for metrics", "pool", p.Name(), "err", err)
				continue
			}
			out = append(out, api.PoolUsage{Pool: p.Name(), Max: u.Max, Leased: u.Leased, Q: u.Queued})
		}
		return out
	})
}
