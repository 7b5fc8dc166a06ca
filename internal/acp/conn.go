package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/patchbay-dev/patchbay/internal/proctree"
)

// Client is what the agent calls back: the workflow node implements it.
// SessionUpdate calls come one at a time, in order; RequestPermission
// calls each run on a goroutine of their own (see the package doc). ctx is
// cancelled when the connection ends, and a permission request's ctx also
// when its session is cancelled (the agent has then already been answered
// "cancelled").
type Client interface {
	SessionUpdate(ctx context.Context, n SessionNotification)
	RequestPermission(ctx context.Context, r PermissionRequest) (PermissionOutcome, error)
}

// Conn is a connection to one agent process. Its methods are safe for
// concurrent use.
type Conn struct {
	client Client
	opts   Options
	proc   *process       // nil for a connection over plain pipes (tests)
	in     io.WriteCloser // the agent's stdin
	out    io.ReadCloser  // the agent's stdout
	fs     *fsys          // nil unless Options.FS
	terms  *terminals     // nil unless Options.Terminal

	// ctx is the handlers' context, cancelled when the connection ends.
	ctx    context.Context
	cancel context.CancelFunc

	writeMu sync.Mutex

	mu       sync.Mutex
	err      error // why the connection ended; set once, before done closes
	nextID   int64
	pending  map[int64]chan response
	inflight map[string]*incoming // the agent's requests being handled, by id
	sessions map[string]bool      // created or loaded on this connection
	init     *InitializeResult

	done    chan struct{}
	updates chan SessionNotification
	order   ordering

	loops     sync.WaitGroup // reader, dispatcher, exit watcher
	handlers  sync.WaitGroup // the agent's requests being handled
	closeOnce sync.Once
	closeErr  error
}

// response is an answer of the agent to one of our requests.
type response struct {
	result json.RawMessage
	err    *RPCError
	seq    uint64 // updates queued before it was read
}

// Start starts the agent and connects to it; Initialize is the next step.
// ctx only bounds starting, except for the process tree tag it may carry
// (proctree.WithTag: a pool records the tag before it starts the agent);
// the connection lasts until Close, which must be called, or until the
// agent exits.
func Start(ctx context.Context, cmd Command, c Client, opts Options) (*Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("acp: start: %w", err)
	}
	opts = opts.withDefaults()
	tag := proctree.TagFrom(ctx)
	if tag == "" {
		tag = proctree.NewTag()
	}
	fs, terms, err := capabilities(opts, tag)
	if err != nil {
		return nil, err
	}
	p := &process{tag: tag}
	stdin, stdout, err := p.start(cmd)
	if err != nil {
		fs.close()
		return nil, fmt.Errorf("acp: %w", err)
	}
	conn := newConn(stdin, stdout, c, opts, fs, terms)
	conn.proc = p
	conn.loops.Add(1)
	go conn.watchExit()
	return conn, nil
}

// capabilities sets up the optional client capabilities opts turn on.
func capabilities(opts Options, tag string) (*fsys, *terminals, error) {
	var (
		fs    *fsys
		terms *terminals
		err   error
	)
	if opts.FS != nil {
		if fs, err = newFS(*opts.FS); err != nil {
			return nil, nil, fmt.Errorf("acp: fs: %w", err)
		}
	}
	if opts.Terminal != nil {
		if terms, err = newTerminals(*opts.Terminal, tag); err != nil {
			fs.close()
			return nil, nil, fmt.Errorf("acp: terminal: %w", err)
		}
	}
	return fs, terms, nil
}

// newConn runs the protocol over in and out (the agent's stdin and
// stdout).
func newConn(in io.WriteCloser, out io.ReadCloser, c Client, opts Options, fs *fsys, terms *terminals) *Conn {
	ctx, cancel := context.WithCancel(context.Background())
	conn := &Conn{
		client:   c,
		opts:     opts.withDefaults(),
		in:       in,
		out:      out,
		fs:       fs,
		terms:    terms,
		ctx:      ctx,
		cancel:   cancel,
		pending:  map[int64]chan response{},
		inflight: map[string]*incoming{},
		sessions: map[string]bool{},
		done:     make(chan struct{}),
		updates:  make(chan SessionNotification, 256),
	}
	conn.order.changed = make(chan struct{})
	conn.loops.Add(2)
	go conn.read()
	go conn.dispatch()
	return conn
}

// Done is closed when the connection has ended: the agent exited, its
// output broke the protocol's bounds, or Close was called. Err says why.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended, or nil while it lasts.
func (c *Conn) Err() error {
	if err := c.ended(); err != nil {
		return fmt.Errorf("acp: %w", err)
	}
	return nil
}

// ended is why the connection ended, unwrapped, or nil.
func (c *Conn) ended() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// fail ends the connection for err, unless it has already ended: calls
// waiting for an answer return, and the handlers' context is cancelled.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	close(c.done)
	c.cancel()
}

