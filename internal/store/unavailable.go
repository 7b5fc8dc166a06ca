package store

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// ErrUnavailable marks an error as Redis being out of reach for now. Code
// that classifies a failure itself (a script that ran out of retries) may
// wrap it; most callers ask Unavailable instead.
var ErrUnavailable = errors.New("store unavailable")

// transientReplies are the prefixes of the error replies a Redis server
// gives while it cannot serve yet but will: loading its data after a
// restart, a replica that was a master a moment ago, a cluster or sentinel
// electing a new master, a script blocking the server.
var transientReplies = []string{"LOADING ", "READONLY ", "MASTERDOWN ", "CLUSTERDOWN ", "TRYAGAIN ", "BUSY "}

// Unavailable reports whether err means Redis could not be reached or could
// not serve for now (connection refused or reset, a dial or read timeout,
// a closed connection, an exhausted pool, a server still loading), so the
// same request may succeed when retried. The API answers such errors with
// 503 and Retry-After; everything else stays an internal error.
//
// It looks at the error chain, so it works on errors wrapped with %w at
// any depth. A context the caller cancelled is not unavailability.
func Unavailable(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, redis.ErrClosed) || errors.Is(err, redis.ErrPoolTimeout) ||
		errors.Is(err, redis.ErrPoolExhausted) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	// A dial that failed or timed out, a read that timed out: go-redis
	// returns the net package's errors as they are. A context deadline
	// (a net.Error too) that ran out while waiting for Redis counts: the
	// server did not answer in time.
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	var re redis.Error
	if errors.As(err, &re) {
		msg := strings.TrimPrefix(re.Error(), "ERR ")
		for _, p := range transientReplies {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}
