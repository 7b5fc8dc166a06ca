package store

import (
	"context"
	"net"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"
)

// The go-redis options patchbay sets on every client, unless the URL gives
// the same option as a query parameter (see the package doc for why each).
const (
	dialTimeout     = 2 * time.Second
	ioTimeout       = 3 * time.Second // ReadTimeout and WriteTimeout
	poolTimeout     = 3 * time.Second
	dialerRetries   = 1
	minRetryBackoff = 10 * time.Millisecond
	maxRetryBackoff = 250 * time.Millisecond
	maxRedirects    = 5
)

// knobs points at the fields the three go-redis option structs share, so
// one function sets them all.
type knobs struct {
	dialTimeout, readTimeout, writeTimeout, poolTimeout *time.Duration
	minRetryBackoff, maxRetryBackoff                    *time.Duration
	dialerRetries                                       *int
	contextTimeoutEnabled                               *bool
}

// apply sets patchbay's choice of each option the query does not give.
// ContextTimeoutEnabled is always on: without it a context's deadline
// does not reach the socket, and the request wait (see wait.go) would not
// bound a read from a frozen server.
func (k knobs) apply(query url.Values) {
	durations := []struct {
		param string
		field *time.Duration
		value time.Duration
	}{
		{"dial_timeout", k.dialTimeout, dialTimeout},
		{"read_timeout", k.readTimeout, ioTimeout},
		{"write_timeout", k.writeTimeout, ioTimeout},
		{"pool_timeout", k.poolTimeout, poolTimeout},
		{"min_retry_backoff", k.minRetryBackoff, minRetryBackoff},
		{"max_retry_backoff", k.maxRetryBackoff, maxRetryBackoff},
	}
	for _, d := range durations {
		if !query.Has(d.param) {
			*d.field = d.value
		}
	}
	if !query.Has("dialer_retries") {
		*k.dialerRetries = dialerRetries
	}
	*k.contextTimeoutEnabled = true
}

func tuneSingle(o *redis.Options, query url.Values) {
	knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.MinRetryBackoff, &o.MaxRetryBackoff,
		&o.DialerRetries, &o.ContextTimeoutEnabled}.apply(query)
}

func tuneSentinel(o *redis.FailoverOptions, query url.Values) {
	knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.MinRetryBackoff, &o.MaxRetryBackoff,
		&o.DialerRetries, &o.ContextTimeoutEnabled}.apply(query)
}

func tuneCluster(o *redis.ClusterOptions, query url.Values) {
	knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.MinRetryBackoff, &o.MaxRetryBackoff,
		&o.DialerRetries, &o.ContextTimeoutEnabled}.apply(query)
	if !query.Has("max_redirects") {
		o.MaxRedirects = maxRedirects
	}
}

// refreshOnFailure is a hook on each node of a cluster client: when a
// command fails in a way a failover explains (the node refuses or drops
// connections, times out, or answers CLUSTERDOWN, TRYAGAIN or READONLY),
// it asks the client to reload its slot map. go-redis reloads by itself
// only on MOVED, ASK and READONLY; after a master dies it would keep
// dialing the dead address until its periodic reload (every 60 s), long
// after the cluster promoted a replica. Reloads are coalesced by go-redis
// (one at a time, at most one every 200 ms), so a burst of failures costs
// a few CLUSTER SLOTS, not one each.
type refreshOnFailure struct {
	reload func()
}

// watchCluster installs refreshOnFailure on every node cc creates. It is
// called before cc makes its first node.
func watchCluster(cc *redis.ClusterClient) {
	h := refreshOnFailure{reload: func() { cc.ReloadState(context.Background()) }}
	cc.OnNewNode(func(node *redis.Client) { node.AddHook(h) })
}

func (refreshOnFailure) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h refreshOnFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.check(cmd, err)
		return err
	}
}

func (h refreshOnFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil {
			for _, cmd := range cmds {
				if cmd.Err() != nil {
					err = cmd.Err()
					break
				}
			}
		}
		if len(cmds) > 0 {
			h.check(cmds[0], err)
		}
		return err
	}
}

func (h refreshOnFailure) check(cmd redis.Cmder, err error) {
	// The reload's own CLUSTER SLOTS failing on the dead node must not
	// ask for another reload: the reload tries the next node itself.
	if err != nil && cmd.Name() != "cluster" && Unavailable(err) {
		h.reload()
	}
}
