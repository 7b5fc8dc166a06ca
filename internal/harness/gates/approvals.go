package gates

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// ApprovalState is where an approval is in its life.
type ApprovalState string

// Approval states.
const (
	ApprovalPending  ApprovalState = "pending"
	ApprovalApproved ApprovalState = "approved"
	ApprovalDenied   ApprovalState = "denied"
	ApprovalExpired  ApprovalState = "expired"
)

// Approval is a guarded call waiting for, or decided by, a person.
type Approval struct {
	ID          string         `json:"id"`
	State       ApprovalState  `json:"state"`
	Execution   string         `json:"execution"`
	Step        string         `json:"step"`
	Connection  string         `json:"connection"`
	Op          string         `json:"op"`
	Args        map[string]any `json:"args"` // redacted; secrets shown as <redacted>
	RequestedBy string         `json:"requestedBy"`
	CreatedAt   time.Time      `json:"createdAt"`
	ExpiresAt   time.Time      `json:"expiresAt"`
	DecidedBy   string         `json:"decidedBy,omitempty"`
	DecidedAt   *time.Time     `json:"decidedAt,omitempty"`
	Note        string         `json:"note,omitempty"`
}

// Approval errors.
var (
	ErrApprovalNotFound = errors.New("approval not found")
	// ErrApprovalDecided: the approval was already decided otherwise.
	ErrApprovalDecided = errors.New("approval already decided")
	// ErrSelfApproval: the decider is the principal that requested the
	// call. An approval needs a second person, or the gate would be
	// decorative.
	ErrSelfApproval = errors.New("the principal that requested a call cannot decide its approval")
	// ErrNotApprover: the decider lacks the approve role for this call,
	// or the connection's policy names other approvers.
	ErrNotApprover = errors.New("not an approver of this call")
)

// Approvals keeps approval records in Redis. Deciding is one script on the
// approval's key, so two decisions racing on two replicas cannot both win.
type Approvals struct {
	store *store.Store
	// resume enqueues the execution an approval belongs to once decided.
	resume func(ctx context.Context, execution string) error
	// emit puts the decision on the execution's event stream.
	emit func(ctx context.Context, exec, typ string, data map[string]any)
	// approvers returns whom a connection's policy lets decide its calls
	// (nil: anyone with the approve role).
	approvers func(connection string) []string
	// decided records a decision for the metrics; nil: none.
	decided func(ap *Approval)
}

// EventApprovalDecision is the event of a decision on the execution's
// stream: {approval, state, by, step}.
const EventApprovalDecision = "approval.decided"

// ApprovalHooks are the engine's side of the queue.
type ApprovalHooks struct {
	// Resume enqueues the execution an approval belongs to once decided.
	Resume func(ctx context.Context, execution string) error
	// Emit puts the decision on the execution's event stream.
	Emit func(ctx context.Context, exec, typ string, data map[string]any)
	// Approvers returns whom a connection's policy lets decide its calls
	// (nil: anyone with the approve role).
	Approvers func(connection string) []string
	// Decided records a decision for the metrics; nil: none.
	Decided func(ap *Approval)
}

// NewApprovals is the approval queue kept in st, calling back through h.
func NewApprovals(st *store.Store, h ApprovalHooks) *Approvals {
	return &Approvals{store: st, resume: h.Resume, emit: h.Emit, approvers: h.Approvers, decided: h.Decided}
}

func (a *Approvals) key(id string) string { return a.store.Key("approval", "{"+id+"}") }
func (a *Approvals) pendingKey() string   { return a.store.Key("approvals", "pending") }
func (a *Approvals) allKey() string       { return a.store.Key("approvals", "all") }

