//go:build unix && !linux

package acp

import "syscall"

// sysProcAttr puts the child in a process group of its own, so Close can
// kill everything it started. There is no parent-death signal outside
// Linux, so a child may outlive a patchbay that is killed outright.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
