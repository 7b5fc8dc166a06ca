package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// wire is the http.RoundTripper under the HTTP transport of one
// session. mcp-go's transports hide status codes and read bodies without
// a bound, so wire adds what the provider needs on the wire:
//
//   - a bound on every POST response body (maxResponseBytes), failing the
//     read with ErrResponseTooLarge and marking the call's slot;
//   - a bound on each event of a GET event stream (the legacy HTTP+SSE
//     stream, or a 2025 session's listening stream), which is open for the
//     life of the session, so only one event, not the whole body, can be
//     bounded: an event past maxResponseBytes fails the read and is
//     reported to fault, which ends the session;
//   - what became of a request's SSE response stream (see streamWatch), so
//     capture can tell a broken 2026-07-28 stream from other failures;
//   - while connecting, the first failure that must not cause a protocol
//     fallback (401, 403, 5xx, or no answer at all), so connect can refuse
//     to downgrade on it.
//
// Each session (the connection's own and every tenant's) has its own wire.
type wire struct {
	base  http.RoundTripper
	limit int64
	// fault is told once when an event stream sends an oversized event.
	fault func(error)

	mu         sync.Mutex
	connecting bool
	fatal      error
}

// Errors of the HTTP wire.
var (
	// ErrHTTPStatus is an HTTP answer that fails the connection: 401, 403
	// or a 5xx. It never triggers a fallback to an older protocol.
	ErrHTTPStatus = errors.New("http status")
)

// StatusError is an HTTP answer that fails the connection.
type StatusError struct{ Status int }

func (e *StatusError) Error() string {
	return fmt.Sprintf("server answered HTTP %d %s", e.Status, http.StatusText(e.Status))
}

// Unwrap matches ErrHTTPStatus.
func (e *StatusError) Unwrap() error { return ErrHTTPStatus }

// slot is per-call state the wire can see through the request context.
type slot struct {
	tooLarge bool
	mu       sync.Mutex

	// ask answers the call's questions (nil: none), under callCtx (the
	// call's context, not the one mcp-go gives an elicitation handler);
	// timeout is the call's requestTimeoutMs, paused while one waits.
	ask     connect.Asker
	callCtx context.Context
	timeout *pausable
	// park: the call's questions asked in its answer are parked on, not
	// asked (connect.CallRequest.Park); round is that answer.
	park  bool
	round *inputRound
	// resumeWith answers a parked call's questions on its first send.
	resumeWith *connect.InputResume
}

func (s *slot) input() *inputRound {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.round
}

func (s *slot) pause() {
	if s.timeout != nil {
		s.timeout.pause()
	}
}

func (s *slot) resume() {
	if s.timeout != nil {
		s.timeout.resume()
	}
}

type slotKey struct{}

func withSlot(ctx context.Context) (context.Context, *slot) {
	s := &slot{}
	return context.WithValue(ctx, slotKey{}, s), s
}

func (s *slot) markTooLarge() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.tooLarge = true
	s.mu.Unlock()
}

func (s *slot) isTooLarge() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tooLarge
}

func (w *wire) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := w.base.RoundTrip(req)
	if err != nil {
		if req.Context().Err() == nil {
			w.noteFatal(fmt.Errorf("network: %w", err))
		}
		return nil, err
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden || resp.StatusCode >= 500 {
		w.noteFatal(&StatusError{Status: resp.StatusCode})
	}
	stream := isEventStream(resp)
	switch req.Method {
	case http.MethodPost:
		if stream && isLongStream(req.Context()) {
			// An events/stream response lives as long as its subscription:
			// each event is bounded, and an oversized one ends only that
			// stream (no fault).
			resp.Body = &eventLimit{rc: resp.Body, limit: w.limit}
			break
		}
		s, _ := req.Context().Value(slotKey{}).(*slot)
		var watch *streamWatch
		if stream {
			watch, _ = req.Context().Value(streamKey{}).(*streamWatch)
			watch.begin()
		}
		resp.Body = &limitedBody{rc: resp.Body, left: w.limit, limit: w.limit, slot: s, watch: watch}
	case http.MethodGet:
		if stream && resp.StatusCode == http.StatusOK {
			resp.Body = &eventLimit{rc: resp.Body, limit: w.limit, fault: w.fault}
		}
	}
	return resp, nil
}

