package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
)

// Upper bounds in these tests are generous: the machine running them may
// be loaded, and a cut-off that comes late is still a cut-off. What they
// rule out is a connection held for as long as the client likes.
const cutOffWithin = 10 * time.Second

// shortLimits are the limits the tests serve with: short enough to pass
// quickly, long enough that an honest request on a loaded machine is not
// cut off.
func shortLimits() config.Limits {
	l := config.Default().Limits
	l.ReadHeaderTimeout = 300 * time.Millisecond
	l.ReadTimeout = 500 * time.Millisecond
	l.WriteTimeout = 500 * time.Millisecond
	l.IdleTimeout = 500 * time.Millisecond
	l.MaxHeaderBytes = 4096
	return l
}

// serveLimited serves h as run does, with limits l, and returns its
// address.
func serveLimited(t *testing.T, l config.Limits, h http.Handler) string {
	t.Helper()
	ln, err := listen("127.0.0.1:0", l)
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(h, l, slog.New(slog.DiscardHandler))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// closedWithin reads (and discards) from conn until the server closes it,
// failing the test if that takes longer than d.
func closedWithin(t *testing.T, conn net.Conn, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	_ = conn.SetReadDeadline(start.Add(d))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open for %s", d)
	}
	return time.Since(start)
}

func hello(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	fmt.Fprint(w, "hello")
}

func TestSlowHeadersAreCutOff(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, shortLimits(), http.HandlerFunc(hello))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A header byte every 50ms: never idle long, never done.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		fmt.Fprint(conn, "GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				if _, err := conn.Write([]byte("a")); err != nil {
					return
				}
			}
		}
	}()
	took := closedWithin(t, conn, cutOffWithin)
	if took < 200*time.Millisecond {
		t.Fatalf("closed after %s, before the read-header timeout", took)
	}
}

func TestIdleKeepAliveIsClosed(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, shortLimits(), http.HandlerFunc(hello))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("first request: %d close=%v", resp.StatusCode, resp.Close)
	}
	closedWithin(t, conn, cutOffWithin)
}

func TestOversizedHeadersAre431(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, shortLimits(), http.HandlerFunc(hello))
	req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
	// net/http allows 4 KiB of slack over MaxHeaderBytes.
	req.Header.Set("X-Big", strings.Repeat("a", 16<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("status %d, want 431", resp.StatusCode)
	}
}

// TestSlowBodyIsCutOff: the body trickles in; the read timeout ends it.
// (The end-to-end test does the same against /hooks.)
func TestSlowBodyIsCutOff(t *testing.T) {
	t.Parallel()
	addr := serveLimited(t, shortLimits(), http.HandlerFunc(hello))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	go trickle(conn, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", 50*time.Millisecond)
	closedWithin(t, conn, cutOffWithin)
}

// trickle sends head, then a body byte every gap until the write fails.
func trickle(conn net.Conn, head string, gap time.Duration) {
	if _, err := fmt.Fprint(conn, head); err != nil {
		return
	}
	for {
		time.Sleep(gap)
		if _, err := conn.Write([]byte("x")); err != nil {
			return
		}
	}
}

// TestStreamsOutliveTheTimeouts: an event stream keeps going well past
// the read and write timeouts, and so does a handler that waits before it
// answers (POST /v1/executions with wait).
func TestStreamsOutliveTheTimeouts(t *testing.T) {
	t.Parallel()
	l := shortLimits()
	const events = 15 // 100ms apart: three times the timeouts
	mux := http.NewServeMux()
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		http.NewResponseController(w).Flush()
		for i := range events {
			select {
			case <-r.Context().Done():
				return // what a cut-off would look like
			case <-time.After(100 * time.Millisecond):
			}
			fmt.Fprintf(w, "data: %d\n\n", i)
			if err := http.NewResponseController(w).Flush(); err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/wait", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
			http.Error(w, "cancelled", 500)
			return
		case <-time.After(3 * l.WriteTimeout):
		}
		fmt.Fprint(w, "done")
	})
	addr := serveLimited(t, l, mux)

	resp, err := http.Get("http://" + addr + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			n++
		}
	}
	if n != events {
		t.Fatalf("stream delivered %d of %d events (err %v)", n, events, sc.Err())
	}

	resp, err = http.Post("http://"+addr+"/wait", "text/plain", strings.NewReader("body"))
	if err != nil {
		t.Fatalf("a handler that waits past the write timeout lost its answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "done" {
		t.Fatalf("wait: %d %q", resp.StatusCode, body)
	}
}

