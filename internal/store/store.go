// Package store owns patchbay's connection to Redis: one go-redis
// UniversalClient (a single server, Redis Cluster or Sentinel) or, when no
// URL is configured, an embedded in-memory miniredis; the key prefix every
// key carries; the durability check done at start; and, later, the Lua
// scripts that several packages share.
//
// Callers build keys with Key so that every key carries the prefix. Keys
// that one script touches together must share a hash tag ({exec:ID}) so the
// script works on Redis Cluster; Key does not add one, the caller chooses
// which part is the tag.
//
// # URLs
//
//	redis://[user:password@]host:port[/db][?option=value…]
//	rediss://…                        the same over TLS
//	unix://[user:password@]/path/to/redis.sock[?db=N]
//	redis+cluster://[user:password@]host1:port1,host2:port2[?addr=host3:port3…]
//	rediss+cluster://…                the same over TLS
//	redis+sentinel://[user:password@]host1:26379,host2:26379/mastername[?db=N]
//	rediss+sentinel://…               the same over TLS
//
// Cluster seeds may be given either comma-separated in the host part or as
// repeated addr= query parameters (the form go-redis documents for
// ParseClusterURL); both may be mixed. A host without a port gets 6379
// (26379 for sentinels). A cluster URL has no database path.
//
// For Sentinel, user and password are those of the master and replicas
// (what the application talks to); sentinels that need their own password
// take sentinel_username= and sentinel_password= query parameters. Other
// query parameters are the go-redis options (dial_timeout, pool_size, …).
//
// Passwords never appear in a log line or an error: URLs are shown with the
// password replaced by "xxxxx".
//
// # Client options
//
// Every client gets these go-redis options unless the URL sets the same
// option as a query parameter (options.go):
//
//   - DialTimeout 2 s (go-redis: 5 s). Reaching Redis takes milliseconds;
//     a host that is gone (SYNs dropped) must fail within the request
//     wait below, not eat it.
//   - DialerRetries 1 (go-redis: 5, 100 ms apart). A refused dial is
//     answered at once; the command-level retries below retry it, and on
//     a cluster the slot map is reloaded between them, which a retry
//     inside the dial would only delay.
//   - ReadTimeout and WriteTimeout 3 s (go-redis: 5 s), PoolTimeout 3 s
//     (go-redis: ReadTimeout + 1 s). patchbay's commands and scripts are
//     small; this bounds background work (workers, sweeps) on a frozen
//     server. Requests are bounded more tightly by the request wait.
//   - MinRetryBackoff 10 ms, MaxRetryBackoff 250 ms (go-redis: 10 ms–1 s):
//     the retries of one command all fit in the request wait, and come
//     often enough to find a promoted replica soon after its promotion.
//   - MaxRetries stays go-redis's (3 on a single server or through
//     Sentinel; none on a cluster, whose client retries through
//     MaxRedirects instead). MaxRedirects 5 (go-redis: 3): a command may
//     meet a refused dial, CLUSTERDOWN and a MOVED in one failover.
//   - ReadOnly, RouteRandomly and RouteByLatency stay off: every read goes
//     to the master, because patchbay reads what it has just written (a
//     submission, then its GET; a claim, then the run) and replicas lag.
//   - ContextTimeoutEnabled is always on (the URL cannot turn it off):
//     without it a context's deadline does not reach the socket, and the
//     request wait could not cut a read from a frozen server short.
//
// # Failover
//
// Redis Cluster: go-redis reloads its slot map on MOVED, ASK and READONLY
// and otherwise once a minute, so after a master dies it would keep
// dialing the dead address for up to a minute after the cluster promoted
// a replica. A hook on every node (refreshOnFailure) asks for a reload
// whenever a command fails for want of Redis (refused or dropped
// connection, timeout, CLUSTERDOWN, TRYAGAIN…); go-redis coalesces the
// reloads (one at a time, 200 ms apart). While the cluster has not yet
// promoted anyone the reload finds the same map and requests answer 503;
// the first reload after the promotion finds the new master.
//
// Sentinel: the go-redis failover client asks the sentinels for the
// master's address on every new connection and drops its connections to
// the old master on +switch-master, so it follows a failover by itself;
// after a run of failed dials its pool refuses at once until a probe
// (once a second) connects, which is up to a second more.
//
// # Request wait
//
// WithRequestWait (wait.go) marks a request's context: the request then
// waits on a Redis that does not answer for RequestWait in all, however
// many commands it makes and however go-redis retries them. The HTTP API
// marks every request. Work outside requests (workers, sweeps, triggers)
// is bounded by the client options alone.
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// PingTimeout bounds the connection check Open makes, so a wrong address
// fails start-up instead of hanging it.
const PingTimeout = 5 * time.Second

// ErrInvalidURL is wrapped by Open's error for a URL it cannot use.
var ErrInvalidURL = errors.New("invalid Redis URL")

// Store is patchbay's handle on Redis.
type Store struct {
	// Client is the go-redis client; a *redis.Client, *redis.ClusterClient
	// or sentinel-backed *redis.Client depending on the URL.
	Client redis.UniversalClient
	// Prefix starts every key (PATCHBAY_REDIS_PREFIX), so tests and
	// tenants can share one server.
	Prefix string

	url      string // redacted, for messages
	embedded *miniredis.Miniredis

	closeOnce sync.Once
	closeErr  error
}

