package harness

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// Tool calls from outside the engine: the MCP face (/mcp) offers a
// caller the operations its allowlist grants, by the names a model node
// without tools sees, and runs each call as an execution of its own.
//
// Why one execution per call rather than one per MCP session: the
// 2026-07-28 era has no session, and a session-long execution would fight
// the claim, the repair sweep and resume (it never ends). An execution per
// call gets, unchanged, everything a call step has: the six gates with
// the caller as principal, parking while an approval is pending (no worker
// held), resume on any replica after a crash, takeover, once-records,
// events, listing and the admin UI. Its one node's id is "tool:<call id>",
// so its idempotency key is "<execution>:tool:<call id>".
//
// Refs are sealed to the caller's scope (RefScope: the principal and, in
// the 2025 era, the session) rather than to the execution, so a ref one
// call returns is accepted by the caller's next call and refused in
// another caller's.

// ToolCaller is who calls tools from outside: a principal and the
// allowlist bounding it.
type ToolCaller struct {
	Principal string
	Allowlist string
}

// callIDPattern bounds a client-chosen call id: it becomes part of a
// step id and of the idempotency key.
var callIDPattern = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,100}$`)

// ValidCallID reports whether id may name a tool call.
func ValidCallID(id string) bool { return callIDPattern.MatchString(id) }

// ToolOffer is what a caller may call, read once: the tools and the
// allowlist they were cut to, so that a call of a listed tool is checked
// against the grants it was listed under, without reading them again.
type ToolOffer struct {
	ts *agent.ToolSet
	al *gates.Allowlist
}

// List is the offered tools.
func (o *ToolOffer) List() []agent.ModelTool { return o.ts.List() }

// Tools reads what the caller may call: each connection its allowlist
// grants that is ready now, cut to the granted operations, named as a
// model node without tools names them ("<connection>_<op>", merged tools
// with a target). A connection not ready (starting, failed, needing an
// operator's sign-in) is left out until it is.
func (e *Executions) Tools(ctx context.Context, c ToolCaller) (*ToolOffer, error) {
	al, err := e.allowlist(ctx, c.Allowlist)
	if err != nil {
		return nil, fmt.Errorf("tools: allowlist %s: %w", c.Allowlist, err)
	}
	var names []string
	if al != nil {
		for name := range al.Connections {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	doc := &document.Document{}
	var turn []agent.ToolSource
	for _, name := range names {
		conn, err := e.reg.Get(name)
		if err != nil || conn.State() != connect.StateReady {
			continue
		}
		if conn.Access().ActsAsUser() && forNoOne(c.Principal) {
			continue
		}
		ops := agent.GrantedOps(al, false, name, nil, conn.Manifest().Operations)
		if len(ops) > 0 {
			turn = append(turn, agent.SourceOf(doc, name, ops))
		}
	}
	ts, err := agent.BuildToolSet(turn, nil, false)
	if err != nil {
		return nil, err
	}
	return &ToolOffer{ts: ts, al: al}, nil
}

// ToolCall is one call of a tool Tools listed.
type ToolCall struct {
	ToolCaller
	// CallID names the call across retries: the same caller's same id
	// is the same execution, so a retry after a timeout or an approval
	// gets the first call's outcome instead of calling again. Empty: a
	// fresh one.
	CallID string
	// Scope is what refs are sealed to (see RefScope on the record).
	Scope string
	// HoldLeases: the scope (an MCP session) holds the leases its calls
	// take from pools, across calls, until ReleaseHeld; false: each call
	// leases afresh and gives the lease back.
	HoldLeases bool
	Tool       string
	Args       map[string]any
	// Offer is what the caller was offered in this request (Tools); nil:
	// read now.
	Offer *ToolOffer
}

// Errors of CallTool, matched with errors.Is.
var (
	// ErrUnknownTool: the caller is offered no tool of that name.
	ErrUnknownTool = errors.New("no such tool")
	// ErrCallIDReused: the call id was used with another tool or
	// other arguments.
	ErrCallIDReused = errors.New("this call id was used for another call")
)

// CallTool starts the call as an execution the caller owns and returns
// it (queued); Wait follows it. A retry with the same call id returns the
// execution the first one started.
func (e *Executions) CallTool(ctx context.Context, tc ToolCall) (*Execution, error) {
	if tc.CallID == "" {
		tc.CallID = newCallID()
	}
	if !ValidCallID(tc.CallID) {
		return nil, fmt.Errorf("tools: call id %q: %w", tc.CallID, fault.Errorf(fault.CodeValidationFailed, "a call id is 1 to 100 letters, digits, '.', '_', ':' or '-'"))
	}
	offer := tc.Offer
	if offer == nil {
		var err error
		if offer, err = e.Tools(ctx, tc.ToolCaller); err != nil {
			return nil, err
		}
	}
	args := tc.Args
	if args == nil {
		args = map[string]any{}
	}
	conn, op, rest, err := offer.ts.Resolve(tc.Tool, args)
	if err != nil {
		return nil, fmt.Errorf("tools: %s: %w: %w", tc.Tool, ErrUnknownTool, err)
	}
	workflow, err := callDocument(tc.CallID, conn, op, rest)
	if err != nil {
		return nil, err
	}
	// The execution's id is the call's (callExecutionID): a retry with
	// the same call id writes nothing new and answers the first call's
	// execution, with no claim to take and complete around the submit.
	req := Request{Workflow: workflow, Principal: tc.Principal, Allowlist: tc.Allowlist, ID: callExecutionID(tc.Principal, tc.CallID), RefScope: tc.Scope}
	if tc.HoldLeases {
		req.LeaseHolder = tc.Scope
	}
	// The call is checked under the allowlist its tool was found in.
	ex, fresh, err := e.submitUnder(ctx, req, offer.al)
	if err != nil || fresh {
		return ex, err
	}
	if same, err := e.sameCall(ctx, ex.ID, workflow); err != nil || !same {
		if err == nil {
			err = fmt.Errorf("tools: call id %s: %w", tc.CallID, ErrCallIDReused)
		}
		return nil, err
	}
	return ex, nil
}

func newCallID() string { return "c_" + newExecutionID()[3:] }

// callExecutionID is the id of the execution a caller's call id runs as:
// the same for every retry of the call, another for another caller's.
func callExecutionID(principal, callID string) string {
	sum := sha256.Sum256([]byte("tools/call\x00" + principal + "\x00" + callID))
	return "ex_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// sameCall reports whether the execution id runs workflow: a call id
// reused for another tool or other arguments does not.
func (e *Executions) sameCall(ctx context.Context, id string, workflow json.RawMessage) (bool, error) {
	rec, err := e.load(ctx, id)
	if err != nil {
		return false, err
	}
	var had, want any
	if json.Unmarshal(rec.Workflow, &had) != nil || json.Unmarshal(workflow, &want) != nil {
		return false, nil
	}
	return reflect.DeepEqual(had, want), nil
}

// callDocument is the one-node document of a tool call. Every argument is
// a $literal: what a client sends is data, never an expression or a
// secret reference.
func callDocument(callID, conn, op string, args map[string]any) (json.RawMessage, error) {
	lits := make(map[string]any, len(args))
	for k, v := range args {
		lits[k] = map[string]any{"$literal": v}
	}
	doc := map[string]any{
		"version":     1,
		"connections": map[string]any{conn: map[string]any{}},
		"root":        map[string]any{"kind": "call", "id": ToolStepID(callID), "connection": conn, "op": op, "args": lits},
	}
	data, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("tools: encode call %s: %w", callID, err)
	}
	return data, nil
}

// ToolStepID is the step id of a tool call's node, so that its
// idempotency key is "<execution>:tool:<call id>".
func ToolStepID(callID string) string { return "tool:" + callID }

// ToolOutcome is where a tool call's execution stands, as its caller is
// answered.
type ToolOutcome struct {
	// Done: the execution ended; Output or Error is its result.
	Done   bool
	Output any
	Error  *ExecError
	// Approval is the pending approval the call waits for ("" when none).
	Approval string
	// Question is the last question the call's server asked ("" when
	// none; it may be decided already).
	Question string
}

// OutcomeOf reads a tool call's execution.
func OutcomeOf(ex *Execution) ToolOutcome {
	o := ToolOutcome{Done: ex.Status.Terminal(), Output: ex.Output, Error: ex.Error}
	for _, st := range ex.Steps {
		if st.Status == StepWaiting && st.ApprovalID != "" {
			o.Approval = st.ApprovalID
		}
		if st.Question != "" && (st.Status == StepPending || st.Status == StepWaiting) {
			o.Question = st.Question
		}
	}
	return o
}

// refScope is what the run's refs are sealed to and checked against: the
// record's RefScope, else the execution.
func (r *run) refScope() string {
	if r.rec.RefScope != "" {
		return r.rec.RefScope
	}
	return r.rec.ID
}

// RenewHeld renews the leases scope holds across calls (see
// ToolCall.HoldLeases) that no run holds now; a lease found reclaimed is
// forgotten, and the scope's next call leases afresh.
func (e *Executions) RenewHeld(ctx context.Context, scope string) {
	e.eachHeld(scope, func(held connect.HeldLeases, rec connect.LeaseRecord) {
		err := held.RenewRecord(ctx, rec)
		if errors.Is(err, connect.ErrLeaseLost) {
			e.held.CompareAndDelete(rec.Holder, rec)
		}
		if err != nil {
			e.logger.WarnContext(ctx, "held lease not renewed", "holder", rec.Holder, "lease", rec.ID, "err", err)
		}
	})
}

// ReleaseHeld gives back every lease scope holds across calls: its
// session ended.
func (e *Executions) ReleaseHeld(ctx context.Context, scope string) {
	e.eachHeld(scope, func(held connect.HeldLeases, rec connect.LeaseRecord) {
		e.held.CompareAndDelete(rec.Holder, rec)
		if err := held.ReleaseRecord(ctx, rec); err != nil {
			e.logger.WarnContext(ctx, "held lease not given back; it is reclaimed after the window", "holder", rec.Holder, "lease", rec.ID, "err", err)
		}
	})
}

func (e *Executions) eachHeld(scope string, fn func(connect.HeldLeases, connect.LeaseRecord)) {
	e.held.Range(func(k, v any) bool {
		if !strings.HasPrefix(k.(string), scope+"/") {
			return true
		}
		rec := v.(connect.LeaseRecord)
		pc, err := e.reg.Get(rec.Pool)
		if err != nil {
			return true
		}
		leaser, ok := pc.Leaser()
		if held, can := leaser.(connect.HeldLeases); ok && can {
			fn(held, rec)
		}
		return true
	})
}
