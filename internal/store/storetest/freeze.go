package storetest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/patchbay-dev/patchbay/internal/store"
)

// FreezeProxy is a TCP proxy to a Redis server that can be frozen: from
// then on it forwards nothing more either way and answers no new
// connection, but keeps every connection open, as a Redis stopped with
// SIGSTOP (or behind a network that silently drops everything) looks to
// a client. Nothing is refused or reset, so only deadlines end a wait.
type FreezeProxy struct {
	// Addr is where the proxy listens, host:port on loopback.
	Addr string

	mu     sync.Mutex
	frozen bool
	thawed chan struct{} // closed by Thaw; replaced by Freeze
	stop   chan struct{} // closed when the test ends
}

// NewFreezeProxy starts a proxy to the Redis at target (host:port) that
// stops when t ends.
func NewFreezeProxy(t testing.TB, target string) *FreezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &FreezeProxy{Addr: ln.Addr().String(), thawed: make(chan struct{}), stop: make(chan struct{})}
	close(p.thawed)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, target)
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); close(p.stop) })
	return p
}

// Freeze stops all traffic through the proxy until Thaw.
func (p *FreezeProxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.frozen {
		p.frozen, p.thawed = true, make(chan struct{})
	}
}

// Thaw lets traffic through again, what was held first.
func (p *FreezeProxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen {
		p.frozen = false
		close(p.thawed)
	}
}

// pass waits while the proxy is frozen; false when the test has ended.
func (p *FreezeProxy) pass() bool {
	p.mu.Lock()
	thawed := p.thawed
	p.mu.Unlock()
	select {
	case <-thawed:
		return true
	case <-p.stop:
		return false
	}
}

func (p *FreezeProxy) serve(client net.Conn, target string) {
	defer client.Close()
	server, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer server.Close()
	done := make(chan struct{}, 2)
	go func() { p.pump(client, server); done <- struct{}{} }()
	go func() { p.pump(server, client); done <- struct{}{} }()
	select {
	case <-done:
	case <-p.stop:
	}
}

// pump copies src to dst, holding each chunk while the proxy is frozen.
func (p *FreezeProxy) pump(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// NewFreezable returns a store opened with store.Open on a fresh miniredis
// behind a FreezeProxy, and the proxy: freeze it to see how patchbay
// behaves when Redis stops answering. The store is closed when t ends (its
// keys go with the miniredis).
func NewFreezable(t testing.TB) (*store.Store, *FreezeProxy) {
	t.Helper()
	mr := miniredis.RunT(t)
	p := NewFreezeProxy(t, mr.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := store.Open(ctx, "redis://"+p.Addr+"/0", Prefix(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("storetest: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, p
}
