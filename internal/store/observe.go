package store

import (
	"context"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Observe calls done with the duration of every Redis round trip the
// client makes: each command by its name (lower case; scripts as
// evalsha), each pipeline as "pipeline". For the Redis latency metric.
func (s *Store) Observe(done func(command string, d time.Duration)) {
	s.Client.AddHook(timing{done: done})
}

type timing struct {
	done func(command string, d time.Duration)
}

func (timing) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (t timing) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		t.done(strings.ToLower(cmd.Name()), time.Since(start))
		return err
	}
}

func (t timing) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		t.done("pipeline", time.Since(start))
		return err
	}
}
