package mcp

import (
	"context"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// process is the child of a stdio connection. mcp-go starts and reaps it;
// process builds its exec.Cmd (own process group, working directory, no
// inherited environment) and makes sure the group is gone on Close.
type process struct {
	dir string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// command is mcp-go's CommandFunc. It uses exec.Command rather than
// CommandContext: the context mcp-go passes is the one Start was given, and
// the child must live until Close, not until some context ends.
func (p *process) command(_ context.Context, command string, env, args []string) (*exec.Cmd, error) {
	cmd := exec.Command(command, args...)
	cmd.Env = env
	cmd.Dir = p.dir
	cmd.SysProcAttr = sysProcAttr()
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	return cmd, nil
}

// pid is the child's process id, which is also its process group id, or 0
// when it never started.
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// stop waits for done (mcp-go's Close, which closes stdin and reaps the
// child), signals the group with SIGTERM and then SIGKILL when the child
// takes longer than grace each time, and finally kills what is left of the
// group: processes the server started in the background do not exit with
// it.
func (p *process) stop(done <-chan error, grace time.Duration) error {
	pid := p.pid()
	if pid <= 0 {
		<-done
		return nil
	}
	wait := func() bool {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-done:
			return true
		case <-t.C:
			return false
		}
	}
	if !wait() {
		_ = signalGroup(pid, syscall.SIGTERM)
		if !wait() {
			_ = signalGroup(pid, syscall.SIGKILL)
			<-done
		}
	}
	return signalGroup(pid, syscall.SIGKILL)
}
