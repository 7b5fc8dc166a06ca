//go:build unix

package mcp_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
	"github.com/patchbay-dev/patchbay/internal/proctree"
)

// alive reports whether pid is a running process. A zombie is not running:
// a background process whose parent exited is reaped by init, which in a
// container may never happen.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // no /proc: trust kill
	}
	// The state follows the parenthesised command name.
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

// readPID waits for a shell to write a pid to file.
func readPID(t *testing.T, file string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, err := os.ReadFile(file)
		if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil && pid > 0 {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pid in %s: %v", file, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCloseKillsProcessGroup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bgFile := filepath.Join(dir, "bg.pid")
	// The server starts a background process, as npx-launched servers do,
	// which stdin closing does not stop.
	script := `sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$BG_PID_FILE"; exec "$DEMO"`
	spec := config.MCP{
		Command: "/bin/sh",
		Args:    []string{"-c", script},
		Env:     map[string]string{"BG_PID_FILE": bgFile, "DEMO": demoBin},
	}
	conn, err := pbmcp.New("group", spec, nil).Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := conn.Info()["pid"].(int)
	bg := readPID(t, bgFile)
	if pid <= 0 || !alive(pid) || !alive(bg) {
		t.Fatalf("server pid %d (alive %v), background pid %d (alive %v)", pid, alive(pid), bg, alive(bg))
	}
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
		t.Errorf("server process group = %d, %v; want its own (%d)", pgid, err, pid)
	}
	if err := conn.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitGone(t, "server", pid)
	waitGone(t, "background process", bg)
	if err := conn.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// closeBound is how long Close may take to end a stdio server's whole
// tree: 2 s for the server to exit once its stdin closes, 2 s after
// SIGTERM, then SIGKILL, and up to 2 s killing what it left.
const closeBound = 6 * time.Second

// TestCloseKillsATreeThatIgnoresSIGTERM: the server, and every child it
// started, ignore SIGTERM, and the server does not exit when its stdin
// closes. One child stays in the server's process group, one starts a
// session of its own (as Playwright starts its browser), and one also
// clears its environment. Close ends them all within closeBound.
func TestCloseKillsATreeThatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name string) string { return filepath.Join(dir, name) }
	script := `trap '' TERM
sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$DIR/group.pid"
setsid sh -c 'echo $$ > "$DIR/session.pid"; exec sleep 300' </dev/null >/dev/null 2>&1 &
env -i setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$DIR/bare.pid"
"$DEMO"
exec sleep 300`
	spec := config.MCP{
		Command: "/bin/sh",
		Args:    []string{"-c", script},
		Env:     map[string]string{"DIR": dir, "DEMO": demoBin},
	}
	tag := proctree.NewTag()
	conn, err := pbmcp.New("stubborn", spec, nil).Connect(proctree.WithTag(t.Context(), tag))
	if err != nil {
		t.Fatal(err)
	}
	server, _ := conn.Info()["pid"].(int)
	pids := map[string]int{"server": server}
	for _, name := range []string{"group", "session", "bare"} {
		pids[name] = readPID(t, file(name+".pid"))
	}
	for name, pid := range pids {
		if !alive(pid) {
			t.Fatalf("%s (pid %d) is not running before Close", name, pid)
		}
	}
	if sid, _ := sessionOf(pids["session"]); sid != pids["session"] {
		t.Fatalf("the session child leads session %d, want its own", sid)
	}
	found, err := proctree.Find(tag)
	if err != nil || len(found) < len(pids) {
		t.Fatalf("Find(tag) = %v, %v: want at least the %d processes started", found, err, len(pids))
	}

	start := time.Now()
	if err := conn.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	took := time.Since(start)
	// Close returns once it has killed them; a killed process may take a
	// moment to be reaped.
	for name, pid := range pids {
		deadline := time.Now().Add(time.Second)
		for alive(pid) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if alive(pid) {
			t.Errorf("%s (pid %d) still running after Close", name, pid)
		}
	}
	if took > closeBound+3*time.Second {
		t.Errorf("Close took %s, want within %s", took, closeBound)
	}
	if left, _ := proctree.Find(tag); len(left) > 0 {
		t.Errorf("processes of the tree left: %v", left)
	}
	t.Logf("Close ended the tree in %s", took.Round(time.Millisecond))
}

// sessionOf reads a process's session id from /proc.
func sessionOf(pid int) (int, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	_, after, _ := strings.Cut(string(stat), ") ")
	f := strings.Fields(after)
	if len(f) < 4 {
		return 0, errors.New("short stat")
	}
	return strconv.Atoi(f[3])
}

func TestConnectFailureKillsChild(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	// A child that never answers: connect times out and must not leave it
	// behind.
	spec := config.MCP{
		Command:   "/bin/sh",
		Args:      []string{"-c", `echo $$ > "$PID_FILE"; exec sleep 300`},
		Env:       map[string]string{"PID_FILE": pidFile},
		TimeoutMs: 300,
	}
	start := time.Now()
	conn, err := pbmcp.New("mute", spec, nil).Connect(t.Context())
	if err == nil {
		conn.Close()
		t.Fatal("Connect succeeded")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want a deadline", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Connect took %v", d)
	}
	waitGone(t, "child", readPID(t, pidFile))
}

func TestStdioEnvironmentAndCwd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	spec := config.MCP{
		Command: "/bin/sh",
		Args:    []string{"-c", `env > env.txt; pwd > pwd.txt; exec "$DEMO"`},
		Env:     map[string]string{"DEMO": demoBin, "FOO": "bar", "HOME": "/configured/home"},
		Cwd:     dir,
	}
	openConn(t, "env", spec, nil)
	env, err := os.ReadFile(filepath.Join(dir, "env.txt"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for line := range strings.Lines(string(env)) {
		k, v, _ := strings.Cut(strings.TrimRight(line, "\n"), "=")
		vars[k] = v
	}
	if vars["FOO"] != "bar" || vars["HOME"] != "/configured/home" || vars["PATH"] != os.Getenv("PATH") {
		t.Errorf("child environment: %v", vars)
	}
	// The shell adds a few of its own.
	allowed := map[string]bool{"DEMO": true, "FOO": true, "HOME": true, "PATH": true, "PWD": true, "OLDPWD": true, "SHLVL": true, "_": true,
		proctree.Var: true}
	for k := range vars {
		if !allowed[k] {
			t.Errorf("child inherited %s", k)
		}
	}
	pwd, err := os.ReadFile(filepath.Join(dir, "pwd.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.EvalSymlinks(dir)
	if got, _ := filepath.EvalSymlinks(strings.TrimSpace(string(pwd))); got != want {
		t.Errorf("child cwd = %s, want %s", got, want)
	}
}

func TestCallAfterServerDied(t *testing.T) {
	t.Parallel()
	conn := openConn(t, "dies", config.MCP{Command: demoBin}, nil)
	pid, _ := conn.Info()["pid"].(int)
	if pid <= 0 {
		t.Fatalf("no pid in %v", conn.Info())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "server", pid)
	_, err := conn.Call(t.Context(), connect.CallRequest{Op: "echo", Args: map[string]any{"text": "x"}})
	if !errors.Is(err, connect.ErrUnavailable) {
		t.Errorf("err = %v, want ErrUnavailable", err)
	}
}