// Close ends the connection and stops the agent's process tree: it closes
// the agent's stdin, sends SIGTERM to its process group and tagged
// processes when it has not exited within CloseGrace (agents may ignore
// EOF), SIGKILL after another CloseGrace, and finally kills whatever is
// left of the tree. It returns within about 2×CloseGrace plus a few
// seconds, and is idempotent. The agent's exit status is not an error: it
// was asked to stop.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.fail(ErrClosed)
		if c.proc != nil {
			c.proc.remember()
		}
		c.terms.closeAll()
		_ = c.in.Close()
		if c.proc != nil {
			if err := c.proc.stop(c.opts.CloseGrace); err != nil {
				c.closeErr = fmt.Errorf("acp: close: %w", err)
			}
		}
		// A process the tree kill could not find may still hold stdout.
		_ = c.out.Close()
		c.loops.Wait()
		c.waitHandlers(c.opts.CloseGrace)
		c.fs.close()
	})
	return c.closeErr
}

// waitHandlers waits, at most d, for the Client's methods to return:
// their ctx is cancelled, but one that ignores it must not hold Close.
func (c *Conn) waitHandlers(d time.Duration) {
	done := make(chan struct{})
	go func() {
		c.handlers.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		c.opts.Logger.Warn("acp: a client handler did not return after close")
	}
}

// watchExit ends the connection when the agent exits, once what it wrote
// before has been read (briefly: a process it left behind may hold its
// stdout open).
func (c *Conn) watchExit() {
	defer c.loops.Done()
	select {
	case <-c.proc.exited:
	case <-c.done:
		return
	}
	t := time.NewTimer(drainWait)
	defer t.Stop()
	select {
	case <-c.done: // the reader reached EOF, or Close
	case <-t.C:
		c.fail(c.exitErr())
	}
}

// drainWait bounds how long the reader gets to read what an agent wrote
// before it exited, and how long an EOF waits for the exit status.
const drainWait = time.Second

// exitErr says how the agent ended, once its stdout reached EOF.
func (c *Conn) exitErr() error {
	if c.proc == nil {
		return fmt.Errorf("%w: its stdout closed", ErrAgentExited)
	}
	t := time.NewTimer(drainWait)
	defer t.Stop()
	select {
	case <-c.proc.exited:
	case <-t.C:
		return fmt.Errorf("%w: it closed its stdout", ErrAgentExited)
	}
	if c.proc.err != nil {
		return fmt.Errorf("%w: %v", ErrAgentExited, c.proc.err)
	}
	return fmt.Errorf("%w: exit status 0", ErrAgentExited)
}

// read reads the agent's messages, one per line, until its stdout ends or
// a line exceeds MaxLineBytes.
func (c *Conn) read() {
	defer c.loops.Done()
	br := bufio.NewReaderSize(c.out, 64<<10)
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(bytes.TrimRight(chunk, "\r\n")) > c.opts.MaxLineBytes {
			c.fail(fmt.Errorf("%w: a message from the agent exceeded %d bytes", ErrLineTooLong, c.opts.MaxLineBytes))
			return
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if len(line) > 0 {
			c.handleLine(bytes.TrimRight(line, "\r\n"))
			line = line[:0]
			if cap(line) > 1<<20 {
				line = nil // do not keep a large message's buffer
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				c.fail(c.exitErr())
			} else {
				c.fail(fmt.Errorf("read from the agent: %w", err))
			}
			return
		}
	}
}

// message is any JSON-RPC message, as read.
type message struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *RPCError       `json:"error"`
}

var nullID = json.RawMessage("null")

// handleLine handles one line from the agent. It never blocks on a
// handler, except to queue a session update (see dispatch).
func (c *Conn) handleLine(line []byte) {
	if c.opts.Wire != nil {
		c.opts.Wire(false, line)
	}
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		c.opts.Logger.Warn("acp: the agent sent a line that is not a JSON-RPC message", "line", clip(line, 200), "err", err)
		c.reply(nullID, nil, &RPCError{Code: CodeParseError, Message: "Parse error"})
		return
	}
	switch {
	case m.Method != "" && m.ID != nil:
		c.handleRequest(m)
	case m.Method != "":
		c.handleNotification(m)
	case m.ID != nil:
		c.handleResponse(m)
	default:
		c.reply(nullID, nil, &RPCError{Code: CodeInvalidRequest, Message: "Invalid request"})
	}
}

func (c *Conn) handleResponse(m message) {
	id, err := strconv.ParseInt(string(m.ID), 10, 64)
	c.mu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if err != nil || !ok {
		c.opts.Logger.Warn("acp: the agent answered no pending request", "id", clip(m.ID, 40), "error", m.Error)
		return
	}
	ch <- response{result: m.Result, err: m.Error, seq: c.order.queued.Load()}
}

