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
	"github.com/patchbay-dev/patchbay/internal/harness"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
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
	connect(t, "env", spec, nil)
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
	allowed := map[string]bool{"DEMO": true, "FOO": true, "HOME": true, "PATH": true, "PWD": true, "OLDPWD": true, "SHLVL": true, "_": true}
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
	conn := connect(t, "dies", config.MCP{Command: demoBin}, nil)
	pid, _ := conn.Info()["pid"].(int)
	if pid <= 0 {
		t.Fatalf("no pid in %v", conn.Info())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, "server", pid)
	_, err := conn.Call(t.Context(), harness.CallRequest{Op: "echo", Args: map[string]any{"text": "x"}})
	if !errors.Is(err, harness.ErrUnavailable) {
		t.Errorf("err = %v, want ErrUnavailable", err)
	}
}
