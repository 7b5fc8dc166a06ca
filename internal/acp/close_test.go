//go:build linux

package acp

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCloseStubbornAgent closes an agent that ignores stdin EOF and
// SIGTERM and left a process in a session of its own: Close kills both
// within its bound.
func TestCloseStubbornAgent(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pids")
	conn, err := Start(t.Context(), fakeCommand(t, "stubborn", "ACP_PID_FILE="+pidFile), &recorder{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pids := readPIDs(t, pidFile)
	start := time.Now()
	if err := conn.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	// 2×CloseGrace (1s each) and the tree sweep; never the sleeper's hour.
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %s", d)
	} else if d < time.Second {
		t.Errorf("Close took %s: the agent had no grace", d)
	}
	waitGone(t, "the stubborn agent", pids[0])
	waitGone(t, "its sleeper in a session of its own", pids[1])
	select {
	case <-conn.Done():
	default:
		t.Error("Done not closed after Close")
	}
}

// readPIDs waits for the stubborn agent to write its pid and its
// sleeper's.
func readPIDs(t *testing.T, file string) []int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(file)
		if fields := strings.Fields(string(b)); len(fields) == 2 {
			var pids []int
			for _, f := range fields {
				pid, err := strconv.Atoi(f)
				if err != nil {
					t.Fatal(err)
				}
				pids = append(pids, pid)
			}
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("no pids in %s", file)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
