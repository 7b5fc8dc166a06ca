package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

func TestUnavailable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"key missing", redis.Nil, false},
		{"wrapped key missing", fmt.Errorf("load: %w", redis.Nil), false},
		{"wrong type", redis.Error(proto("WRONGTYPE Operation against a key holding the wrong kind of value")), false},
		{"cancelled by the caller", context.Canceled, false},
		{"deadline waiting for an answer", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"plain error", errors.New("boom"), false},
		{"sentinel", fmt.Errorf("x: %w", ErrUnavailable), true},
		{"client closed", fmt.Errorf("submit: %w", redis.ErrClosed), true},
		{"pool timeout", fmt.Errorf("submit: %w", redis.ErrPoolTimeout), true},
		{"eof", fmt.Errorf("submit: %w", io.EOF), true},
		{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}, true},
		{"loading", fmt.Errorf("x: %w", redis.Error(proto("LOADING Redis is loading the dataset in memory"))), true},
		{"readonly", redis.Error(proto("READONLY You can't write against a read only replica.")), true},
		{"clusterdown", redis.Error(proto("CLUSTERDOWN The cluster is down")), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Unavailable(tc.err); got != tc.want {
				t.Errorf("Unavailable(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// proto is a Redis error reply as go-redis returns it.
type proto string

func (p proto) Error() string { return string(p) }
func (proto) RedisError()     {}

// TestUnavailableFromClient checks the errors a real client returns when
// the server is gone, not just the ones the table above spells out.
func TestUnavailableFromClient(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr(), DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	mr.Close()
	err := c.Set(t.Context(), "k", "v", 0).Err()
	if err == nil || !Unavailable(err) {
		t.Errorf("after the server closed: err = %v, Unavailable = %v", err, Unavailable(err))
	}
	_ = c.Close()
	if err := c.Get(t.Context(), "k").Err(); !Unavailable(err) {
		t.Errorf("closed client: err = %v, Unavailable = false", err)
	}
}
