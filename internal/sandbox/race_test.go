//go:build race

package sandbox

// The race detector makes the VM several times slower, so under it an
// expression may reach the time limit before the steps or memory limit.
const raceEnabled = true
