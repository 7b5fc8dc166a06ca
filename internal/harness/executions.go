package harness

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/refs"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// ExecState is where an execution is in its life.
type ExecState string

// Execution states.
const (
	ExecQueued    ExecState = "queued"
	ExecRunning   ExecState = "running"
	ExecWaiting   ExecState = "waiting"
	ExecSucceeded ExecState = "succeeded"
	ExecFailed    ExecState = "failed"
	ExecCancelled ExecState = "cancelled"
)

// Terminal reports whether s is final.
func (s ExecState) Terminal() bool {
	return s == ExecSucceeded || s == ExecFailed || s == ExecCancelled
}

// ValidExecState reports whether s names a state.
func ValidExecState(s string) bool {
	switch ExecState(s) {
	case ExecQueued, ExecRunning, ExecWaiting, ExecSucceeded, ExecFailed, ExecCancelled:
		return true
	}
	return false
}

// Execution is one run of a workflow document with an input.
type Execution struct {
	ID         string       `json:"id"`
	Status     ExecState    `json:"status"`
	Principal  string       `json:"principal,omitempty"`
	Input      any          `json:"input"`
	Output     any          `json:"output,omitempty"`
	Error      *ExecError   `json:"error,omitempty"`
	Steps      []StepRecord `json:"steps"`
	CreatedAt  time.Time    `json:"createdAt"`
	StartedAt  *time.Time   `json:"startedAt,omitempty"`
	FinishedAt *time.Time   `json:"finishedAt,omitempty"`
	// Rerun names the connections whose replaced identity this run may
	// run live (POST resume); it holds for that run only.
	Rerun []string `json:"rerun,omitempty"`
	// TraceID is the OpenTelemetry trace the execution's runs belong to
	// (see trace.go); empty when tracing is off.
	TraceID string `json:"traceId,omitempty"`
}

// ExecError says why an execution or a step failed.
type ExecError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Step    string `json:"step,omitempty"`
	// Gate names the gate (1–6) that refused a steering_denied call.
	Gate int `json:"gate,omitempty"`
}

// Step (ledger entry) states.
const (
	StepPending = "pending" // written before the call leaves
	StepWaiting = "waiting" // held at the approver
	StepDone    = "done"
	StepFailed  = "failed"
)

