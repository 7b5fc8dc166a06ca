//go:build !linux

package proctree

import (
	"os"
	"time"
)

// Supported reports whether trees can be found here: not without /proc.
func Supported() bool { return false }

// Find finds nothing where there is no /proc.
func (t *Tree) Find() ([]Proc, error) { return nil, nil }

// Self is this process as an Owner, with no host: nothing is recorded for
// another process to sweep.
func Self() Owner { return Owner{PID: os.Getpid()} }

// Alive cannot tell where there is no /proc, and says yes so that no
// sweep acts on it.
func Alive(Owner) bool { return true }

// End has no tree to end where there is no /proc: only the server's own
// process group is killed (by its caller).
func (t *Tree) End(time.Duration, time.Duration) (int, error) { return 0, nil }

// Kill: see End.
func (t *Tree) Kill(time.Duration) (int, error) { return 0, nil }
