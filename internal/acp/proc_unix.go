//go:build unix

package acp

import (
	"fmt"
	"os"
	"syscall"
)

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
