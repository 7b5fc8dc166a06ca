//go:build unix

package acp

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// signalGroup signals every process in the group pgid. A group that is
// already empty is not an error.
func signalGroup(pgid int, sig syscall.Signal) error {
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

// signalNames name the signals a command is commonly ended by.
var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGABRT: "SIGABRT", syscall.SIGKILL: "SIGKILL", syscall.SIGSEGV: "SIGSEGV",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGTERM: "SIGTERM", syscall.SIGBUS: "SIGBUS",
}

// exitStatusOf is how a terminal's command ended: its exit code, or the
// signal that killed it.
func exitStatusOf(ps *os.ProcessState) exitStatus {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		name, ok := signalNames[ws.Signal()]
		if !ok {
			name = fmt.Sprintf("signal %d", int(ws.Signal()))
		}
		return exitStatus{Signal: &name}
	}
	code := ps.ExitCode()
	return exitStatus{ExitCode: &code}
}
