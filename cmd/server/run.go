package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/eventstream"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/mcp"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
	"github.com/patchbay-dev/patchbay/internal/openapi"
	"github.com/patchbay-dev/patchbay/internal/profiles"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/telemetry"
	"github.com/patchbay-dev/patchbay/internal/throttle"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// closeGrace is how long closing the connections, the store and the
// telemetry may take after the drain (config ShutdownGrace) before the
// process exits regardless.
const closeGrace = 5 * time.Second

// run builds the parts from the environment and args and serves until ctx
// is done. Everything it prints goes to stdout.
func run(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stdout)
	configPath := fs.String("config", "", "config file (overrides PATCHBAY_CONFIG)")
	addr := fs.String("addr", "", "listen address (overrides PATCHBAY_ADDR)")
	healthcheck := fs.String("healthcheck", "", "GET this URL, exit 0 on 200 and 1 otherwise (for container health checks)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *healthcheck != "" {
		return probe(ctx, *healthcheck)
	}
	cfg, err := config.Load(overrides(getenv, map[string]string{"PATCHBAY_CONFIG": *configPath, "PATCHBAY_ADDR": *addr}), os.ReadFile)
	if err != nil {
		return err
	}
	// Every log line passes the redactor: a secret resolved at gate 6 or
	// configured for a connection never reaches the log.
	redactor := secrets.NewSecretRedactor()
	// Lines logged inside an execution carry its id and trace (telemetry.LogHandler).
	logger := slog.New(redactor.Handler(telemetry.LogHandler(cfg.LogHandler(stdout))))
	// From the signal on, the process is gone within the drain and the
	// closing, whatever still runs: a goroutine that never looks at its
	// context (a CPU-bound compile, a call that ignores cancellation)
	// cannot keep it alive.
	dog := &watchdog{after: cfg.ShutdownGrace + closeGrace, logger: logger, exit: os.Exit}
	defer context.AfterFunc(ctx, dog.arm)()
	defer dog.disarm()
	redis.SetLogger(redisLogger{logger})
	tel, err := telemetry.Setup(ctx, getenv, redactor)
	if err != nil {
		return err
	}
	defer shutdownTelemetry(tel, logger)

	st, err := store.Open(ctx, cfg.RedisURL, cfg.RedisPrefix, logger)
	if err != nil {
		return err
	}
	defer st.Close()

	oauthSvc, err := signIns(cfg, st, redactor, logger)
	if err != nil {
		return err
	}
	// Secrets come before the connections: an openapi entry's headers may
	// resolve ${secret:NAME} through them at every call.
	secrets, secretWriter, err := secretStores(cfg, st, getenv)
	if err != nil {
		return err
	}
	apps, err := gitHubApps(cfg, st, secrets, redactor, logger)
	if err != nil {
		return err
	}
	reg := registry.NewRegistry(logger)
	catalog, err := profileCatalog(cfg.ProfilesDir)
	if err != nil {
		return err
	}
	reg.SetProfiles(catalog)
	for _, name := range sortedNames(cfg.File.Connections) {
		spec := cfg.File.Connections[name]
		var p connect.Provider = triggers.NewProvider(name, spec) // source and cron
		if spec.MCP != nil {
			opts := &mcp.Options{Logger: logger}
			if usesOAuth(spec) {
				opts.HTTPClient = oauthClient(oauthSvc, name)
			}
			if c := apps.conns[name]; c != nil {
				opts.HTTPClient = c.client(spec.MCP.URL)
			}
			p = mcp.New(name, *spec.MCP, opts)
			redactor.Add(mcp.Secrets(*spec.MCP)...)
		}
		if spec.OpenAPI != nil {
			opts := &openapi.Options{Logger: logger, Secrets: secrets, Redactor: redactor}
			if usesOAuth(spec) {
				opts.Shared, opts.SharedOnly = oauthSvc, !spec.Auth.PerUser
			}
			if c := apps.conns[name]; c != nil {
				// The App's tokens go to its GitHub only, whatever the
				// document or baseUrl say.
				opts.Shared, opts.CredentialsOnlyTo = c, c.src.APIBaseURL()
			}
			p = openapi.New(name, *spec.OpenAPI, opts)
			redactor.Add(openapi.Secrets(*spec.OpenAPI)...)
		}
		if k, ok := providerKinds[spec.Kind()]; ok {
			d := providerDeps{logger: logger, secrets: secrets, redactor: redactor, tokens: apps.tokens[name]}
			if p, err = newProvider(name, spec, k, d); err != nil {
				return err
			}
		}
		if spec.Pool != nil {
			if p, err = poolProvider(st, name, spec, cfg.PoolReclaimAfter, logger, redactor); err != nil {
				return err
			}
		}
		if err := reg.Add(name, p); err != nil {
			return err
		}
		pol := registry.Policy{Determinism: spec.Determinism}
		if p := spec.Policy; p != nil {
			pol.Approve, pol.Deny, pol.Allow, pol.Approvers = p.Approve, p.Deny, p.Allow, p.Approvers
			pol.Answerers, pol.DeclineQuestions = p.Answerers, p.DeclineQuestions
		}
		if err := reg.SetPolicy(name, pol); err != nil {
			return err
		}
		if err := reg.SetAccess(name, access(spec)); err != nil {
			return err
		}
		if err := reg.SetKind(name, spec.Kind(), reportURL(spec)); err != nil {
			return err
		}
		if spec.Binding != "" {
			b, ok := catalog.Binding(spec.Binding)
			if !ok {
				return fmt.Errorf("connections.%s.binding: no binding named %q (known: %s)", name, spec.Binding, strings.Join(catalog.BindingNames(), ", "))
			}
			if err := reg.SetBinding(name, b); err != nil {
				return err
			}
		}
	}
	defer func() {
		if err := reg.Close(); err != nil {
			logger.Error("closing connections", "err", err)
		}
	}()

	als := gates.NewAllowlists(st)
	if err := seedAllowlists(ctx, als, cfg.File.Allowlists, logger); err != nil {
		return err
	}
	metrics := api.NewMetrics()
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{
		Retention: cfg.Retention, Logger: logger, Observer: metrics, Allowlists: als,
		Secrets: secrets, Redactor: redactor, Visibility: cfg.ClaimTimeout,
		Attacher: mcpAttacher{logger: logger, redactor: redactor}, Credentials: callCredentials(apps.conns, credentials(oauthSvc)),
		Models: newModels(cfg.File.Models, secrets, redactor), Tracer: tel.Tracer,
		SchemaMaxNodes: cfg.SchemaMaxNodes, SchemaCompileTimeout: cfg.SchemaCompileTimeout,
		Agents: agentEntries(cfg.File.Agents), QuestionHold: cfg.Limits.QuestionHold,
	})
	watchHealth(metrics, st, execs, cfg, logger)
	keys := apiKeys(cfg, stdout)
	trig, hooks, err := newTriggers(st, execs, reg, cfg, logger, metrics)
	if err != nil {
		return err
	}
	defer trig.Close()
	var started atomic.Bool
	// One count of failed credentials per address for the API and the
	// admin sign-in: a guess is a guess on either.
	guesses := throttle.New(&throttle.Options{
		Free: cfg.Limits.AuthFailures, Backoff: cfg.Limits.AuthBackoff, MaxBackoff: cfg.Limits.AuthBackoffMax,
	})
	proxies := throttle.Proxies(cfg.Limits.TrustedProxies)
	// One count of open event streams for the API and the admin UI: a
	// stream is a stream on either.
	streams := eventstream.New(execs, &eventstream.Options{
		PerPrincipal: cfg.Limits.MaxStreamsPerPrincipal, Total: cfg.Limits.MaxStreams,
	})
	face := mcpserver.New(mcpserver.Options{
		Engine: execs, Hold: cfg.Limits.MCPHold, SessionsPerPrincipal: cfg.Limits.MCPSessionsPerPrincipal,
		CallsPerPrincipal: cfg.Limits.MCPCallsPerPrincipal, SessionIdle: cfg.Limits.MCPSessionIdle, Logger: logger,
		PublicURL: cfg.PublicURL, Version: telemetry.Version(),
	})
	tokens, err := mcpTokens(cfg, logger)
	if err != nil {
		return err
	}
	handler := api.New(api.Options{
		Executions: execs, Registry: reg, APIKeys: keys, Allowlists: als, MaxBodyBytes: cfg.MaxBodyBytes, Metrics: metrics, Logger: logger,
		Triggers: trig, Webhooks: hooks, Secrets: secretWriter, Throttle: guesses, TrustedProxies: proxies, Tracer: tel.Tracer,
		Streams: streams, MCP: face, MCPTokens: tokens, Questions: execs.Questions(),
		Ready: func(ctx context.Context) error {
			if !started.Load() {
				return errors.New("connections are still starting")
			}
			return st.Ping(ctx)
		},
	})

	webOpts := web.Options{
		AdminToken: adminToken(cfg, stdout), Store: st, Executions: execs, Registry: reg, Allowlists: als, Triggers: trig, Logger: logger,
		Users: uiUsers(cfg), Throttle: guesses, TrustedProxies: proxies, TraceURL: cfg.TraceURL, Streams: streams,
		MCP: face,
	}
	if oauthSvc != nil {
		webOpts.SignIns = oauthSvc
	}
	if err := web.Mount(handler, webOpts); err != nil {
		return err
	}

	stopPprof, err := servePprof(cfg.PprofAddr, logger)
	if err != nil {
		return fmt.Errorf("pprof: %w", err)
	}
	defer stopPprof()
	ln, err := listen(cfg.Addr, cfg.Limits)
	if err != nil {
		return err
	}
	execs.SetAgentBridge(bridgeURL(ln.Addr()))
	srv := newHTTPServer(handler, cfg.Limits, logger)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "patchbay listening on http://%s\n", ln.Addr())

	if err := reg.Start(ctx); err != nil {
		logger.Warn("some connections did not start; they are unavailable", "err", err)
	}
	started.Store(true)
	go face.Watch(ctx)

	workCtx, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	var workers sync.WaitGroup
	workers.Go(func() {
		if err := execs.Run(workCtx, cfg.Workers); err != nil {
			logger.Error("workers stopped", "err", err)
		}
	})
	if cfg.StartTriggers {
		if err := trig.Start(ctx); err != nil {
			logger.Error("triggers did not start; POST /v1/harness/start retries", "err", err)
		}
	}

	select {
	case <-ctx.Done():
		logger.Info("shutting down")
	case err := <-serveErr:
		stopWork()
		workers.Wait()
		return fmt.Errorf("serve: %w", err)
	}
	// One deadline for the requests and the executions in flight: an
	// execution still running at it is left to be resumed from its ledger
	// (by another replica, or this one restarted), like a crashed one.
	deadline := time.Now().Add(cfg.ShutdownGrace)
	shutdownCtx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Error("http shutdown", "err", err)
	}
	stopWork()
	if !drained(&workers, deadline) {
		logger.Warn("executions still running at the shutdown deadline are left to resume elsewhere or at the next start", "grace", cfg.ShutdownGrace)
	}
	return nil
}

