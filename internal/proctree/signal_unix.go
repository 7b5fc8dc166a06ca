//go:build unix

package proctree

import (
	"errors"
	"fmt"
	"syscall"
)

// SignalGroup signals every process in the group pgid. A group that is
// already empty is not an error.
func SignalGroup(pgid int, sig syscall.Signal) error {
	if pgid <= 0 {
		// kill(0) or kill(-1) would signal patchbay's own group or every
		// process it may signal.
		return nil
	}
	if err := syscall.Kill(-pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal process group %d: %w", pgid, err)
	}
	return nil
}

// signalProcess signals one process; one already gone is not an error.
func signalProcess(pid int, sig syscall.Signal) error {
	if pid <= 1 {
		return nil
	}
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal process %d: %w", pid, err)
	}
	return nil
}
