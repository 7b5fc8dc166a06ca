package fault

import "fmt"

// Run-time failure kinds, the code of a failed execution or step.
const (
	KindStepFailed            = "step_failed"
	KindSteeringDenied        = "steering_denied"
	KindConnectionUnavailable = "connection_unavailable"
	KindTimeout               = "timeout"
	KindCancelled             = "cancelled"
)

// Gate numbers, in the order every call passes them.
const (
	GateDeclared = 1 // the operation exists and is declared
	GateSchema   = 2 // the arguments match the operation's schema
	GateRefs     = 3 // refs were issued to this thread by this connection
	GatePolicy   = 4 // the connection's policy
	GateApprover = 5 // a person approves
	GateSecrets  = 6 // secrets filled in, then sent
)

// denied is a call refused at a gate.
type Denied struct {
	Gate   int
	Reason string
}

func (d *Denied) Error() string { return fmt.Sprintf("refused at gate %d: %s", d.Gate, d.Reason) }

// Deny is a call refused at gate for reason.
func Deny(gate int, reason string) *Denied { return &Denied{Gate: gate, Reason: reason} }

// KindLeaseTimeout is the code of a run that waited too long for a lease.
const KindLeaseTimeout = "lease_timeout"