// Open connects to the Redis at url, or starts an embedded in-memory one
// when url is empty, and checks that it answers within PingTimeout. On a
// real server it also checks durability settings and logs each finding as
// a warning. A nil logger means slog.Default().
func Open(ctx context.Context, url, prefix string, logger *slog.Logger) (*Store, error) {
	if logger == nil {
		logger = slog.Default()
	}
	if url == "" {
		return openEmbedded(prefix, logger)
	}

	safe := RedactURL(url)
	t, err := parseURL(url)
	if err != nil {
		return nil, fmt.Errorf("store: %w %s: %s", ErrInvalidURL, safe, scrub(err.Error(), url))
	}
	s := &Store{Client: t.newClient(), Prefix: prefix, url: safe}
	s.Client.AddHook(waitHook{})

	pctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	if err := s.Ping(pctx); err != nil {
		_ = s.Client.Close()
		if msg := err.Error(); scrub(msg, url) != msg {
			// Never let a password through, even at the cost of the
			// error chain.
			return nil, fmt.Errorf("store: cannot reach Redis at %s: %s", safe, scrub(msg, url))
		}
		return nil, fmt.Errorf("store: cannot reach Redis at %s: %w", safe, err)
	}
	for _, w := range s.CheckDurability(pctx) {
		logger.Warn("store: "+w, "redis", safe)
	}
	logger.Info("store: connected to Redis", "redis", safe, "mode", t.mode, "prefix", prefix)
	return s, nil
}

func openEmbedded(prefix string, logger *slog.Logger) (*Store, error) {
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("store: start embedded Redis: %w", err)
	}
	s := &Store{
		Client:   redis.NewClient(&redis.Options{Addr: mr.Addr()}),
		Prefix:   prefix,
		url:      "embedded",
		embedded: mr,
	}
	s.Client.AddHook(waitHook{})
	logger.Warn("store: REDIS_URL is not set, using the embedded in-memory store: everything is kept in memory and nothing survives a restart")
	return s, nil
}

// Key returns the prefix followed by parts joined with ":".
// Key("exec", id) is "pb:exec:<id>" with the default prefix.
func (s *Store) Key(parts ...string) string {
	return s.Prefix + strings.Join(parts, ":")
}

// Embedded reports whether the store is the in-memory one started by Open.
func (s *Store) Embedded() bool { return s.embedded != nil }

// Miniredis is the embedded server, or nil on a real Redis. Tests use it to
// move time forward (FastForward) for TTLs; nothing in production should.
func (s *Store) Miniredis() *miniredis.Miniredis { return s.embedded }

// URL is the address of the store with any password removed, for logs and
// status pages; "embedded" for the in-memory one.
func (s *Store) URL() string { return s.url }

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	return s.Client.Ping(ctx).Err()
}

// Close closes the client and, for the embedded store, the server. It may
// be called more than once; later calls return the first call's result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closeErr = s.Client.Close()
		if s.embedded != nil {
			s.embedded.Close()
		}
	})
	return s.closeErr
}

// CheckDurability returns a warning for each setting that puts durable
// state at risk: maxmemory-policy other than noeviction (Redis may evict
// executions, ledgers and leases) and appendonly other than yes (writes
// since the last snapshot are lost on a restart). A server where CONFIG is
// disabled (common on managed Redis) yields a warning that the settings
// could not be checked. On Redis Cluster every master is checked. The
// embedded store returns nil: Open has already said it keeps nothing.
func (s *Store) CheckDurability(ctx context.Context) []string {
	if s.Embedded() {
		return nil
	}
	if cc, ok := s.Client.(*redis.ClusterClient); ok {
		var (
			mu    sync.Mutex
			warns []string
		)
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			w := checkNode(ctx, c, " on "+c.Options().Addr)
			mu.Lock()
			warns = append(warns, w...)
			mu.Unlock()
			return nil
		})
		if err != nil {
			warns = append(warns, fmt.Sprintf("could not check the durability settings of every cluster master (%v); make sure each has maxmemory-policy noeviction and appendonly yes", err))
		}
		return warns
	}
	return checkNode(ctx, s.Client, "")
}

func checkNode(ctx context.Context, c redis.Cmdable, where string) []string {
	var warns []string
	check := func(param, want, risk string) {
		vals, err := c.ConfigGet(ctx, param).Result()
		got, ok := vals[param]
		switch {
		case err != nil:
			warns = append(warns, fmt.Sprintf("could not check Redis %s%s (CONFIG GET failed: %v); make sure it is %s, or %s", param, where, err, want, risk))
		case !ok:
			warns = append(warns, fmt.Sprintf("could not check Redis %s%s (CONFIG GET returned nothing); make sure it is %s, or %s", param, where, want, risk))
		case !strings.EqualFold(got, want):
			warns = append(warns, fmt.Sprintf("Redis %s%s is %q, not %s: %s", param, where, got, want, risk))
		}
	}
	check("maxmemory-policy", "noeviction", "Redis may evict patchbay's state (executions, ledgers, leases) under memory pressure")
	check("appendonly", "yes", "writes since the last snapshot are lost when Redis restarts")
	return warns
}
