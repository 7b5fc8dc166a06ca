//go:build linux

package acp

import "syscall"

// sysProcAttr puts the child in a process group of its own, so Close can
// kill everything it started, and asks the kernel to SIGKILL it when
// patchbay dies (an agent may ignore its stdin closing). Pdeathsig fires
// when the OS thread that started the child exits; the Go runtime only
// ends threads of goroutines that exit while locked to them, which this
// package does not do.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