// drained waits for wg until deadline and reports whether it finished.
func drained(wg *sync.WaitGroup, deadline time.Time) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// watchdog exits the process when shutting down takes longer than after,
// counted from arm (the signal); disarm (run returning) stops it.
type watchdog struct {
	after  time.Duration
	logger *slog.Logger
	exit   func(code int) // os.Exit

	mu       sync.Mutex
	timer    *time.Timer
	disarmed bool
}

func (w *watchdog) arm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.disarmed {
		return
	}
	w.timer = time.AfterFunc(w.after, func() {
		w.logger.Error("shutdown overran its deadline; exiting", "after", w.after)
		w.exit(1)
	})
}

func (w *watchdog) disarm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.disarmed = true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// overrides returns getenv with non-empty values from flags taking
// precedence.
func overrides(getenv func(string) string, flags map[string]string) func(string) string {
	return func(k string) string {
		if v := flags[k]; v != "" {
			return v
		}
		return getenv(k)
	}
}

// apiKeys returns the configured keys; with none configured it makes one
// for this run, bound to the default allowlist, and prints it once, so the
// API is never open.
func apiKeys(cfg *config.Config, stdout io.Writer) []api.Key {
	keys := make([]api.Key, 0, len(cfg.APIKeys))
	for _, k := range cfg.APIKeys {
		keys = append(keys, api.Key{SHA256: k.SHA256, Principal: principalOf(k)})
	}
	if len(keys) == 0 {
		key := "pb_" + rand.Text()
		fmt.Fprintf(stdout, "No PATCHBAY_API_KEYS set; this run's API key is: %s\n", key)
		keys = append(keys, api.Key{SHA256: sha256.Sum256([]byte(key)), Principal: authz.Principal{Name: authz.GeneratedName, Allowlist: config.DefaultAllowlist}})
	}
	return keys
}

