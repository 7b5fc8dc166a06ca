package acp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("ACP_FAKE_AGENT"); mode != "" {
		os.Exit(fakeAgent(mode))
	}
	os.Exit(m.Run())
}

// recorder is a Client that keeps every update and answers permission
// requests with perm (cancelled when nil).
type recorder struct {
	perm     func(ctx context.Context, r PermissionRequest) (PermissionOutcome, error)
	onUpdate func(n SessionNotification)

	mu      sync.Mutex
	updates []SessionNotification
	asked   []PermissionRequest
}

func (r *recorder) SessionUpdate(_ context.Context, n SessionNotification) {
	r.mu.Lock()
	r.updates = append(r.updates, n)
	r.mu.Unlock()
	if r.onUpdate != nil {
		r.onUpdate(n)
	}
}

func (r *recorder) RequestPermission(ctx context.Context, req PermissionRequest) (PermissionOutcome, error) {
	r.mu.Lock()
	r.asked = append(r.asked, req)
	r.mu.Unlock()
	if r.perm == nil {
		return PermissionOutcome{}, nil
	}
	return r.perm(ctx, req)
}

func (r *recorder) seen() []SessionNotification {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]SessionNotification(nil), r.updates...)
}

// texts joins the text of the agent's message chunks.
func (r *recorder) texts() string {
	var b strings.Builder
	for _, n := range r.seen() {
		if n.Kind == UpdateAgentMessageChunk && n.Content != nil {
			b.WriteString(n.Content.Text)
		}
	}
	return b.String()
}

// peer plays the agent at the other end of an in-memory connection.
type peer struct {
	t     *testing.T
	w     io.WriteCloser
	lines chan []byte
}

// pipeConn connects a Conn to a peer the test drives.
func pipeConn(t *testing.T, c Client, opts Options) (*Conn, *peer) {
	t.Helper()
	toAgent, fromConn := io.Pipe()
	toConn, fromAgent := io.Pipe()
	var fs *fsys
	var terms *terminals
	var err error
	if opts.FS != nil {
		if fs, err = newFS(*opts.FS); err != nil {
			t.Fatal(err)
		}
	}
	if opts.Terminal != nil {
		if terms, err = newTerminals(*opts.Terminal, "pt-test-"+strconv.Itoa(os.Getpid())); err != nil {
			t.Fatal(err)
		}
	}
	conn := newConn(fromConn, toConn, c, opts, fs, terms)
	p := &peer{t: t, w: fromAgent, lines: make(chan []byte, 1024)}
	go func() {
		defer close(p.lines)
		br := bufio.NewReader(toAgent)
		for {
			line, err := br.ReadBytes('\n')
			if len(line) > 0 {
				p.lines <- line
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		fromAgent.Close()
		toAgent.Close()
	})
	return conn, p
}

// send writes one line to the connection.
func (p *peer) send(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.w, line+"\n"); err != nil {
		p.t.Fatalf("peer send: %v", err)
	}
}

// recv returns the next message the connection sent.
func (p *peer) recv() message {
	p.t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.t.Fatal("peer: the connection closed its output")
		}
		var m message
		if err := json.Unmarshal(line, &m); err != nil {
			p.t.Fatalf("peer: %q: %v", line, err)
		}
		return m
	case <-time.After(10 * time.Second):
		p.t.Fatal("peer: nothing received")
	}
	return message{}
}

// handshake answers initialize and session/new (id s1) for a call of
// Initialize and NewSession.
func (p *peer) handshake(ctx context.Context, conn *Conn, caps string) string {
	p.t.Helper()
	errc := make(chan error, 1)
	var id string
	go func() {
		if _, err := conn.Initialize(ctx); err != nil {
			errc <- err
			return
		}
		var err error
		id, err = conn.NewSession(ctx, "/work", nil)
		errc <- err
	}()
	m := p.recv()
	p.send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"protocolVersion":1,"agentCapabilities":` + caps + `}}`)
	m = p.recv()
	p.send(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"sessionId":"s1"}}`)
	if err := <-errc; err != nil {
		p.t.Fatal(err)
	}
	return id
}

// alive reports whether pid is a running process (a zombie is not).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	_, after, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(after, "Z")
}

// waitGone waits for pid to stop running.
func waitGone(t *testing.T, what string, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Errorf("%s (pid %d) still running", what, pid)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testWriter sends a child's stderr to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("agent stderr: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
