package fault

import "fmt"

// Failure kinds: the code of a failed execution or step (ExecError.Code),
// named apart from node kinds (document.Kind…) and ledger entry kinds
// (agent.Entry…), which share the word elsewhere.
const (
	StepFailed            = "step_failed"
	SteeringDenied        = "steering_denied"
	ConnectionUnavailable = "connection_unavailable"
	Timeout               = "timeout"
	Cancelled             = "cancelled"
	// LeaseTimeout: a run waited too long for a lease.
	LeaseTimeout = "lease_timeout"
	// OutputInvalid: a model node's final answer is not JSON matching its
	// output schema.
	OutputInvalid = "output_invalid"
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

// Denied is a call refused at a gate.
type Denied struct {
	Gate   int
	Reason string
}

func (d *Denied) Error() string { return fmt.Sprintf("refused at gate %d: %s", d.Gate, d.Reason) }

// Deny is a call refused at gate for reason.
func Deny(gate int, reason string) *Denied { return &Denied{Gate: gate, Reason: reason} }