// StepRecord is the ledger entry of one step run: its result and timing,
// the idempotency key it sent and the identity of the connection it used.
// A resumed run replays done entries instead of calling again.
type StepRecord struct {
	Key            string            `json:"key"`
	ID             string            `json:"id"`
	Kind           string            `json:"kind"`
	Connection     string            `json:"connection,omitempty"`
	Op             string            `json:"op,omitempty"`
	Status         string            `json:"status"` // pending, waiting, done, failed
	IdempotencyKey string            `json:"idempotencyKey,omitempty"`
	Identity       *connect.Identity `json:"identity,omitempty"`
	ApprovalID     string            `json:"approval,omitempty"`
	// Question is the last question the call's server asked (see
	// questions.go).
	Question string `json:"question,omitempty"`
	// Input is what a parked call waits on: the questions its server
	// asked in its answer, and its state to send back (questions.go).
	Input *InputWait `json:"input,omitempty"`
	// Task is the id of the task the server runs a pending call as: a
	// resumed run waits on it instead of calling again.
	Task string `json:"task,omitempty"`
	// Cursor and Deadline of a wait: a resumed run listens again from the
	// cursor until the deadline.
	Cursor   string     `json:"cursor,omitempty"`
	Deadline *time.Time `json:"deadline,omitempty"`
	// Session and Tree of an acp-agent node: the agent's session id and
	// the tag of its process tree, so a resumed run loads the session and
	// ends what a crashed run left running.
	Session    string     `json:"session,omitempty"`
	Tree       string     `json:"tree,omitempty"`
	Output     any        `json:"output,omitempty"`
	Error      *ExecError `json:"error,omitempty"`
	StartedAt  time.Time  `json:"startedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	DurationMs int64      `json:"durationMs"`
}

// record is what is stored in Redis: the execution and the document it runs,
// so that any replica can run it.
type record struct {
	Execution
	Workflow json.RawMessage `json:"workflow"`
	// Leases are the pool leases the run holds or kept (a failed run), so
	// a resume within the reclaim window takes them back.
	Leases []connect.LeaseRecord `json:"leases,omitempty"`
	// Allowlist names the allowlist a submitted document was checked
	// against; model nodes cut their tools to it at run time. Nil for a
	// host document (a trigger's), which no allowlist bounds.
	Allowlist *string `json:"allowlist,omitempty"`
	// Trace is the trace context the execution's runs continue.
	Trace *traceRecord `json:"trace,omitempty"`
	// Thread is the thread ("<connection>:<thread>") a trigger's turn
	// runs on: its waits take their events through it and its final save
	// closes it (see threads.go). Empty for every other execution.
	Thread string `json:"thread,omitempty"`
	// RefScope binds the refs the run seals and accepts to a scope wider
	// than the execution: a tool caller's (see toolcalls.go). Empty: the
	// execution's id.
	RefScope string `json:"refScope,omitempty"`
	// LeaseHolder, when set, holds the run's pool leases instead of the
	// execution, across executions: leases are taken back from and kept
	// for it rather than given back (see toolcalls.go).
	LeaseHolder string `json:"leaseHolder,omitempty"`
}

func marshalRecord(rec *record) ([]byte, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("executions: encode %s: %w", rec.ID, err)
	}
	return data, nil
}

// Observer receives the figures the harness produces; the API turns them
// into metrics. Implementations must be safe for concurrent use.
type Observer interface {
	CallDone(connection, op, outcome string, d time.Duration)
	ExecutionEntered(state ExecState)
}

type nopObserver struct{}

func (nopObserver) CallDone(string, string, string, time.Duration) {}
func (nopObserver) ExecutionEntered(ExecState)                     {}

// ExecutionsOptions configure Executions; the zero value means defaults.
type ExecutionsOptions struct {
	// Retention is how long an execution record is kept after its last
	// change. Default 7 days.
	Retention time.Duration
	// Consumer names this replica in the work stream's consumer group, so
	// that unacknowledged work can be traced to (and later taken from) it.
	// Default: a random name.
	Consumer string
	Logger   *slog.Logger
	Observer Observer
	// Visibility is how long a work item or execution claim may go
	// unrenewed before another replica takes it over; claims are renewed
	// every third of it. Default 10s (see config.DefaultClaimTimeout).
	Visibility time.Duration
	// RepairEvery is how often this replica sweeps for executions left
	// unindexed or unqueued (see Repair). Default DefaultRepairEvery.
	RepairEvery time.Duration
	// ApprovalTTL is how long an approval waits for a decision before it
	// expires and the call is refused. Default 24h.
	ApprovalTTL time.Duration
	// Secrets resolves {"$secret": name} at gate 6; nil: no secrets.
	Secrets secrets.SecretStore
	// Redactor scrubs resolved secrets from everything stored or shown;
	// nil: a private one. Share it with the log handler so logs are
	// scrubbed too.
	Redactor secrets.Redactor
	// Sealer seals the refs calls return and opens them at gate 3; nil:
	// one over the same store.
	Sealer *refs.Sealer
	// Attacher connects the MCP servers documents bring themselves; nil:
	// such documents fail at their first call.
	Attacher Attacher
	// Allowlists bound what submitted documents may use; nil grants
	// nothing to untrusted submissions.
	Allowlists *gates.Allowlists
	// Credentials resolves per-caller credentials (OAuth tokens) at gate
	// 6; nil: every call goes out with its connection's own credentials.
	Credentials connect.Credentials
	// Models runs the rounds of model nodes; nil: documents with model
	// nodes are refused.
	Models agent.Models
	// Tracer records runs, steps, calls and model rounds as spans (see
	// trace.go); nil: no tracing, at no cost.
	Tracer trace.Tracer
	// Agents are the coding agents acp-agent nodes run, by name; nil:
	// documents with acp-agent nodes are refused.
	Agents map[string]AgentEntry
	// QuestionHold is how long a call is held while a question its
	// server asked waits for an answer. Default DefaultQuestionHold.
	QuestionHold time.Duration
	// SchemaMaxNodes bounds an operation schema gate 2 compiles (JSON
	// values, once repeated subschemas are shared); a larger one refuses
	// its calls at gate 2. Default DefaultSchemaMaxNodes.
	SchemaMaxNodes int
	// SchemaCompileTimeout bounds how long a call waits at gate 2 for its
	// operation's schema to compile; past it the call is refused (the
	// compile goes on, for the next call). Default
	// DefaultSchemaCompileTimeout.
	SchemaCompileTimeout time.Duration
}

// Attacher connects an MCP server a document brings, for one run. secrets
// holds the resolved values of the spec's header and env secrets.
type Attacher interface {
	Attach(ctx context.Context, spec document.AttachSpec, secrets map[string]string) (connect.Conn, error)
}

// Executions stores executions in Redis and runs them on workers that claim
// work items from a Redis stream shared by every replica.
type Executions struct {
	store       *store.Store
	reg         *registry.Registry
	retention   time.Duration
	consumer    string
	logger      *slog.Logger
	observer    Observer
	visibility  time.Duration
	approvalTTL time.Duration
	sweepEvery  time.Duration
	repairEvery time.Duration
	repairGrace time.Duration
	secrets     secrets.SecretStore
	attacher    Attacher
	redactor    secrets.Redactor
	allowlists  *gates.Allowlists
	// life is Run's context: work that outlives a run (renewing the
	// leases of waiting executions) stops with it.
	life      context.Context
	models    agent.Models
	tracer    trace.Tracer
	approvals *gates.Approvals
	// questions are the servers' questions; questionHold how long a call
	// waits for an answer (questions.go).
	questions    *gates.Questions
	questionHold time.Duration
	// pipeline is the gates every call passes.
	pipeline *gates.Pipeline
	// notify is the one subscription of this process to every
	// execution's cancel and done channels (see notifier).
	notify *notifier
	// finished hands an execution that finished here to its waiters here;
	// awaited are the ears Submits with Await opened, by execution id,
	// until their Wait takes them (handoff.go).
	finished handoff
	awaited  sync.Map
	// copies are the allowlists read lately (allowlists.go).
	copies allowlistCopies
	// held are the leases held across executions, by holder (see
	// toolcalls.go: an MCP session's).
	held sync.Map
	// agents are the config file's agents; bridges the live acp-agent
	// node runs by credential digest, reached at bridgeURL (bridge.go).
	agents    map[string]AgentEntry
	bridges   sync.Map
	bridgeURL atomic.Pointer[string]
}

const workGroup = "workers"

// NewExecutions returns the execution service over st and reg.
func NewExecutions(st *store.Store, reg *registry.Registry, opts *ExecutionsOptions) *Executions {
	var o ExecutionsOptions
	if opts != nil {
		o = *opts
	}
	if o.Retention <= 0 {
		o.Retention = 7 * 24 * time.Hour
	}
	if o.Consumer == "" {
		o.Consumer = "replica-" + rand.Text()[:8]
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	if o.Visibility <= 0 {
		o.Visibility = 10 * time.Second
	}
	if o.RepairEvery <= 0 {
		o.RepairEvery = DefaultRepairEvery
	}
	if o.ApprovalTTL <= 0 {
		o.ApprovalTTL = 24 * time.Hour
	}
	if o.QuestionHold <= 0 {
		o.QuestionHold = DefaultQuestionHold
	}
	if o.Redactor == nil {
		o.Redactor = secrets.NewSecretRedactor()
	}
	if o.Sealer == nil {
		o.Sealer = refs.NewSealer(st)
	}
	e := &Executions{
		store: st, reg: reg, retention: o.Retention, consumer: o.Consumer, logger: o.Logger, observer: o.Observer,
		visibility: o.Visibility, approvalTTL: o.ApprovalTTL, sweepEvery: 5 * time.Second,
		repairEvery: o.RepairEvery, repairGrace: repairGrace,
		secrets: o.Secrets, redactor: o.Redactor, allowlists: o.Allowlists, attacher: o.Attacher,
		models: o.Models, tracer: o.Tracer, agents: o.Agents, questionHold: o.QuestionHold,
	}
	e.pipeline = gates.New(gates.Options{Sealer: o.Sealer, Secrets: e.secrets, Credentials: o.Credentials, Redactor: e.redactor, Logger: e.logger,
		SchemaMaxNodes: o.SchemaMaxNodes, SchemaCompileTimeout: o.SchemaCompileTimeout})
	e.approvals = gates.NewApprovals(st, gates.ApprovalHooks{Resume: e.resume, Emit: e.emit, Approvers: e.approversOf, Decided: e.approvalDecided})
	e.questions = gates.NewQuestions(st, gates.QuestionHooks{Resume: e.resume, Emit: e.emit, Answerers: e.answerersOf, Redact: e.redact, Observe: e.observeQuestion})
	e.notify = newNotifier(st.Client, globEscape(st.Prefix)+"{exec:*}:cancel", globEscape(st.Prefix)+"{exec:*}:done")
	return e
}

func (e *Executions) redact(v any) any { return e.redactor.Value(v) }

// approversOf is whom the policy of connection names as its approvers.
func (e *Executions) approversOf(connection string) []string {
	c, err := e.reg.Get(connection)
	if err != nil {
		return nil
	}
	return c.Policy().Approvers
}

// Approvals is the approval store of these executions.
func (e *Executions) Approvals() *gates.Approvals { return e.approvals }

// resume enqueues a work item for an execution that can move on (an
// approval was decided).
func (e *Executions) resume(ctx context.Context, id string) error {
	err := e.store.Client.XAdd(ctx, &redis.XAddArgs{Stream: e.workKey(), Values: map[string]any{"id": id}}).Err()
	if err != nil {
		return fmt.Errorf("executions: resume %s: %w", id, err)
	}
	return nil
}

func (e *Executions) recordKey(id string) string { return e.store.Key("{exec:"+id+"}", "record") }
func (e *Executions) doneKey(id string) string   { return e.store.Key("{exec:"+id+"}", "done") }
func (e *Executions) ledgerKey(id string) string { return e.store.Key("{exec:"+id+"}", "ledger") }
func (e *Executions) indexKey() string           { return e.store.Key("executions") }
func (e *Executions) workKey() string            { return e.store.Key("work") }

// HostPrincipal is recorded as the principal of host-trusted runs (a
// trigger's turn): they run for no user, so connections that act as a
// user are hidden from them.
const HostPrincipal = authz.HostName

// forNoOne reports whether an execution with this principal runs for no
// user.
func forNoOne(principal string) bool { return principal == "" || principal == HostPrincipal }

// Request is one submission of a workflow document.
type Request struct {
	Workflow json.RawMessage
	Input    any
	// Principal is who asks (an API key's name); recorded and shown in
	// approvals.
	Principal string
	// Allowlist names the allowlist that bounds the document. An unknown
	// or empty name grants nothing.
	Allowlist string
	// ID is the new execution's id; empty means a fresh one. An
	// idempotency key reserves one (SubmitIdempotent), so that a retried
	// submit of the same id yields the first execution.
	ID string
	// RefScope is what the run's refs are sealed to; empty: the
	// execution (see record.RefScope).
	RefScope string
	// LeaseHolder holds the run's pool leases across executions (see
	// record.LeaseHolder); empty: the execution.
	LeaseHolder string
	// Await: the caller Waits for the execution next. Submit listens for
	// its end before writing it, and that Wait has nothing to read first.
	Await bool
}

// Submit validates the document against the registry and the request's
// allowlist and, when it is valid, stores a queued execution and its work
// item. A document problem is a *ValidationError with paths under
// "/workflow".
func (e *Executions) Submit(ctx context.Context, req Request) (*Execution, error) {
	al, err := e.allowlist(ctx, req.Allowlist)
	if err != nil {
		return nil, err
	}
	ex, _, err := e.submitUnder(ctx, req, al)
	return ex, err
}

// submitUnder is Submit with the request's allowlist read already; fresh
// reports whether this call wrote the execution (false: req.ID was
// written before).
func (e *Executions) submitUnder(ctx context.Context, req Request, al *gates.Allowlist) (ex *Execution, fresh bool, err error) {
	doc, err := document.ParseDocument(req.Workflow, e.reg, "/workflow")
	if err != nil {
		return nil, false, err
	}
	if problems := document.ResolveSetups(doc, e.reg, req.Input, "/workflow"); len(problems) > 0 {
		return nil, false, &fault.ValidationError{Problems: problems}
	}
	problems := al.Check(doc, "/workflow")
	problems = append(problems, e.checkModels(doc, al, false)...)
	problems = append(problems, e.checkAgents(doc, al, false)...)
	if len(problems) > 0 {
		return nil, false, &fault.ValidationError{Problems: problems}
	}
	bound := req.Allowlist
	id := req.ID
	if id == "" {
		id = newExecutionID()
	}
	rec := newRecord(id, req.Workflow, req.Input, req.Principal, &bound)
	rec.RefScope, rec.LeaseHolder = req.RefScope, req.LeaseHolder
	if !req.Await {
		return e.enqueueRecord(ctx, rec)
	}
	end := e.listenEnd(ctx, id)
	ex, fresh, err = e.enqueueRecord(ctx, rec)
	if err != nil || !fresh {
		// Written before: it may have ended already, so Wait looks first.
		end.release()
		return ex, fresh, err
	}
	e.hold(end)
	return ex, fresh, nil
}

// SubmitOnce is Submit of a host-trusted document (a trigger's workflow from
// the config file, which no allowlist bounds), keyed by a message id (a trigger's
// "<connection>:<trigger>:<event id>"): every call with the same key, on any
// replica, yields the same execution, so an event delivered twice starts
// one turn. created reports whether this call created it.
//
// The key is claimed first and the execution written after, so a process
// that dies between the two leaves a claimed key without a record; the next
// call with that key (the event's redelivery) writes it under the claimed id.
func (e *Executions) SubmitOnce(ctx context.Context, key string, workflow json.RawMessage, input any) (ex *Execution, created bool, err error) {
	doc, err := document.ParseDocument(workflow, e.reg, "/workflow")
	if err != nil {
		return nil, false, err
	}
	if problems := document.ResolveSetups(doc, e.reg, input, "/workflow"); len(problems) > 0 {
		return nil, false, &fault.ValidationError{Problems: problems}
	}
	msgKey := e.store.Key("msg", key)
	id := newExecutionID()
	won, err := e.store.Client.SetNX(ctx, msgKey, id, e.retention).Result()
	if err != nil {
		return nil, false, fmt.Errorf("executions: claim message %s: %w", key, err)
	}
	if !won {
		if id, err = e.store.Client.Get(ctx, msgKey).Result(); err != nil {
			return nil, false, fmt.Errorf("executions: read message %s: %w", key, err)
		}
		rec, err := e.load(ctx, id)
		if err == nil {
			// Its first submitter may have been an older version that
			// died between the record and its index entry or work item.
			if err := e.ensure(ctx, rec); err != nil {
				return nil, false, err
			}
			return &rec.Execution, false, nil
		}
		if !errors.Is(err, fault.ErrNotFound) {
			return nil, false, err
		}
	}
	ex, err = e.enqueue(ctx, id, workflow, input, HostPrincipal)
	return ex, err == nil, err
}

func newExecutionID() string { return "ex_" + strings.ToLower(rand.Text()) }

// enqueue writes a queued execution and its work item. The record is
// written only if absent, so a repeated enqueue of one id keeps the first.
func (e *Executions) enqueue(ctx context.Context, id string, workflow json.RawMessage, input any, principal string) (*Execution, error) {
	return e.enqueueBound(ctx, id, workflow, input, principal, nil)
}

// enqueueBound is enqueue of a document bound by the named allowlist (nil:
// a host document).
func (e *Executions) enqueueBound(ctx context.Context, id string, workflow json.RawMessage, input any, principal string, allowlist *string) (*Execution, error) {
	ex, _, err := e.enqueueRecord(ctx, newRecord(id, workflow, input, principal, allowlist))
	return ex, err
}

// newRecord is a queued execution's record, created now.
func newRecord(id string, workflow json.RawMessage, input any, principal string, allowlist *string) *record {
	return &record{
		Execution: Execution{ID: id, Status: ExecQueued, Principal: principal, Input: input, Steps: []StepRecord{}, CreatedAt: time.Now().UTC()},
		Workflow:  workflow, Allowlist: allowlist,
	}
}

// enqueueRecord writes rec and its work item unless its id is written
// already; fresh reports whether this call wrote it.
func (e *Executions) enqueueRecord(ctx context.Context, rec *record) (ex *Execution, fresh bool, err error) {
	e.stampTrace(ctx, rec)
	data, err := marshalRecord(rec)
	if err != nil {
		return nil, false, err
	}
	// Record, index entry and work item are written together (see
	// submit.go), so no crash leaves one without the others.
	fresh, reported, err := e.write(ctx, rec.ID, data, indexMember(rec.CreatedAt, rec.ID))
	if err != nil {
		return nil, false, err
	}
	if !fresh {
		// Written by an earlier attempt, perhaps by an older version
		// that died before indexing or queueing it: make it whole.
		if rec, err = e.load(ctx, rec.ID); err != nil {
			return nil, false, err
		}
		if err := e.ensure(ctx, rec); err != nil {
			return nil, false, err
		}
	}
	e.observer.ExecutionEntered(ExecQueued)
	if !reported {
		e.emit(ctx, rec.ID, EventState, map[string]any{"status": ExecQueued})
	}
	return &rec.Execution, fresh, nil
}

// indexMember orders executions by creation time, then id, as text, so the
// index can be paged with lexicographic ranges that stay stable while new
// executions arrive.
func indexMember(t time.Time, id string) string {
	return fmt.Sprintf("%013d:%s", t.UnixMilli(), id)
}

// Get returns the execution, or ErrNotFound.
func (e *Executions) Get(ctx context.Context, id string) (*Execution, error) {
	rec, err := e.load(ctx, id)
	if err != nil {
		return nil, err
	}
	return &rec.Execution, nil
}

func (e *Executions) load(ctx context.Context, id string) (*record, error) {
	var head *redis.StringCmd
	var ledger *redis.MapStringStringCmd
	_, err := e.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		head = p.Get(ctx, e.recordKey(id))
		ledger = p.HGetAll(ctx, e.ledgerKey(id))
		return nil
	})
	if errors.Is(err, redis.Nil) || errors.Is(head.Err(), redis.Nil) {
		return nil, fmt.Errorf("execution %s: %w", id, fault.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("executions: load %s: %w", id, err)
	}
	rec, _, err := decodeRecord(id, []byte(head.Val()), ledger.Val())
	return rec, err
}

// decodeRecord joins a record's head and its ledger hash (field: the
// entry's position, value: its JSON). legacy reports a record written
// before the ledger had a hash of its own: its entries are in the head,
// and the first save of a run over it writes them to the hash.
func decodeRecord(id string, head []byte, ledger map[string]string) (rec *record, legacy bool, err error) {
	rec = &record{}
	if err := json.Unmarshal(head, rec); err != nil {
		return nil, false, fmt.Errorf("executions: decode %s: %w", id, err)
	}
	if len(ledger) == 0 {
		legacy = len(rec.Steps) > 0
		if rec.Steps == nil {
			rec.Steps = []StepRecord{}
		}
		return rec, legacy, nil
	}
	rec.Steps = make([]StepRecord, len(ledger))
	for field, v := range ledger {
		i, err := strconv.Atoi(field)
		if err != nil || i < 0 || i >= len(ledger) {
			return nil, false, fmt.Errorf("executions: decode %s: ledger entry %q out of place", id, field)
		}
		if err := json.Unmarshal([]byte(v), &rec.Steps[i]); err != nil {
			return nil, false, fmt.Errorf("executions: decode %s: ledger entry %s: %w", id, field, err)
		}
	}
	return rec, false, nil
}

// marshalHead encodes the record without its ledger entries, which the
// ledger hash holds (see saveScript).
func marshalHead(rec *record) ([]byte, error) {
	h := *rec
	h.Steps = nil
	return marshalRecord(&h)
}

// ListOptions select a page of executions.
type ListOptions struct {
	Status ExecState // empty: every state
	Cursor string    // from a previous page's Next; empty: the newest
	Limit  int       // 1..100, default 20
	// Principal, when set, keeps only the executions it started.
	Principal string
}

// Page is one page of executions, newest first.
type Page struct {
	Items []*Execution
	// Next is the cursor of the following page; empty on the last page.
	Next string
}

// ErrBadCursor is returned for a cursor this service did not issue.
var ErrBadCursor = errors.New("invalid cursor")

const listBatch = 100

// List returns executions newest first. With a status filter, it reads at
// most ten batches of the index per call and returns a cursor to continue,
// so a rare status never makes one request scan everything.
func (e *Executions) List(ctx context.Context, opts ListOptions) (Page, error) {
	if opts.Limit <= 0 || opts.Limit > 100 {
		opts.Limit = 20
	}
	max := "+"
	if opts.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(opts.Cursor)
		if err != nil || !strings.Contains(string(b), ":") {
			return Page{}, ErrBadCursor
		}
		max = "(" + string(b)
	}
	e.trim(ctx)
	var page Page
	for range 10 {
		members, err := e.store.Client.ZRevRangeByLex(ctx, e.indexKey(), &redis.ZRangeBy{Max: max, Min: "-", Count: listBatch}).Result()
		if err != nil {
			return Page{}, fmt.Errorf("executions: list: %w", err)
		}
		recs, err := e.loadMany(ctx, members)
		if err != nil {
			return Page{}, err
		}
		for i, rec := range recs {
			if rec == nil || (opts.Status != "" && rec.Status != opts.Status) ||
				(opts.Principal != "" && rec.Principal != opts.Principal) {
				continue
			}
			page.Items = append(page.Items, &rec.Execution)
			if len(page.Items) == opts.Limit {
				if i < len(members)-1 || len(members) == listBatch {
					page.Next = base64.RawURLEncoding.EncodeToString([]byte(members[i]))
				}
				return page, nil
			}
		}
		if len(members) < listBatch {
			return page, nil
		}
		max = "(" + members[len(members)-1]
	}
	page.Next = base64.RawURLEncoding.EncodeToString([]byte(max[1:]))
	return page, nil
}

// loadMany reads the records behind index members; an expired record is
// nil and its index entry is dropped.
func (e *Executions) loadMany(ctx context.Context, members []string) ([]*record, error) {
	heads := make([]*redis.StringCmd, len(members))
	ledgers := make([]*redis.MapStringStringCmd, len(members))
	ids := make([]string, len(members))
	_, err := e.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, m := range members {
			ids[i] = m[strings.IndexByte(m, ':')+1:]
			heads[i] = p.Get(ctx, e.recordKey(ids[i]))
			ledgers[i] = p.HGetAll(ctx, e.ledgerKey(ids[i]))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("executions: list: %w", err)
	}
	recs := make([]*record, len(members))
	for i, cmd := range heads {
		data, err := cmd.Bytes()
		if err != nil {
			e.store.Client.ZRem(ctx, e.indexKey(), members[i])
			continue
		}
		if rec, _, err := decodeRecord(ids[i], data, ledgers[i].Val()); err == nil {
			recs[i] = rec
		}
	}
	return recs, nil
}

// trim drops index entries older than the retention; their records have
// expired already.
func (e *Executions) trim(ctx context.Context) {
	cutoff := time.Now().Add(-e.retention).UnixMilli()
	e.store.Client.ZRemRangeByLex(ctx, e.indexKey(), "-", fmt.Sprintf("(%013d", cutoff))
}

// Wait returns the execution once it is terminal or when d has passed,
// whichever comes first; it works whichever replica runs the execution.
// The finish is announced on a channel, heard through the process's shared
// subscription; a slow poll backs it up, so a message lost to a dropped
// subscription only makes Wait slower, never wrong.
func (e *Executions) Wait(ctx context.Context, id string, d time.Duration) (*Execution, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	// Listen before reading, so a finish between the two is not missed:
	// here (the run hands its record over) or elsewhere (the done channel).
	// A Submit with Await listened before the execution was written, and
	// there is nothing to read first.
	end := e.taken(id)
	if end == nil {
		end = e.listenEnd(ctx, id)
		// The first look reads the head alone (the status): the execution
		// was usually just submitted, and its ledger is read once it ends.
		if terminal, err := e.ended(ctx, id); err != nil || terminal {
			end.release()
			if err != nil {
				return nil, err
			}
			return e.Get(context.WithoutCancel(ctx), id)
		}
	}
	defer end.release()
	poll := time.NewTicker(500 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return e.Get(context.WithoutCancel(ctx), id)
		case ex := <-end.here:
			if ex != nil {
				return ex, nil
			}
			end.again() // that run ended without finishing: read, and expect the next
		case <-end.done:
			if e.finished.runsHere(id) {
				continue // that run hands its record over
			}
			select {
			case ex := <-end.here: // it did already
				if ex != nil {
					return ex, nil
				}
				end.again()
			default:
			}
		case <-poll.C:
		}
		ex, err := e.Get(context.WithoutCancel(ctx), id)
		if err != nil || ex.Status.Terminal() {
			return ex, err
		}
	}
}

// ended reports whether the execution is terminal, from its head.
func (e *Executions) ended(ctx context.Context, id string) (bool, error) {
	data, err := e.store.Client.Get(ctx, e.recordKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("execution %s: %w", id, fault.ErrNotFound)
	}
	if err != nil {
		return false, fmt.Errorf("executions: load %s: %w", id, err)
	}
	var h head
	if err := json.Unmarshal(data, &h); err != nil {
		return false, fmt.Errorf("executions: decode %s: %w", id, err)
	}
	return h.Status.Terminal(), nil
}
