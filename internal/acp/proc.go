package acp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/patchbay-dev/patchbay/internal/proctree"
)

// process is the agent's child process. Like a stdio MCP server's
// (internal/mcp), it runs in a process group of its own with exactly the
// environment it is given plus its tree's tag (internal/proctree), so that
// Close can end everything it started: its group, and every process that
// carries the tag, such as a tool it started in a session of its own.
type process struct {
	tag  string
	tree *proctree.Tree // remembers the groups and sessions its processes led

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
	ec.Env = tagged(cmd.Env, p.tag)
	ec.Dir = cmd.Dir
	ec.SysProcAttr = sysProcAttr()
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
	p.tree = proctree.NewTree(p.tag)
	p.exited = make(chan struct{})
	go func() {
		p.err = ec.Wait()
		close(p.exited)
	}()
	return inW, outR, nil
}

// tagged is env with the tree's tag in place of any the caller gave.
func tagged(env []string, tag string) []string {
	return append(slices.DeleteFunc(slices.Clone(env), func(e string) bool {
		return strings.HasPrefix(e, proctree.Var+"=")
	}), proctree.Env(tag))
}

// pid is the child's process id, which is also its process group id, or 0
// when it never started.
func (p *process) pid() int {
	if p == nil || p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// treeWait bounds how long stop keeps killing what the agent left once it
// has exited (a process may fork while it is killed, or take a moment to
// die in the kernel).
const treeWait = 2 * time.Second

// stop waits for the child to exit after its stdin was closed, signals its
// tree (group and tagged processes) with SIGTERM and then SIGKILL when it
// takes longer than grace each time, and finally kills what is left of the
// tree: processes the agent started in the background, or in a session of
// their own, do not exit with it. It returns within 2×grace+treeWait.
func (p *process) stop(grace time.Duration) error {
	pid := p.pid()
	if pid <= 0 {
		return nil
	}
	wait := func() bool {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-p.exited:
			return true
		case <-t.C:
			return false
		}
	}
	if !wait() {
		p.signal(syscall.SIGTERM)
		if !wait() {
			p.signal(syscall.SIGKILL)
			<-p.exited
		}
	}
	err := signalGroup(pid, syscall.SIGKILL)
	if _, terr := p.tree.Kill(treeWait); terr != nil {
		err = errors.Join(err, terr)
	}
	return err
}

// remember looks at the tree while the agent still runs, before Close asks
// it to stop: the groups and sessions its processes lead are then killed
// even once their leaders have exited.
func (p *process) remember() {
	if p.pid() > 0 {
		_, _ = p.tree.Find()
	}
}

// signal sends sig to the child's process group and to the rest of its
// tree, found first: while the child still runs, its children are found
// by descent too, which they no longer are once it has died.
func (p *process) signal(sig syscall.Signal) {
	procs, _ := p.tree.Find()
	_ = signalGroup(p.pid(), sig)
	for _, pr := range procs {
		_ = signalProcess(pr.PID, sig)
	}
}
