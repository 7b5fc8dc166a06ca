package acp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/patchbay-dev/patchbay/internal/proctree"
)

// process is the agent's child process. Like a stdio MCP server's
// (internal/mcp), it runs in a process group of its own with exactly the
// environment it is given plus its tree's tag (internal/proctree), so that
// Close can end everything it started: its group, and every process that
// carries the tag, such as a tool it started in a session of its own.
type process struct {
	tag   string
	child *proctree.Child // ends it and everything it started

	cmd    *exec.Cmd
	exited chan struct{} // closed once the child has been reaped
	err    error         // Wait's result, set before exited is closed
}

// start runs cmd and returns the agent's stdin and stdout. Both are plain
// pipes (os.Pipe) rather than exec's: Wait then never closes stdout under
// the reader, which reads the agent's last lines to EOF.
func (p *process) start(cmd Command) (io.WriteCloser, io.ReadCloser, error) {
	if cmd.Path == "" {
		return nil, nil, errors.New("start: no command")
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("start: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, nil, fmt.Errorf("start: %w", err)
	}
	ec := exec.Command(cmd.Path, cmd.Args...)
	ec.Env = proctree.Tagged(cmd.Env, p.tag)
	ec.Dir = cmd.Dir
	ec.SysProcAttr = proctree.SysProcAttr()
	ec.Stdin, ec.Stdout = inR, outW
	ec.Stderr = cmd.Stderr
	if ec.Stderr == nil {
		ec.Stderr = io.Discard
	}
	// A process the agent left behind may hold stderr open: its copy must
	// not keep Wait, and so the exit, from being noticed.
	ec.WaitDelay = time.Second
	err = ec.Start()
	// The child has its own copies of these ends.
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p.cmd = ec
	p.exited = make(chan struct{})
	p.child = proctree.NewChild(p.tag, ec.Process.Pid, p.exited)
	go func() {
		p.err = ec.Wait()
		close(p.exited)
	}()
	return inW, outR, nil
}

// pid is the child's process id, which is also its process group id, or 0
// when it never started.
func (p *process) pid() int {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// stop ends the agent and its tree (proctree.Child.Stop), after grace
// for it to exit on its own once its stdin was closed.
func (p *process) stop(grace time.Duration) error { return p.child.Stop(grace) }

// remember looks at the tree while the agent still runs, before Close asks
// it to stop (proctree.Child.Remember).
func (p *process) remember() { p.child.Remember() }
