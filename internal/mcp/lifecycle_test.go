package mcp_test

import (
	"errors"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

// TestReconnect: a stdio server that dies leaves its connection
// unavailable (calls fail fast) while others keep working; the registry
// reconnects it, with a new identity instance.
func TestReconnect(t *testing.T) {
	t.Parallel()
	reg := registry.NewRegistry(slog.New(slog.DiscardHandler))
	for _, name := range []string{"flaky", "steady"} {
		if err := reg.Add(name, pbmcp.New(name, config.MCP{Command: demoBin}, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if err := reg.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	flaky, _ := reg.Get("flaky")
	steady, _ := reg.Get("steady")
	before := flaky.Status()
	pid, _ := before.Info["pid"].(int)
	if before.State != connect.StateReady || pid <= 0 || before.Info["era"] == "" || before.Operations == 0 {
		t.Fatalf("status = %+v", before)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	waitFor(t, "unavailable", func() bool { return flaky.Status().State == connect.StateUnavailable })
	if s := flaky.Status(); s.LastError == "" || s.Since.Before(before.Since) {
		t.Errorf("unavailable status = %+v", s)
	}
	start := time.Now()
	if _, err := flaky.Call(t.Context(), connect.CallRequest{Op: "echo", Args: map[string]any{"text": "x"}}); !errors.Is(err, connect.ErrUnavailable) {
		t.Errorf("call while down: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("call while down took %v; want fail-fast", d)
	}
	if _, err := steady.Call(t.Context(), connect.CallRequest{Op: "echo", Args: map[string]any{"text": "x"}}); err != nil {
		t.Errorf("the other connection: %v", err)
	}

	waitFor(t, "reconnected", func() bool { return flaky.Status().State == connect.StateReady })
	after := flaky.Status()
	if after.Identity.Instance == before.Identity.Instance || after.Info["pid"] == pid {
		t.Errorf("identity not replaced: before %+v after %+v", before.Identity, after.Identity)
	}
	if _, err := flaky.Call(t.Context(), connect.CallRequest{Op: "echo", Args: map[string]any{"text": "x"}}); err != nil {
		t.Errorf("call after reconnect: %v", err)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within 15s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