func (c *Conn) handleNotification(m message) {
	switch m.Method {
	case "session/update":
		n, err := decodeUpdate(m.Params)
		if err != nil {
			c.opts.Logger.Warn("acp: dropped a session/update", "err", err)
			return
		}
		c.order.queued.Add(1)
		select {
		case c.updates <- n:
		case <-c.done:
		}
	case "$/cancel_request":
		c.cancelIncoming(m.Params)
	default:
		c.opts.Logger.Debug("acp: ignored a notification", "method", m.Method)
	}
}

// dispatch delivers session updates to the Client, one at a time, in
// order. The queue is bounded: a Client slower than the agent holds the
// reader back, and so the agent.
func (c *Conn) dispatch() {
	defer c.loops.Done()
	for {
		select {
		case n := <-c.updates:
			c.client.SessionUpdate(c.ctx, n)
			c.order.deliver()
		case <-c.done:
			return
		}
	}
}

// ordering counts the session updates queued by the reader and delivered
// by the dispatcher, so that what the agent sent after an update is not
// seen before it.
type ordering struct {
	queued atomic.Uint64

	mu        sync.Mutex
	delivered uint64
	changed   chan struct{} // closed and replaced at each delivery
}

func (o *ordering) deliver() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.delivered++
	close(o.changed)
	o.changed = make(chan struct{})
}

// await waits until seq updates have been delivered, ctx is done or the
// connection has ended.
func (c *Conn) await(ctx context.Context, seq uint64) error {
	for {
		c.order.mu.Lock()
		delivered, changed := c.order.delivered, c.order.changed
		c.order.mu.Unlock()
		if delivered >= seq {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-c.done:
			return c.ended()
		}
	}
}

// Outgoing messages.
type (
	outRequest struct {
		JSONRPC string `json:"jsonrpc"`
		ID      int64  `json:"id"`
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}
	outNotification struct {
		JSONRPC string `json:"jsonrpc"`
		Method  string `json:"method"`
		Params  any    `json:"params"`
	}
	outResponse struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  any             `json:"result,omitempty"`
		Error   *RPCError       `json:"error,omitempty"`
	}
)

// write sends one message as one line.
func (c *Conn) write(v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the wire stays readable; JSON needs no escaping of <>&
	if err := enc.Encode(v); err != nil {
		return err
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.ended(); err != nil {
		return err
	}
	if c.opts.Wire != nil {
		c.opts.Wire(true, bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	}
	if _, err := c.in.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("write to the agent: %w", err)
	}
	return nil
}

func (c *Conn) notify(method string, params any) error {
	return c.write(outNotification{JSONRPC: "2.0", Method: method, Params: params})
}

func (c *Conn) reply(id json.RawMessage, result any, rpcErr *RPCError) {
	if rpcErr == nil && result == nil {
		result = struct{}{}
	}
	if err := c.write(outResponse{JSONRPC: "2.0", ID: id, Result: result, Error: rpcErr}); err != nil {
		c.opts.Logger.Debug("acp: could not answer the agent", "err", err)
	}
}

// request sends a request and returns the channel its answer will come on.
func (c *Conn) request(method string, params any) (int64, chan response, error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return 0, nil, c.err
	}
	id := c.nextID
	c.nextID++
	ch := make(chan response, 1)
	c.pending[id] = ch
	c.mu.Unlock()
	if err := c.write(outRequest{JSONRPC: "2.0", ID: id, Method: method, Params: params}); err != nil {
		c.forget(id)
		return 0, nil, err
	}
	return id, ch, nil
}

func (c *Conn) forget(id int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, id)
}

// wait waits for the answer on ch, ctx or the end of the connection. The
// caller forgets the request.
func (c *Conn) wait(ctx context.Context, ch chan response) (response, error) {
	select {
	case r := <-ch:
		return r, nil
	case <-ctx.Done():
		return response{}, ctx.Err()
	case <-c.done:
		select {
		case r := <-ch: // answered just before the end
			return r, nil
		default:
			return response{}, c.ended()
		}
	}
}

// call sends a request and decodes its answer into out (when not nil).
// ordered calls return once the updates sent before the answer were
// delivered.
func (c *Conn) call(ctx context.Context, method string, params, out any, ordered bool) error {
	id, ch, err := c.request(method, params)
	if err != nil {
		return fmt.Errorf("acp: %s: %w", method, err)
	}
	r, err := c.wait(ctx, ch)
	c.forget(id)
	if err == nil && ordered {
		err = c.await(ctx, r.seq)
	}
	if err != nil {
		return fmt.Errorf("acp: %s: %w", method, err)
	}
	return decodeResult(method, r, out)
}

func decodeResult(method string, r response, out any) error {
	if r.err != nil {
		return fmt.Errorf("acp: %s: %w", method, r.err)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(r.result, out); err != nil {
		return fmt.Errorf("acp: %s: decode the result: %w", method, err)
	}
	return nil
}

func clip(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
