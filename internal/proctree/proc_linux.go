//go:build linux

package proctree

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
)

// Supported reports whether trees can be found here (Linux, /proc).
func Supported() bool { return true }

// Find returns the live processes of the tree (see the package doc), and
// the members of the groups and sessions its processes led when it was
// found before, never patchbay itself nor its ancestors. Zombies are left
// out: they hold nothing and cannot be signalled away.
func (t *Tree) Find() ([]Proc, error) {
	if t.Tag == "" {
		return nil, nil
	}
	all, err := procfs.AllProcs()
	if err != nil {
		return nil, fmt.Errorf("proctree: list processes: %w", err)
	}
	entry := Env(t.Tag)
	procs := map[int]Proc{}
	children := map[int][]int{}
	found := map[int]bool{}
	for _, p := range all {
		st, err := p.Stat()
		if err != nil || st.State == "Z" {
			continue // gone meanwhile, or a zombie
		}
		procs[p.PID] = Proc{PID: p.PID, PPID: st.PPID, PGID: st.PGRP, SID: st.Session, Comm: st.Comm}
		children[st.PPID] = append(children[st.PPID], p.PID)
		if env, err := p.Environ(); err == nil && slices.Contains(env, entry) {
			found[p.PID] = true
		}
	}
	// Groups and sessions led by a tagged process, now or when last found
	// (a browser's helpers outlive it for a moment).
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.leads == nil {
		t.leads = map[int]bool{}
	}
	for pid := range found {
		if p := procs[pid]; p.PGID == pid || p.SID == pid {
			t.leads[pid] = true
		}
	}
	members := map[int]bool{}
	for pid, p := range procs {
		for _, g := range []int{p.PGID, p.SID} {
			if t.leads[g] {
				found[pid], members[g] = true, true
			}
		}
	}
	// A group or session with no member left is over; its id may be
	// reused.
	for g := range t.leads {
		if !members[g] {
			delete(t.leads, g)
		}
	}
	// Descendants of everything found.
	queue := make([]int, 0, len(found))
	for pid := range found {
		queue = append(queue, pid)
	}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range children[pid] {
			if !found[c] {
				found[c] = true
				queue = append(queue, c)
			}
		}
	}
	// Never patchbay nor what it runs under.
	for pid := os.Getpid(); pid > 0; pid = procs[pid].PPID {
		delete(found, pid)
		if _, ok := procs[pid]; !ok {
			break
		}
	}
	delete(found, 1)
	out := make([]Proc, 0, len(found))
	for pid := range found {
		out = append(out, procs[pid])
	}
	slices.SortFunc(out, func(a, b Proc) int { return a.PID - b.PID })
	return out, nil
}

// Self is this process as an Owner.
var Self = sync.OnceValue(func() Owner {
	o := Owner{Host: host(), PID: os.Getpid()}
	if p, err := procfs.Self(); err == nil {
		if st, err := p.Stat(); err == nil {
			o.Start = st.Starttime
		}
	}
	return o
})

// host names the set of processes this process can see and signal: the
// kernel's boot and this pid namespace. "" when /proc does not say.
func host() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(boot)) + "/" + ns
}

// Alive reports whether o, a process of this host, is still running.
func Alive(o Owner) bool {
	p, err := procfs.NewProc(o.PID)
	if err != nil {
		return false
	}
	st, err := p.Stat()
	return err == nil && st.State != "Z" && st.Starttime == o.Start
}

// End ends the tree: SIGTERM to every process found (SIGKILL
// when grace is zero), then SIGKILL to whatever is still found grace
// later, until nothing is found or wait has passed. It returns the number
// of processes it signalled, and an error when some were still running at
// the end.
func (t *Tree) End(grace, wait time.Duration) (int, error) {
	if t.Tag == "" {
		return 0, nil
	}
	signalled := map[int]bool{}
	signal := func(sig syscall.Signal) int {
		procs, _ := t.Find()
		for _, p := range procs {
			if syscall.Kill(p.PID, sig) == nil {
				signalled[p.PID] = true
			}
		}
		return len(procs)
	}
	first := syscall.SIGTERM
	if grace <= 0 {
		first = syscall.SIGKILL
	}
	if signal(first) == 0 {
		return 0, nil
	}
	deadline := time.Now().Add(wait)
	killAt := time.Now().Add(grace)
	for {
		time.Sleep(20 * time.Millisecond)
		var left int
		if time.Now().After(killAt) {
			left = signal(syscall.SIGKILL)
		} else {
			procs, _ := t.Find()
			left = len(procs)
		}
		if left == 0 {
			return len(signalled), nil
		}
		if time.Now().After(deadline) {
			return len(signalled), fmt.Errorf("proctree: %d processes of %s still running after %s", left, t.Tag, wait)
		}
	}
}

// Kill sends SIGKILL to every process of the tree, until none is found or
// wait has passed (a process may fork while it is killed).
func (t *Tree) Kill(wait time.Duration) (int, error) { return t.End(0, wait) }
