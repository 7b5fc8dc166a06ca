package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// wire is the http.RoundTripper under every HTTP transport of one
// connection. mcp-go's transports hide status codes and read bodies without
// a bound, so wire adds what the provider needs on the wire:
//
//   - a bound on every POST response body (maxResponseBytes), failing the
//     read with ErrResponseTooLarge and marking the call's slot;
//   - while connecting, the first failure that must not cause a protocol
//     fallback (401, 403, 5xx, or no answer at all), so connect can refuse
//     to downgrade on it;
//   - request headers for the current call (the tenant's credentials).
type wire struct {
	base  http.RoundTripper
	limit int64

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
	if req.Method == http.MethodPost {
		s, _ := req.Context().Value(slotKey{}).(*slot)
		resp.Body = &limitedBody{rc: resp.Body, left: w.limit, limit: w.limit, slot: s}
	}
	return resp, nil
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
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// Probe for one more byte: a body of exactly limit bytes is fine.
		var one [1]byte
		n, err := b.rc.Read(one[:])
		if n == 0 {
			return 0, err
		}
		b.slot.markTooLarge()
		return 0, fmt.Errorf("%w: the response exceeded the %d-byte limit (maxResponseBytes)", ErrResponseTooLarge, b.limit)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
