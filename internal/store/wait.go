package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequestWait is how long one request waits on a Redis that does not
// answer before giving up: the HTTP API marks every request with it (see
// WithRequestWait), so a frozen or unreachable Redis is answered 503
// within it on every route, however many commands the route makes.
const RequestWait = 3 * time.Second

// errGaveUp is the error of a command not sent because the request has
// already waited RequestWait on a Redis that did not answer.
var errGaveUp = fmt.Errorf("%w: this request already waited its limit on Redis", ErrUnavailable)

type waitKey struct{}

// requestWait is the state WithRequestWait puts in a request's context.
type requestWait struct {
	limit time.Duration
	ended atomic.Bool  // the request was answered: work it started runs unbounded
	spent atomic.Int64 // nanoseconds waited without an answer since Redis last answered
}

// WithRequestWait marks ctx as one request's: from then on the request
// waits on a Redis that does not answer for at most limit in all. Each
// command (or pipeline) may take what is left of limit, plus the BLOCK
// time of a blocking stream read, however go-redis retries, redirects or
// redials it; the time a command spent before failing for want of Redis
// (a timeout, a refused dial, CLUSTERDOWN…) is used up, and any answer
// from Redis gives the request its whole limit back. So:
//
//   - a frozen Redis is given up on within limit, however many commands
//     the route would have made (the first takes all of it, the rest fail
//     at once);
//   - a cluster node that refuses while the others answer costs only the
//     time it took to refuse: the request's clean-up (releasing a lock on
//     a node that is up) still runs;
//   - a request that finds Redis well may last as long as its work does
//     (a wait, an event stream), since time not spent waiting on Redis is
//     never counted.
//
// end lifts the mark; call it when the request has been answered, so that
// work the request started with its context and that outlives it (a
// trigger runner, a goroutine with context.WithoutCancel) is not bound by
// it.
func WithRequestWait(ctx context.Context, limit time.Duration) (_ context.Context, end func()) {
	w := &requestWait{limit: limit}
	return context.WithValue(ctx, waitKey{}, w), func() { w.ended.Store(true) }
}

// waitOf is the mark ctx carries, or nil when it carries none or its
// request has ended.
func waitOf(ctx context.Context) *requestWait {
	w, _ := ctx.Value(waitKey{}).(*requestWait)
	if w == nil || w.ended.Load() {
		return nil
	}
	return w
}

// left is what remains of the request's limit.
func (w *requestWait) left() time.Duration {
	return w.limit - time.Duration(w.spent.Load())
}

// note accounts for a command that took d and ended with err.
func (w *requestWait) note(err error, d time.Duration) {
	switch {
	case Unavailable(err):
		w.spent.Add(int64(d))
	case err == nil || !errors.Is(err, context.Canceled):
		// Redis answered (a value, nil, or an error reply of its own).
		w.spent.Store(0)
	}
}

// waitHook applies WithRequestWait's mark to each command and pipeline.
// It is the outermost hook of the client, so its deadline covers every
// retry, redirect and dial go-redis makes for the command.
type waitHook struct{}

func (waitHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (waitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		w := waitOf(ctx)
		if w == nil {
			return next(ctx, cmd)
		}
		left := w.left()
		if left <= 0 {
			cmd.SetErr(errGaveUp)
			return errGaveUp
		}
		ctx, cancel := context.WithTimeout(ctx, left+blockOf(cmd))
		defer cancel()
		start := time.Now()
		err := next(ctx, cmd)
		w.note(err, time.Since(start))
		return err
	}
}

func (waitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		w := waitOf(ctx)
		if w == nil {
			return next(ctx, cmds)
		}
		left := w.left()
		if left <= 0 {
			for _, cmd := range cmds {
				cmd.SetErr(errGaveUp)
			}
			return errGaveUp
		}
		ctx, cancel := context.WithTimeout(ctx, left)
		defer cancel()
		start := time.Now()
		err := next(ctx, cmds)
		w.note(err, time.Since(start))
		return err
	}
}

// blockOf is the BLOCK time of an XREAD or XREADGROUP (the blocking reads
// patchbay makes), which the server may take before answering; 0 for
// anything else.
func blockOf(cmd redis.Cmder) time.Duration {
	switch cmd.Name() {
	case "xread", "xreadgroup":
	default:
		return 0
	}
	args := cmd.Args()
	for i := 1; i+1 < len(args); i++ {
		if s, ok := args[i].(string); ok && strings.EqualFold(s, "block") {
			if ms, ok := args[i+1].(int64); ok && ms > 0 {
				return time.Duration(ms) * time.Millisecond
			}
			return 0
		}
	}
	return 0
}
