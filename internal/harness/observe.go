package harness

import (
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// HealthObserver is implemented by an Observer that keeps the health
// figures beyond calls and states: how long executions and steps take,
// which gates refuse, how long approvals wait for a person.
type HealthObserver interface {
	// ExecutionDone records a finished execution, from its start to its
	// end (waits included).
	ExecutionDone(state ExecState, d time.Duration)
	// StepDone records a step other than a call or a sequence; outcome as
	// CallDone's.
	StepDone(kind, connection, op, outcome string, d time.Duration)
	// GateRefused counts a call refused at gate (1–6).
	GateRefused(gate int)
	// ApprovalDecided records a decision (approved, denied, expired) and
	// how long the approval waited for it.
	ApprovalDecided(state gates.ApprovalState, wait time.Duration)
	// LeaseWaited records how long a pool lease took to get.
	LeaseWaited(pool string, d time.Duration)
}

func (e *Executions) health() (HealthObserver, bool) {
	h, ok := e.observer.(HealthObserver)
	return h, ok
}

func (e *Executions) stepDone(kind, connection, op, outcome string, d time.Duration) {
	if h, ok := e.health(); ok {
		h.StepDone(kind, connection, op, outcome, d)
	}
}

func (e *Executions) gateRefused(gate int) {
	if h, ok := e.health(); ok {
		h.GateRefused(gate)
	}
}

func (e *Executions) leaseWaited(pool string, d time.Duration) {
	if h, ok := e.health(); ok {
		h.LeaseWaited(pool, d)
	}
}

// executionDone records a run that ended its execution.
func (e *Executions) executionDone(rec *record) {
	h, ok := e.health()
	if !ok || !rec.Status.Terminal() || rec.StartedAt == nil || rec.FinishedAt == nil {
		return
	}
	h.ExecutionDone(rec.Status, rec.FinishedAt.Sub(*rec.StartedAt))
}

// approvalDecided records a decision Approvals made.
func (e *Executions) approvalDecided(ap *gates.Approval) {
	h, ok := e.health()
	if !ok || ap.DecidedAt == nil {
		return
	}
	h.ApprovalDecided(ap.State, ap.DecidedAt.Sub(ap.CreatedAt))
}
