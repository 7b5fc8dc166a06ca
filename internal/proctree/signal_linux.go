//go:build linux

package proctree

import "syscall"

// SysProcAttr puts a child in a process group of its own, so Stop can kill
// everything it started, and asks the kernel to SIGKILL it when patchbay
// dies (a child may ignore its stdin closing). Pdeathsig fires when the OS
// thread that started the child exits; the Go runtime only ends threads of
// goroutines that exit while locked to them, which patchbay does not do.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