func isEventStream(resp *http.Response) bool {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mt == "text/event-stream"
}

func (w *wire) noteFatal(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.connecting && w.fatal == nil {
		w.fatal = err
	}
}

// startConnect begins recording fatal failures; endConnect stops and
// returns the first one.
func (w *wire) startConnect() {
	w.mu.Lock()
	w.connecting, w.fatal = true, nil
	w.mu.Unlock()
}

func (w *wire) fatalErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fatal
}

func (w *wire) endConnect() {
	w.mu.Lock()
	w.connecting = false
	w.mu.Unlock()
}

// limitedBody fails a read past limit bytes.
type limitedBody struct {
	rc    io.ReadCloser
	left  int64
	limit int64
	slot  *slot
	watch *streamWatch // nil unless an SSE response to a watched request
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// Probe for one more byte: a body of exactly limit bytes is fine.
		var one [1]byte
		n, err := b.rc.Read(one[:])
		if n == 0 {
			b.watch.end(err)
			return 0, err
		}
		b.slot.markTooLarge()
		b.watch.tooLarge()
		return 0, fmt.Errorf("%w: the response exceeded the %d-byte limit (maxResponseBytes)", ErrResponseTooLarge, b.limit)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	if err != nil {
		b.watch.end(err)
	}
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }

// streamWatch is what the wire saw of one attempt at a request: whether its
// response was an SSE stream, and whether that stream ended (EOF) or broke
// (a read error) under the reader. mcp-go reports both, when the response
// had not arrived yet, as an error that does not say which; capture uses
// the watch to re-issue such a request on a 2026-07-28 connection.
type streamWatch struct {
	mu      sync.Mutex
	sse     bool
	ended   bool
	toolong bool
}

type streamKey struct{}

func withStreamWatch(ctx context.Context) (context.Context, *streamWatch) {
	w := &streamWatch{}
	return context.WithValue(ctx, streamKey{}, w), w
}

func (w *streamWatch) begin() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.sse = true
	w.mu.Unlock()
}

func (w *streamWatch) end(error) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.ended = true
	w.mu.Unlock()
}

func (w *streamWatch) tooLarge() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.toolong = true
	w.mu.Unlock()
}

// broken reports whether the response was an SSE stream that ended or
// broke off, for a reason other than the size limit.
func (w *streamWatch) broken() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sse && w.ended && !w.toolong
}

// eventLimit bounds each event of a long-lived SSE body: the bytes of one
// event (up to the blank line that ends it, line terminators aside) may not
// exceed limit. mcp-go reads such a stream line by line with an unbounded
// ReadString, so without this a server could grow one event, or one line,
// until memory runs out. The first breach fails this read and every later
// one, and is reported to fault.
type eventLimit struct {
	rc    io.ReadCloser
	limit int64
	fault func(error)

	event  int64 // bytes of the current event
	line   int64 // bytes of the current line
	prevCR bool
	err    error
}

func (e *eventLimit) Read(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.rc.Read(p)
	for i, c := range p[:n] {
		switch {
		case c == '\n' && e.prevCR:
			e.prevCR = false // the LF of a CRLF
		case c == '\n' || c == '\r':
			e.prevCR = c == '\r'
			if e.line == 0 {
				e.event = 0 // a blank line ends the event
			}
			e.line = 0
		default:
			e.prevCR = false
			e.line++
			e.event++
			if e.event > e.limit {
				e.err = fmt.Errorf("%w: an event on the server's event stream exceeded the %d-byte limit (maxResponseBytes)", ErrResponseTooLarge, e.limit)
				if e.fault != nil {
					e.fault(e.err)
				}
				// Hand over what came before the breach: it holds no
				// complete event, and the next read fails.
				return i, e.err
			}
		}
	}
	return n, err
}

func (e *eventLimit) Close() error { return e.rc.Close() }
