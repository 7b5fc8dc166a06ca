//go:build unix && !linux

package proctree

import "syscall"

// SysProcAttr puts a child in a process group of its own, so Stop can kill
// everything it started. There is no parent-death signal outside Linux, so
// a child may outlive a patchbay that is killed outright.
func SysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
