package acp

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/patchbay-dev/patchbay/internal/proctree"
)

// TerminalOptions turns on the terminal capability: the agent runs
// commands through patchbay, which keeps their output for it. A command
// starts in a directory under Root, but nothing stops it from leaving it:
// this bounds where commands start, not what they may do.
type TerminalOptions struct {
	// Root is the directory (absolute) a command's cwd must lie under; a
	// command without cwd starts in it.
	Root string
	// Env is every command's environment (nothing is inherited), before
	// the variables the agent asks for. Commands are found in its PATH.
	Env []string
	// MaxOutputBytes bounds the output kept per terminal (the agent's
	// outputByteLimit may lower it). Default 1 MiB.
	MaxOutputBytes int
	// MaxTerminals bounds the terminals not yet released. Default 16.
	MaxTerminals int
}

const (
	defaultMaxOutput    = 1 << 20
	defaultMaxTerminals = 16
	defaultPath         = "/usr/local/bin:/usr/bin:/bin"
)

// terminals are the agent's terminals on one connection. Their processes
// carry the agent's tree tag, so Close's sweep of the tree finds what they
// leave behind too.
type terminals struct {
	opts     TerminalOptions
	resolved string // Root, its symlinks resolved
	tag      string

	mu     sync.Mutex
	next   int
	closed bool
	byID   map[string]*terminal
}

// terminal is one command run for the agent.
type terminal struct {
	sessionID string
	cmd       *exec.Cmd
	out       *output
	exited    chan struct{} // closed once the command has been reaped
	status    exitStatus    // set before exited is closed
}

type exitStatus struct {
	ExitCode *int    `json:"exitCode"`
	Signal   *string `json:"signal"`
}

func newTerminals(o TerminalOptions, tag string) (*terminals, error) {
	if !filepath.IsAbs(o.Root) {
		return nil, fmt.Errorf("root %q is not absolute", o.Root)
	}
	resolved, err := filepath.EvalSymlinks(o.Root)
	if err != nil {
		return nil, err
	}
	if o.MaxOutputBytes <= 0 {
		o.MaxOutputBytes = defaultMaxOutput
	}
	if o.MaxTerminals <= 0 {
		o.MaxTerminals = defaultMaxTerminals
	}
	return &terminals{opts: o, resolved: resolved, tag: tag, byID: map[string]*terminal{}}, nil
}

// output keeps the last limit bytes a command wrote, cut at a character
// boundary as ACP requires.
type output struct {
	mu        sync.Mutex
	buf       []byte
	limit     int
	truncated bool
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = append(o.buf, p...)
	if over := len(o.buf) - o.limit; over > 0 {
		for over < len(o.buf) && !utf8.RuneStart(o.buf[over]) {
			over++
		}
		o.buf = append(o.buf[:0], o.buf[over:]...)
		o.truncated = true
	}
	return len(p), nil
}

func (o *output) text() (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return string(o.buf), o.truncated
}

type terminalParams struct {
	SessionID       string   `json:"sessionId"`
	TerminalID      string   `json:"terminalId"`
	Command         string   `json:"command"`
	Args            []string `json:"args"`
	Env             []EnvVar `json:"env"`
	CWD             *string  `json:"cwd"`
	OutputByteLimit *int64   `json:"outputByteLimit"`
}

// terminal serves the terminal/* methods.
func (c *Conn) terminal(in *incoming, params json.RawMessage) (any, error) {
	var p terminalParams
	if err := decodeParams(params, &p); err != nil {
		return nil, err
	}
	if err := c.knownSession(p.SessionID); err != nil {
		return nil, err
	}
	if in.method == "terminal/create" {
		id, err := c.terms.create(p)
		if err != nil {
			return nil, err
		}
		return struct {
			TerminalID string `json:"terminalId"`
		}{id}, nil
	}
	t, err := c.terms.get(p.SessionID, p.TerminalID)
	if err != nil {
		return nil, err
	}
	switch in.method {
	case "terminal/output":
		return t.outputResult(), nil
	case "terminal/wait_for_exit":
		select {
		case <-t.exited:
			return t.status, nil
		case <-in.ctx.Done():
			return nil, &RPCError{Code: CodeCancelled, Message: "Request cancelled"}
		}
	case "terminal/kill":
		t.kill()
	case "terminal/release":
		c.terms.release(p.TerminalID)
	}
	return struct{}{}, nil
}

