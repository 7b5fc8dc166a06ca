package mcp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"time"

	"github.com/patchbay-dev/patchbay/internal/proctree"
)

// process is the child of a stdio connection. patchbay starts and reaps it
// itself (mcp-go only gets its pipes, through transport.NewIO), so that its
// stdout can be guarded (see guard), its exit noticed at once, and its whole
// tree killed on Close: its process group, and every process carrying its
// tag (internal/proctree), such as a browser it started in a session of its
// own.
type process struct {
	dir   string
	tag   string          // the tree's tag, in the child's environment
	child *proctree.Child // ends it and everything it started

	cmd    *exec.Cmd
	exited chan struct{} // closed once the child has been reaped
	err    error         // Wait's result, set before exited is closed
}

// start runs command with exactly env (no inherited environment) and the
// tree's tag, in its own process group, and returns its stdin and stdout.
func (p *process) start(command string, args, env []string, stderr io.Writer) (io.WriteCloser, io.ReadCloser, error) {
	cmd := exec.Command(command, args...)
	cmd.Env = proctree.Tagged(env, p.tag)
	cmd.Dir = p.dir
	cmd.SysProcAttr = proctree.SysProcAttr()
	if stderr == nil {
		stderr = io.Discard
	}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", command, err)
	}
	p.cmd = cmd
	p.exited = make(chan struct{})
	p.child = proctree.NewChild(p.tag, cmd.Process.Pid, p.exited)
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return stdin, stdout, nil
}

// pid is the child's process id, which is also its process group id, or 0
// when it never started.
func (p *process) pid() int {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// stop ends the child and its tree (proctree.Child.Stop), after grace
// for it to exit on its own once its stdin was closed.
func (p *process) stop(grace time.Duration) error { return p.child.Stop(grace) }

// remember looks at the tree while the server still runs, before Close
// asks it to stop (proctree.Child.Remember).
func (p *process) remember() { p.child.Remember() }

// Faults of a server's output, matched with errors.Is.
var (
	// ErrResponseTooLarge: one message from the server exceeded the
	// connection's maxResponseBytes.
	ErrResponseTooLarge = errors.New("response too large")
	// ErrInvalidJSON: a stdio server wrote a line that is not JSON, which
	// MCP forbids (stdout is for protocol messages only).
	ErrInvalidJSON = errors.New("server wrote invalid JSON")
)

// guard passes a stdio server's stdout to mcp-go line by line, and stops
// with a fault (reported once to fault) at the first line longer than
// limit bytes or that is not JSON. mcp-go reads stdout with an unbounded
// ReadString and silently skips lines it cannot parse, which would let a
// server exhaust memory, or leave a call waiting for its timeout on a
// response that was garbled; guarding ends the connection with the reason
// instead. It checks each line as mcp-go asks for bytes, in mcp-go's
// reading goroutine: no goroutine or pipe of its own, which cost every
// message a copy and a hand-over.
func guard(src io.Reader, limit int64, fault func(error)) io.Reader {
	return &guardReader{br: bufio.NewReaderSize(src, 64<<10), limit: limit, fault: fault}
}

// guardReader is guard's reader: line is the checked line being served
// from off; err ends the stream once line is served.
type guardReader struct {
	br    *bufio.Reader
	limit int64
	fault func(error)
	line  []byte
	off   int
	err   error
}

func (g *guardReader) Read(p []byte) (int, error) {
	for g.off >= len(g.line) {
		if g.err != nil {
			return 0, g.err
		}
		g.next()
	}
	n := copy(p, g.line[g.off:])
	g.off += n
	return n, nil
}

// next reads and checks the next line. A fault ends the stream with a
// plain EOF for mcp-go, which would log any other error again; the fault
// is logged once, by the conn.
func (g *guardReader) next() {
	g.line, g.off = g.line[:0], 0
	for {
		chunk, err := g.br.ReadSlice('\n')
		g.line = append(g.line, chunk...)
		if int64(len(g.line)) > g.limit {
			g.fault(fmt.Errorf("%w: a message exceeded the %d-byte limit (maxResponseBytes)", ErrResponseTooLarge, g.limit))
			g.line, g.err = g.line[:0], io.EOF
			return
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if trimmed := bytes.TrimSpace(g.line); len(trimmed) > 0 && !json.Valid(trimmed) {
			g.fault(fmt.Errorf("%w on stdout: %q", ErrInvalidJSON, clip(trimmed, 80)))
			g.line, g.err = g.line[:0], io.EOF
			return
		}
		g.err = err // served after the line
		return
	}
}

func clip(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}

// once keeps the first error it is given.
type once struct {
	mu  sync.Mutex
	err error
}

func (o *once) set(err error) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return false
	}
	o.err = err
	return true
}

func (o *once) get() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}