// ApprovalID is derived from the execution and the step's ledger key, so a
// replayed step finds the approval it asked for instead of asking again.
func ApprovalID(execution, stepKey string) string {
	sum := sha256.Sum256([]byte(execution + "\x00" + stepKey))
	return "ap_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// Request writes a pending approval unless one with its id exists, and
// returns the stored one.
func (a *Approvals) Request(ctx context.Context, ap *Approval) (*Approval, error) {
	data, err := json.Marshal(ap)
	if err != nil {
		return nil, fmt.Errorf("approvals: encode %s: %w", ap.ID, err)
	}
	// Each write is idempotent, so a request repeated after a crash
	// completes the first one rather than making a second approval.
	fresh, err := a.store.Client.HSetNX(ctx, a.key(ap.ID), "data", data).Result()
	if err == nil {
		err = a.store.Client.HSetNX(ctx, a.key(ap.ID), "state", string(ApprovalPending)).Err()
	}
	if err != nil {
		return nil, fmt.Errorf("approvals: request %s: %w", ap.ID, err)
	}
	if !fresh {
		return a.Get(ctx, ap.ID)
	}
	score := float64(ap.CreatedAt.UnixMilli())
	_, err = a.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, a.pendingKey(), redis.Z{Score: float64(ap.ExpiresAt.UnixMilli()), Member: ap.ID})
		p.ZAdd(ctx, a.allKey(), redis.Z{Score: score, Member: ap.ID})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("approvals: index %s: %w", ap.ID, err)
	}
	return ap, nil
}

