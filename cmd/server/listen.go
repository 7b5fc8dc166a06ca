package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/netutil"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/throttle"
)

// listen opens the server's socket with at most l.MaxConns client
// connections open at once. Past the cap, new connections wait in the
// kernel's listen backlog until one closes, rather than each taking a
// goroutine and buffers: a flood of idle sockets cannot exhaust memory or
// file descriptors.
//
// Within the cap, one client address (an IPv6 client's /64) may hold at
// most l.MaxConnsPerAddress; its further connections are closed as soon
// as they are accepted, so that one client cannot take every slot.
// Trusted proxies are exempt, since every client behind them shares
// their address.
func listen(addr string, l config.Limits) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	per := &perAddress{
		Listener: netutil.LimitListener(ln, l.MaxConns),
		max:      l.MaxConnsPerAddress, proxies: throttle.Proxies(l.TrustedProxies),
		open: map[string]int{},
	}
	return per, nil
}

// perAddress caps the connections of each client address.
type perAddress struct {
	net.Listener
	max     int
	proxies throttle.Proxies

	mu   sync.Mutex
	open map[string]int // by throttle.AddrKey; entries at 0 are deleted
}

func (l *perAddress) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, ok := l.admit(c)
		if !ok {
			// Closing frees the slot it took under the overall cap.
			_ = c.Close()
			continue
		}
		if key == "" {
			return c, nil
		}
		return &countedConn{Conn: c, release: sync.OnceFunc(func() { l.release(key) })}, nil
	}
}

// admit counts c against its address; key is "" for a connection that
// is not counted (a trusted proxy's, or one without an IP address).
func (l *perAddress) admit(c net.Conn) (key string, ok bool) {
	ta, isTCP := c.RemoteAddr().(*net.TCPAddr)
	if !isTCP {
		return "", true
	}
	a := ta.AddrPort().Addr().Unmap()
	if l.proxies.Trusted(a) {
		return "", true
	}
	key = throttle.AddrKey(a)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key] >= l.max {
		return "", false
	}
	l.open[key]++
	return key, true
}

func (l *perAddress) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// countedConn gives its address's slot back when closed (once, however
// often Close is called).
type countedConn struct {
	net.Conn
	release func()
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// newHTTPServer is the one place the http.Server is built, so every limit
// against slow clients is set together: a client that sends its headers or
// body slowly, reads the answer slowly or holds an idle keep-alive
// connection is cut off, and oversized headers are answered 431.
func newHTTPServer(h http.Handler, l config.Limits, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           deadlines(h, l.WriteTimeout),
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		// net/http's own complaints (accept errors, bad TLS) go to the
		// log, not to stderr.
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// deadlines adjusts the http.Server's connection deadlines per request, so
// that they bound what the client does and not how long patchbay works:
//
//   - The read deadline (ReadTimeout) is lifted once the request has been
//     read in full. net/http keeps it during the handler and, when it
//     passes, cancels the request's context from its background read: a
//     POST /v1/executions with wait, or an event stream, would be cancelled
//     by a timeout meant for slow uploads.
//   - The write deadline (WriteTimeout) is counted from the response's
//     first byte rather than from the end of the request headers, so a
//     handler that waits (wait, up to 60s) still gets to answer; and an
//     event stream (text/event-stream) gets it afresh before every write,
//     so it lasts as long as it has something to say, while a client that
//     stops reading it is still cut off after one WriteTimeout.
func deadlines(next http.Handler, write time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		lift := func() { _ = rc.SetReadDeadline(time.Time{}) }
		if r.Body == nil || r.Body == http.NoBody {
			lift()
		} else {
			r.Body = &readToEnd{ReadCloser: r.Body, atEOF: sync.OnceFunc(lift)}
		}
		sw := &deadlineWriter{ResponseWriter: w, rc: rc, d: write}
		next.ServeHTTP(sw, r)
		// What the handler left unwritten (headers of an empty answer, the
		// buffered tail) is written after it returns: give it its time too.
		// A hijacked connection refuses, which is fine.
		sw.extend()
	})
}

// readToEnd calls atEOF when the body has been read to its end.
type readToEnd struct {
	io.ReadCloser
	atEOF func()
}

func (b *readToEnd) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.atEOF()
	}
	return n, err
}

// deadlineWriter moves the write deadline as deadlines describes. It
// implements Flush, FlushError and Unwrap so that echo's Response and
// http.ResponseController reach the real writer through it.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	d       time.Duration
	started bool
	stream  bool
}

func (w *deadlineWriter) WriteHeader(code int) {
	w.begin()
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	if !w.begin() && w.stream {
		w.extend()
	}
	return w.ResponseWriter.Write(p)
}

func (w *deadlineWriter) Flush() { _ = w.FlushError() }

// FlushError is what http.ResponseController.Flush calls, so a stream
// learns that its client is gone (or too slow) from the flush.
func (w *deadlineWriter) FlushError() error {
	if !w.begin() && w.stream {
		w.extend()
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// begin starts the write deadline at the response's first byte and notes
// whether the response is an event stream; it reports whether this call
// was the first.
func (w *deadlineWriter) begin() bool {
	if w.started {
		return false
	}
	w.started = true
	w.stream = strings.HasPrefix(w.Header().Get("Content-Type"), "text/event-stream")
	w.extend()
	return true
}

func (w *deadlineWriter) extend() {
	if w.d > 0 {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	}
}
