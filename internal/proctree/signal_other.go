//go:build !unix

package proctree

import (
	"errors"
	"os"
	"syscall"
)

// SysProcAttr has nothing to add where there are no process groups.
func SysProcAttr() *syscall.SysProcAttr { return nil }

// SignalGroup kills the child itself where there are no process groups;
// anything it started survives it.
func SignalGroup(pid int, _ syscall.Signal) error {
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