// TestStreamToAClientThatStopsReadingEnds: the deadline moves with every
// write, so a stream whose client stops reading still ends.
func TestStreamToAClientThatStopsReadingEnds(t *testing.T) {
	t.Parallel()
	ended := make(chan error, 1)
	addr := serveLimited(t, shortLimits(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := []byte("data: " + strings.Repeat("x", 64<<10) + "\n\n")
		for {
			if _, err := w.Write(chunk); err != nil {
				ended <- err
				return
			}
			if err := http.NewResponseController(w).Flush(); err != nil {
				ended <- err
				return
			}
		}
	}))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n") // and never read
	select {
	case <-ended:
	case <-time.After(cutOffWithin):
		t.Fatal("the stream to a client that does not read never ended")
	}
}

func TestConnectionCap(t *testing.T) {
	t.Parallel()
	l := shortLimits()
	l.MaxConns = 2
	// Long idle and header timeouts: the held connections must stay
	// open for as long as the test needs them.
	l.IdleTimeout, l.ReadHeaderTimeout, l.ReadTimeout = time.Minute, time.Minute, time.Minute
	addr := serveLimited(t, l, http.HandlerFunc(hello))

	held := make([]net.Conn, l.MaxConns)
	for i := range held {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// A served request proves the connection was accepted.
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		held[i] = c
	}
	get := func(timeout time.Duration) error {
		client := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Get("http://" + addr + "/")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	// Past the cap nothing is served, however long one waits; 500ms is
	// plenty to show it (an accepted request here takes a millisecond).
	if err := get(500 * time.Millisecond); err == nil {
		t.Fatal("a connection past the cap was served")
	}
	held[0].Close()
	ctx, cancel := context.WithTimeout(context.Background(), cutOffWithin)
	defer cancel()
	for {
		if err := get(time.Second); err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("no connection was served after one under the cap closed")
		}
	}
}

// TestConnectionCapPerAddress: one address cannot take every slot; others
// still get in, and a trusted proxy is not counted.
func TestConnectionCapPerAddress(t *testing.T) {
	t.Parallel()
	l := shortLimits()
	l.MaxConns, l.MaxConnsPerAddress = 10, 2
	l.IdleTimeout, l.ReadHeaderTimeout, l.ReadTimeout = time.Minute, time.Minute, time.Minute
	served := func(t *testing.T, addr, from string) (net.Conn, bool) {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(cutOffWithin))
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("a connection was neither served nor closed")
			}
			return c, false
		}
		resp.Body.Close()
		return c, resp.StatusCode == 200
	}

	addr := serveLimited(t, l, http.HandlerFunc(hello))
	first, ok1 := served(t, addr, "127.0.0.2")
	_, ok2 := served(t, addr, "127.0.0.2")
	if !ok1 || !ok2 {
		t.Fatal("connections within the per-address cap were not served")
	}
	if _, ok := served(t, addr, "127.0.0.2"); ok {
		t.Fatal("a third connection from one address was served")
	}
	if _, ok := served(t, addr, "127.0.0.3"); !ok {
		t.Fatal("another address was refused")
	}
	first.Close()
	deadline := time.Now().Add(cutOffWithin)
	for {
		if _, ok := served(t, addr, "127.0.0.2"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed connection's slot was not given back")
		}
		time.Sleep(20 * time.Millisecond)
	}

	l.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.4/32")}
	addr = serveLimited(t, l, http.HandlerFunc(hello))
	for i := range 4 {
		if _, ok := served(t, addr, "127.0.0.4"); !ok {
			t.Fatalf("connection %d from a trusted proxy was refused", i+1)
		}
	}
}
