// Package eventstream serves an execution's event stream as Server-Sent
// Events, for the JSON API (GET /v1/executions/{id}/events) and the admin
// UI's live pages, and bounds how many streams are open at once: per
// principal and per process. One Streams is shared by the API and the
// UI, so the streams a principal opens on either count together; past a
// cap a stream is refused with a *LimitError, which the API answers 429
// TOO_MANY_STREAMS and the UI 429, both with Retry-After.
//
// A stream holds no Redis connection while it waits. It follows the
// execution with a harness.EventFeed: every event written is announced on
// a channel, the process's one shared subscription hears it, and the feed
// reads what is new without blocking. Of the two ways to keep waiting
// streams out of the Redis pool — that fan-out, or a small pool of
// connections kept for blocking XREADs — the fan-out was chosen: a
// dedicated pool needs a connection per open stream, or makes streams
// queue for one and delays their events, and is one more thing to size;
// the subscription costs one connection per process however many streams
// are open, and works unchanged on Redis Cluster (each read names one
// stream, so no command spans hash slots; the announcements are plain
// PUBLISH, which the cluster carries to every node).
//
// The caps are counted per process, in memory: they bound what one
// replica spends on streams (goroutines, sockets, buffers), which is what
// a client can exhaust. Behind a load balancer with N replicas a
// principal may hold up to N times its cap in all.
package eventstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
)

// Defaults of Options.
const (
	// DefaultPerPrincipal leaves room for a dashboard watching a few
	// dozen executions, and lets at least 16 principals reach their cap
	// before the process's is reached.
	DefaultPerPrincipal = 32
	// DefaultTotal is half the default connection cap (1024), so that
	// streams can never take every connection the server accepts.
	DefaultTotal = 512
	// DefaultHeartbeat keeps idle streams open through proxies that close
	// quiet connections (commonly after 30–60 s).
	DefaultHeartbeat = 15 * time.Second
)

// RetryAfter is what a refused client is told to wait: streams end when
// their execution finishes or their client leaves, which a few seconds
// may see.
const RetryAfter = 5 * time.Second

// Options tune Streams; zero fields take the defaults.
type Options struct {
	// PerPrincipal caps the streams one principal (an API key's name, a
	// UI session's subject) holds open in this process.
	PerPrincipal int
	// Total caps the streams open in this process, all principals
	// together.
	Total int
	// Heartbeat is how long a stream waits for an event before it sends
	// a keep-alive comment (and checks that the execution still runs).
	Heartbeat time.Duration
}

// Streams serves event streams and counts the open ones. It is safe for
// concurrent use.
type Streams struct {
	execs *harness.Executions
	o     Options

	mu    sync.Mutex
	open  map[string]int // per principal; no entry for none
	total int
}

// New returns Streams over execs; o may be nil for the defaults.
func New(execs *harness.Executions, o *Options) *Streams {
	var opts Options
	if o != nil {
		opts = *o
	}
	if opts.PerPrincipal <= 0 {
		opts.PerPrincipal = DefaultPerPrincipal
	}
	if opts.Total <= 0 {
		opts.Total = DefaultTotal
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	return &Streams{execs: execs, o: opts, open: map[string]int{}}
}

// ErrTooManyStreams is matched by every *LimitError.
var ErrTooManyStreams = errors.New("too many event streams open")

// LimitError is a stream refused because a cap is reached.
type LimitError struct {
	// PerPrincipal is true when the principal's own cap was reached,
	// false when the process's was.
	PerPrincipal bool
	Limit        int
}

func (e *LimitError) Error() string {
	if e.PerPrincipal {
		return fmt.Sprintf("you have %d event streams open on this server, as many as one caller may; close one, or retry later", e.Limit)
	}
	return fmt.Sprintf("the server has %d event streams open, as many as it allows; retry later", e.Limit)
}

func (e *LimitError) Is(target error) bool { return target == ErrTooManyStreams }

// Hold counts one open stream of principal until release is called (once;
// later calls do nothing). Past a cap it returns a *LimitError and counts
// nothing. Serve holds its own; a handler that streams something else (the
// UI's live approvals) holds one around it.
func (s *Streams) Hold(principal string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.open[principal] >= s.o.PerPrincipal:
		return nil, &LimitError{PerPrincipal: true, Limit: s.o.PerPrincipal}
	case s.total >= s.o.Total:
		return nil, &LimitError{Limit: s.o.Total}
	}
	s.open[principal]++
	s.total++
	return sync.OnceFunc(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.open[principal]--; s.open[principal] <= 0 {
			delete(s.open, principal)
		}
		s.total--
	}), nil
}

// Open reports how many streams principal holds and how many are open in
// all.
func (s *Streams) Open(principal string) (mine, total int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open[principal], s.total
}

// Format is how a stream writes its messages: the API and the UI speak
// different event names.
type Format struct {
	// Event writes one event.
	Event func(w io.Writer, ev harness.Event) error
	// End, when set, writes the stream's last message once the execution
	// has finished: after its execution.finished event (last), or at once
	// when the client resumed after it (last is nil).
	End func(w io.Writer, last *harness.Event) error
}

// Serve relays exec's events after `after` ("" for all) to w as
// Server-Sent Events, as principal, until the execution finishes, the
// client leaves or Redis fails (the client reconnects with Last-Event-ID
// and misses nothing). The caller has checked that principal may see
// exec.
//
// Errors come before anything is written, for the caller to answer: a
// *LimitError, fault.ErrNotFound, harness.ErrInvalidEventID, or a store
// failure. Once the stream has started Serve returns nil.
func (s *Streams) Serve(ctx context.Context, w http.ResponseWriter, principal, exec, after string, f Format) error {
	release, err := s.Hold(principal)
	if err != nil {
		return err
	}
	defer release()
	feed, err := s.execs.Follow(ctx, exec, after)
	if err != nil {
		return err
	}
	defer feed.Close()
	Start(w)
	s.relay(ctx, w, feed, f)
	return nil
}

// Start writes the headers of an event stream and flushes them.
func Start(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: pass each message on at once
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
}

// relay writes the feed's events until the stream ends. The first read
// does not wait, so a client resuming after the end is answered at once.
func (s *Streams) relay(ctx context.Context, w http.ResponseWriter, feed *harness.EventFeed, f Format) {
	rc := http.NewResponseController(w)
	var wait time.Duration
	for {
		evs, err := feed.Next(ctx, wait)
		if err != nil {
			return
		}
		if len(evs) == 0 {
			// Nothing new for a while: the client may have resumed after
			// the end, or the execution expired.
			ended, err := feed.Ended(ctx)
			if err != nil {
				return
			}
			if ended {
				// The finished event is written with the final status, so
				// one more read has it if it came after the read above.
				if evs, err = feed.Next(ctx, 0); err != nil {
					return
				}
				if len(evs) == 0 {
					s.end(w, rc, f, nil)
					return
				}
			}
		}
		for i, ev := range evs {
			if f.Event(w, ev) != nil {
				return
			}
			if ev.Type == harness.EventFinished {
				s.end(w, rc, f, &evs[i])
				return
			}
		}
		if len(evs) == 0 {
			if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil {
				return
			}
		}
		if rc.Flush() != nil {
			return
		}
		wait = s.o.Heartbeat
	}
}

func (s *Streams) end(w io.Writer, rc *http.ResponseController, f Format, last *harness.Event) {
	if f.End != nil {
		_ = f.End(w, last)
	}
	_ = rc.Flush()
}
