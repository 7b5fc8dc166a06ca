package proctree

import (
	"errors"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Child is a process patchbay started as the leader of a process group of
// its own, carrying its tree's tag (Tagged, SysProcAttr): a stdio MCP
// server, a coding agent. Stop ends it and everything it started: its
// group, and every process that carries the tag, such as a browser or a
// tool it started in a session of its own.
type Child struct {
	pid    int
	tree   *Tree           // remembers the groups and sessions its processes led
	exited <-chan struct{} // closed once the child has been reaped
}

// NewChild is the child pid of tree tag, reaped when exited is closed.
func NewChild(tag string, pid int, exited <-chan struct{}) *Child {
	return &Child{pid: pid, tree: NewTree(tag), exited: exited}
}

// Tagged is env with the tag in place of any the caller gave.
func Tagged(env []string, tag string) []string {
	return append(slices.DeleteFunc(slices.Clone(env), func(e string) bool {
		return strings.HasPrefix(e, Var+"=")
	}), Env(tag))
}

// treeWait bounds how long Stop keeps killing what the child left once it
// has exited (a process may fork while it is killed, or take a moment to
// die in the kernel).
const treeWait = 2 * time.Second

// Stop waits for the child to exit (after its caller closed its stdin),
// signals its tree (group and tagged processes) with SIGTERM and then
// SIGKILL when it takes longer than grace each time, and finally kills
// what is left of the tree: processes the child started in the background,
// or in a session of their own, do not exit with it. It returns within
// 2×grace+2s.
func (c *Child) Stop(grace time.Duration) error {
	if c == nil || c.pid <= 0 {
		return nil
	}
	wait := func() bool {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-c.exited:
			return true
		case <-t.C:
			return false
		}
	}
	if !wait() {
		c.signal(syscall.SIGTERM)
		if !wait() {
			c.signal(syscall.SIGKILL)
			<-c.exited
		}
	}
	err := SignalGroup(c.pid, syscall.SIGKILL)
	if _, terr := c.tree.Kill(treeWait); terr != nil {
		err = errors.Join(err, terr)
	}
	return err
}

// Remember looks at the tree while the child still runs, before it is
// asked to stop: the groups and sessions its processes lead are then
// killed even once their leaders have exited.
func (c *Child) Remember() {
	if c != nil && c.pid > 0 {
		_, _ = c.tree.Find()
	}
}

// signal sends sig to the child's process group and to the rest of its
// tree, found first: while the child still runs, its children are found
// by descent too, which they no longer are once it has died.
func (c *Child) signal(sig syscall.Signal) {
	procs, _ := c.tree.Find()
	_ = SignalGroup(c.pid, sig)
	for _, pr := range procs {
		_ = signalProcess(pr.PID, sig)
	}
}
