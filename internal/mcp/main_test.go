package mcp_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// demoBin is cmd/demo-mcp, built once for the tests that run it as a child.
var demoBin string

func TestMain(m *testing.M) {
	if mode := os.Getenv("PATCHBAY_FAKE_MCP"); mode != "" {
		// The test binary doubles as a misbehaving stdio server.
		os.Exit(fakeStdio(mode, os.Stdin, os.Stdout))
	}
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "patchbay-mcp-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	demoBin = filepath.Join(dir, "demo-mcp")
	if runtime.GOOS == "windows" {
		demoBin += ".exe"
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	build := exec.Command(gobin, "build", "-o", demoBin, "github.com/patchbay-dev/patchbay/cmd/demo-mcp")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build cmd/demo-mcp: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}