// Get returns one approval, or ErrApprovalNotFound.
func (a *Approvals) Get(ctx context.Context, id string) (*Approval, error) {
	fields, err := a.store.Client.HGetAll(ctx, a.key(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("approvals: get %s: %w", id, err)
	}
	return decodeApproval(id, fields)
}

// decodeApproval reads the hash of an approval: the request as JSON in
// "data", which never changes, and the decision in fields of its own.
func decodeApproval(id string, fields map[string]string) (*Approval, error) {
	if fields["data"] == "" {
		return nil, fmt.Errorf("approval %s: %w", id, ErrApprovalNotFound)
	}
	var ap Approval
	if err := json.Unmarshal([]byte(fields["data"]), &ap); err != nil {
		return nil, fmt.Errorf("approvals: decode %s: %w", id, err)
	}
	ap.State = ApprovalState(fields["state"])
	ap.DecidedBy, ap.Note = fields["decidedBy"], fields["note"]
	if t, err := time.Parse(time.RFC3339Nano, fields["decidedAt"]); err == nil {
		ap.DecidedAt = &t
	}
	return &ap, nil
}

// List returns approvals newest first, optionally only those in state.
func (a *Approvals) List(ctx context.Context, state ApprovalState, limit int) ([]*Approval, error) {
	return a.ListWhere(ctx, state, limit, nil)
}

// ListWhere is List keeping only the approvals keep accepts (nil keeps
// all). The filter runs before the limit, so a caller who may see few
// approvals still gets its newest ones, not those among everyone's newest.
func (a *Approvals) ListWhere(ctx context.Context, state ApprovalState, limit int, keep func(*Approval) bool) ([]*Approval, error) {
	if limit <= 0 || limit > 200 {
		limit = 50
	}
	out, err := newest(ctx, a.store, a.allKey(), limit, a.Get, func(ap *Approval) bool {
		return (state == "" || ap.State == state) && (keep == nil || keep(ap))
	})
	if err != nil {
		return nil, fmt.Errorf("approvals: list: %w", err)
	}
	return out, nil
}

// decideScript moves a pending approval to a decided state, once. It
// returns the stored record after the call; a second call with the same
// decision is a no-op that returns the same record, so go-redis retrying
// the script, or a person clicking twice, changes nothing.
var decideScript = redis.NewScript(`
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 0 end
if state ~= 'pending' then return 2 end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'decidedBy', ARGV[2], 'decidedAt', ARGV[3], 'note', ARGV[4])
return 1
`)

// DecideAs is Decide for a principal of the API or the admin UI: it must
// hold the approve role for the call's connection and operation, be named
// by the connection's approvers when its policy names any, and not be the
// principal that requested the call.
func (a *Approvals) DecideAs(ctx context.Context, id string, state ApprovalState, p authz.Principal, note string) (*Approval, error) {
	ap, err := a.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := a.mayDecide(ap, p); err != nil {
		return ap, err
	}
	return a.Decide(ctx, id, state, p.Name, note)
}

func (a *Approvals) mayDecide(ap *Approval, p authz.Principal) error {
	if p.Name == ap.RequestedBy {
		return fmt.Errorf("approval %s: %w", ap.ID, ErrSelfApproval)
	}
	if !p.MayApprove(ap.Connection, ap.Op) {
		return fmt.Errorf("approval %s of %s.%s: %w", ap.ID, ap.Connection, ap.Op, ErrNotApprover)
	}
	if a.approvers != nil && !p.Named(a.approvers(ap.Connection)) {
		return fmt.Errorf("approval %s: the policy of %s names its approvers: %w", ap.ID, ap.Connection, ErrNotApprover)
	}
	return nil
}

// MayDecide reports whether p may decide ap (see DecideAs), so a page can
// offer the buttons only to those who may press them.
func (a *Approvals) MayDecide(ap *Approval, p authz.Principal) bool { return a.mayDecide(ap, p) == nil }

// Decide approves or denies (or expires) a pending approval as by. It
// returns the approval; deciding an approval already in that state
// returns it unchanged, one decided otherwise is ErrApprovalDecided, and
// the principal that requested the call may never decide it
// (ErrSelfApproval). A decision resumes the execution, which runs the
// call (approved) or fails the step with steering_denied.
func (a *Approvals) Decide(ctx context.Context, id string, state ApprovalState, by, note string) (*Approval, error) {
	if ap, err := a.Get(ctx, id); err != nil {
		return nil, err
	} else if ap.RequestedBy == by {
		return ap, fmt.Errorf("approval %s: %w", id, ErrSelfApproval)
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	code, err := decideScript.Run(ctx, a.store.Client, []string{a.key(id)}, string(state), by, now, note).Int()
	if err != nil {
		return nil, fmt.Errorf("approvals: decide %s: %w", id, err)
	}
	if code == 0 {
		return nil, fmt.Errorf("approval %s: %w", id, ErrApprovalNotFound)
	}
	ap, err := a.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if code == 2 {
		if ap.State != state {
			return ap, fmt.Errorf("approval %s is %s: %w", id, ap.State, ErrApprovalDecided)
		}
		// The same decision again: a client retrying after a lost answer,
		// perhaps because the process that recorded the decision died
		// before enqueueing the execution. Enqueue it (again), so the
		// retry is what brings a parked run back; a second work item is
		// harmless (a worker skips a run that is claimed or not waiting).
		if err := a.resume(ctx, ap.Execution); err != nil {
			return ap, err
		}
		return ap, nil
	}
	a.store.Client.ZRem(ctx, a.pendingKey(), id)
	a.emit(ctx, ap.Execution, EventApprovalDecision, map[string]any{"approval": id, "state": ap.State, "by": by, "step": ap.Step})
	if a.decided != nil {
		a.decided(ap)
	}
	if err := a.resume(ctx, ap.Execution); err != nil {
		return ap, err
	}
	return ap, nil
}

// Expire decides every pending approval whose time has passed.
func (a *Approvals) Expire(ctx context.Context) {
	ids, err := a.store.Client.ZRangeByScore(ctx, a.pendingKey(), &redis.ZRangeBy{
		Min: "-inf", Max: fmt.Sprint(time.Now().UnixMilli()), Count: 100,
	}).Result()
	if err != nil {
		return
	}
	for _, id := range ids {
		_, _ = a.Decide(ctx, id, ApprovalExpired, authz.SystemName, "no decision before the approval expired")
		a.store.Client.ZRem(ctx, a.pendingKey(), id)
	}
}

// PendingApprovals counts the approvals waiting for a person, for the
// approvals-pending gauge.
func (a *Approvals) PendingApprovals(ctx context.Context) (int64, error) {
	return a.store.Client.ZCard(ctx, a.pendingKey()).Result()
}

// newest reads the records whose ids the sorted set key holds, newest
// first, keeping those keep accepts, up to limit (the approval and
// question queues list this way). Filtering comes before the limit, so a
// caller who may see few records still gets its newest ones; a record
// that cannot be read is left out.
func newest[T any](ctx context.Context, st *store.Store, key string, limit int, get func(context.Context, string) (T, error), keep func(T) bool) ([]T, error) {
	ids, err := st.Client.ZRevRange(ctx, key, 0, 999).Result()
	if err != nil {
		return nil, err
	}
	out := []T{}
	for _, id := range ids {
		rec, err := get(ctx, id)
		if err != nil {
			continue
		}
		if keep(rec) {
			out = append(out, rec)
		}
		if len(out) == limit {
			break
		}
	}
	return out, nil
}