func (t *terminal) outputResult() any {
	text, truncated := t.out.text()
	res := struct {
		Output     string      `json:"output"`
		Truncated  bool        `json:"truncated"`
		ExitStatus *exitStatus `json:"exitStatus,omitempty"`
	}{Output: text, Truncated: truncated}
	select {
	case <-t.exited:
		res.ExitStatus = &t.status
	default:
	}
	return res
}

// create starts a command for the agent.
func (ts *terminals) create(p terminalParams) (string, error) {
	dir, err := ts.cwd(p.CWD)
	if err != nil {
		return "", err
	}
	env := slices.Concat(ts.opts.Env, envList(p.Env))
	path, err := lookPath(p.Command, env)
	if err != nil {
		return "", invalidParams("%v", err)
	}
	limit := ts.opts.MaxOutputBytes
	if p.OutputByteLimit != nil && *p.OutputByteLimit >= 0 && *p.OutputByteLimit < int64(limit) {
		limit = int(*p.OutputByteLimit)
	}
	out := &output{limit: limit}
	cmd := &exec.Cmd{
		Path:        path,
		Args:        append([]string{p.Command}, p.Args...),
		Env:         proctree.Tagged(env, ts.tag),
		Dir:         dir,
		Stdout:      out,
		Stderr:      out,
		SysProcAttr: proctree.SysProcAttr(),
		// A process the command left behind may hold its output open.
		WaitDelay: time.Second,
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed {
		return "", errors.New("the connection is closing")
	}
	if len(ts.byID) >= ts.opts.MaxTerminals {
		return "", fmt.Errorf("%d terminals are open: release one first", len(ts.byID))
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start %s: %w", p.Command, err)
	}
	t := &terminal{sessionID: p.SessionID, cmd: cmd, out: out, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		t.status = exitStatusOf(cmd.ProcessState)
		close(t.exited)
	}()
	ts.next++
	id := "term-" + strconv.Itoa(ts.next)
	ts.byID[id] = t
	return id, nil
}

// cwd is the command's working directory: Root, or the agent's cwd when it
// lies under Root once its symlinks are resolved.
func (ts *terminals) cwd(cwd *string) (string, error) {
	if cwd == nil || *cwd == "" {
		return ts.resolved, nil
	}
	if !filepath.IsAbs(*cwd) {
		return "", invalidParams("cwd %q is not absolute", *cwd)
	}
	resolved, err := filepath.EvalSymlinks(*cwd)
	if err != nil {
		return "", invalidParams("cwd %s: %v", *cwd, err)
	}
	rel, err := filepath.Rel(ts.resolved, resolved)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", errOutside(*cwd)
	}
	return resolved, nil
}

func envList(vars []EnvVar) []string {
	env := make([]string, 0, len(vars))
	for _, v := range vars {
		env = append(env, v.Name+"="+v.Value)
	}
	return env
}

// lookPath finds command in env's PATH (the last one set), not patchbay's:
// the command runs with env.
func lookPath(command string, env []string) (string, error) {
	if command == "" {
		return "", errors.New("no command")
	}
	if strings.ContainsRune(command, filepath.Separator) {
		return command, nil
	}
	path := defaultPath
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue // a relative PATH entry would depend on the cwd
		}
		candidate := filepath.Join(dir, command)
		if info, err := os.Stat(candidate); err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("%s not found in PATH %s", command, path)
}

func (ts *terminals) get(sessionID, id string) (*terminal, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.byID[id]
	if t == nil || t.sessionID != sessionID {
		return nil, &RPCError{Code: CodeNotFound, Message: fmt.Sprintf("no terminal %q in this session", id)}
	}
	return t, nil
}

// kill kills the command's process group; its output stays readable.
func (t *terminal) kill() {
	select {
	case <-t.exited:
	default:
		_ = proctree.SignalGroup(t.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// release kills the command and forgets the terminal.
func (ts *terminals) release(id string) {
	ts.mu.Lock()
	t := ts.byID[id]
	delete(ts.byID, id)
	ts.mu.Unlock()
	if t != nil {
		t.kill()
	}
}

// closeAll kills every command and waits, bounded, for them to be reaped.
// terminalsWait bounds how long closeAll waits for killed terminals to
// exit.
const terminalsWait = 2 * time.Second

func (ts *terminals) closeAll() {
	if ts == nil {
		return
	}
	ts.mu.Lock()
	ts.closed = true
	all := ts.byID
	ts.byID = map[string]*terminal{}
	ts.mu.Unlock()
	deadline := time.NewTimer(terminalsWait)
	defer deadline.Stop()
	for _, t := range all {
		t.kill()
		select {
		case <-t.exited:
		case <-deadline.C:
			return
		}
	}
}
