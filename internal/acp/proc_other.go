//go:build !unix

package acp

import (
	"os"
)

// exitStatusOf is how a terminal's command ended: its exit code.
func exitStatusOf(ps *os.ProcessState) exitStatus {
	code := ps.ExitCode()
	return exitStatus{ExitCode: &code}
}
