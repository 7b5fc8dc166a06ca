//go:build !unix

package acp

import (
	"errors"
	"os"
	"syscall"
)

// sysProcAttr has nothing to add where there are no process groups.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup kills the child itself where there are no process groups;
// anything it started survives it.
func signalGroup(pid int, _ syscall.Signal) error {
	if pid <= 0 {
		return nil
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	if err := p.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

// signalProcess has nothing to signal: no tree is found without /proc.
func signalProcess(int, syscall.Signal) error { return nil }

// exitStatusOf is how a terminal's command ended: its exit code.
func exitStatusOf(ps *os.ProcessState) exitStatus {
	code := ps.ExitCode()
	return exitStatus{ExitCode: &code}
}