// principalOf is who a configured key names: its roles and grants.
func principalOf(k config.APIKey) authz.Principal {
	return authz.Principal{Name: k.Name, Allowlist: k.Allowlist, Roles: k.Roles, Approve: k.Approve, Push: k.Push}
}

// adminToken is the token that signs operators in to /admin; with none
// configured it makes one for this run and prints it once, as apiKeys does.
func adminToken(cfg *config.Config, stdout io.Writer) string {
	if cfg.AdminToken != "" {
		return cfg.AdminToken
	}
	tok := "pba_" + rand.Text()
	fmt.Fprintf(stdout, "No PATCHBAY_ADMIN_TOKEN set; this run's admin token (sign in at /admin) is: %s\n", tok)
	return tok
}

// seedAllowlists writes the config file's allowlists that Redis does not
// have yet.
func seedAllowlists(ctx context.Context, als *gates.Allowlists, specs map[string]map[string]any, logger *slog.Logger) error {
	for _, name := range slices.Sorted(maps.Keys(specs)) {
		raw, err := json.Marshal(specs[name])
		if err != nil {
			return fmt.Errorf("allowlists.%s: %w", name, err)
		}
		al, err := gates.ParseAllowlist(name, raw)
		if err != nil {
			return fmt.Errorf("allowlists.%s: %w", name, err)
		}
		created, err := als.Seed(ctx, al)
		if err != nil {
			return err
		}
		if created {
			logger.Info("allowlist seeded from config", "allowlist", name)
		}
	}
	return nil
}

