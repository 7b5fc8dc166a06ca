//go:build linux

package proctree_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/proctree"
)

// startTree starts a shell tagged with tag that ignores SIGTERM and
// starts three sleepers that ignore it too: one in its process group, one
// in a session of its own (tagged through its environment), and one in a
// session of its own with an empty environment (found by descent). It
// returns their pids, the shell's first.
func startTree(t *testing.T, tag string) []int {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("/bin/sh", "-c", `trap '' TERM
sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$DIR/group"
setsid sh -c 'echo $$ > "$DIR/session"; exec sleep 300' </dev/null >/dev/null 2>&1 &
env -i setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$DIR/bare"
exec sleep 300`)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DIR=" + dir, proctree.Env(tag)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	pids := []int{cmd.Process.Pid}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	for _, name := range []string{"group", "session", "bare"} {
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, _ := os.ReadFile(filepath.Join(dir, name))
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				pids = append(pids, pid)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the %s sleeper did not start", name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return pids
}

func pidsOf(procs []proctree.Proc) []int {
	out := make([]int, 0, len(procs))
	for _, p := range procs {
		out = append(out, p.PID)
	}
	return out
}

func TestFindAndEndATree(t *testing.T) {
	t.Parallel()
	tag := proctree.NewTag()
	pids := startTree(t, tag)
	procs, err := proctree.Find(tag)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if !slices.Contains(pidsOf(procs), pid) {
			t.Errorf("Find = %v: pid %d of the tree (all: %v) missing", procs, pid, pids)
		}
	}
	if slices.Contains(pidsOf(procs), os.Getpid()) {
		t.Error("Find found the test process itself")
	}
	if other, _ := proctree.Find(proctree.NewTag()); len(other) != 0 {
		t.Errorf("another tag finds %v", other)
	}

	start := time.Now()
	n, err := proctree.End(tag, 200*time.Millisecond, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if n < len(pids) {
		t.Errorf("End signalled %d processes, want at least %d", n, len(pids))
	}
	if left, _ := proctree.Find(tag); len(left) != 0 {
		t.Errorf("left after End: %v", left)
	}
	for _, pid := range pids {
		if proctree.Alive(proctree.Owner{PID: pid, Start: startOf(pid)}) {
			t.Errorf("pid %d still running", pid)
		}
	}
	t.Logf("End took %s for %d processes", time.Since(start).Round(time.Millisecond), n)
}

// startOf is a process's start time (0 when it is gone).
func startOf(pid int) uint64 {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(stat), ')')
	f := strings.Fields(string(stat[i+1:]))
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

func TestOwner(t *testing.T) {
	t.Parallel()
	self := proctree.Self()
	if self.Host == "" || self.PID != os.Getpid() || self.Start == 0 {
		t.Fatalf("Self = %+v", self)
	}
	if !proctree.Alive(self) {
		t.Error("Self is not alive")
	}
	if proctree.Alive(proctree.Owner{Host: self.Host, PID: self.PID, Start: self.Start + 1}) {
		t.Error("a process with this pid but another start time is alive (a reused pid)")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if proctree.Alive(proctree.Owner{Host: self.Host, PID: cmd.Process.Pid, Start: 1}) {
		t.Error("an exited process is alive")
	}
}

func TestTagTravelsInContext(t *testing.T) {
	t.Parallel()
	if got := proctree.TagFrom(t.Context()); got != "" {
		t.Errorf("TagFrom(no tag) = %q", got)
	}
	tag := proctree.NewTag()
	if got := proctree.TagFrom(proctree.WithTag(t.Context(), tag)); got != tag {
		t.Errorf("TagFrom = %q, want %q", got, tag)
	}
	if proctree.NewTag() == tag || !strings.HasPrefix(proctree.Env(tag), proctree.Var+"=pt-") {
		t.Errorf("tags are not fresh or Env is %q", proctree.Env(tag))
	}
}

// TestTreeRemembersTheSessionsItsLeadersLed: a tagged session leader
// starts an untagged helper in its session and exits; a Tree that found
// the leader before still finds the helper, as a fresh look cannot.
func TestTreeRemembersTheSessionsItsLeadersLed(t *testing.T) {
	t.Parallel()
	tag := proctree.NewTag()
	dir := t.TempDir()
	cmd := exec.Command("setsid", "sh", "-c", `env -i sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$DIR/helper"; exec sleep 300`)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "DIR=" + dir, proctree.Env(tag)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	leader := cmd.Process.Pid
	var helper int
	deadline := time.Now().Add(10 * time.Second)
	for helper == 0 {
		b, _ := os.ReadFile(filepath.Join(dir, "helper"))
		helper, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		if time.Now().After(deadline) {
			t.Fatal("the helper did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Cleanup(func() { _ = syscall.Kill(helper, syscall.SIGKILL); _ = syscall.Kill(leader, syscall.SIGKILL) })

	tree := proctree.NewTree(tag)
	if procs, _ := tree.Find(); !slices.Contains(pidsOf(procs), helper) || !slices.Contains(pidsOf(procs), leader) {
		t.Fatalf("Find = %v, want the leader %d and its helper %d", procs, leader, helper)
	}
	if err := syscall.Kill(leader, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); proctree.Alive(proctree.Owner{PID: leader, Start: startOf(leader)}); {
		if time.Now().After(deadline) {
			t.Fatal("the leader did not exit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if procs, _ := proctree.Find(tag); slices.Contains(pidsOf(procs), helper) {
		t.Fatalf("a fresh look found the untagged helper of a dead leader: %v", procs)
	}
	if _, err := tree.Kill(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if proctree.Alive(proctree.Owner{PID: helper, Start: startOf(helper)}) {
		t.Error("the helper is still running after the tree's Kill")
	}
}