func sortedNames(m map[string]config.Connection) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// probe is the container health check: images without curl run the server
// binary itself.
func probe(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health check: %s answered %s", url, resp.Status)
	}
	return nil
}

// redisLogger sends go-redis's own messages (dial failures, pool notes)
// through slog instead of its default stderr logger.
type redisLogger struct{ logger *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.logger.WarnContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

// reportURL is where a connection reaches, as its status shows it: an http
// MCP server's URL, an OpenAPI document's location or a Drive's API base,
// without userinfo or query (either may hold a credential); "" for the other kinds.
func reportURL(spec config.Connection) string {
	var raw string
	switch {
	case spec.MCP != nil && spec.MCP.Transport() != "stdio":
		raw = spec.MCP.URL
	case spec.OpenAPI != nil:
		raw = spec.OpenAPI.URL
	case spec.Drive != nil:
		raw = driveAPI(*spec.Drive)
	default:
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}

// profileCatalog is the shipped profiles and bindings and those of dir
// (none when empty). A bad file stops the server, naming its path.
func profileCatalog(dir string) (*profiles.Catalog, error) {
	cat := profiles.Builtin()
	if dir == "" {
		return cat, nil
	}
	if err := cat.LoadDir(dir); err != nil {
		return nil, err
	}
	return cat, nil
}
