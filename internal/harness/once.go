package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// OnceTTL is how long the outcome of an operation marked once is kept at
// least (longer when the executions' retention is longer): a repeat of
// its idempotency key within it is answered from the record, a repeat
// after it is sent to the server again. A key is its execution's id and
// step, so it repeats only while the execution's record exists, which is
// the retention from its last change; a record changing for longer than
// that after a call is rare, and then the server's own idempotency (if
// any) is all that applies.
const OnceTTL = 7 * 24 * time.Hour

// onceTTL is OnceTTL or the retention, whichever is longer.
func (e *Executions) onceTTL() time.Duration {
	return max(OnceTTL, e.retention)
}

// onceOutcome is the recorded outcome of a once-operation: its result, or
// the error the server answered with (a tool error, which it may have
// acted on).
type onceOutcome struct {
	Output any    `json:"output,omitempty"`
	Error  string `json:"error,omitempty"`
	Op     string `json:"op,omitempty"`
}

// profileOp is the profile operation a call runs: the typed step's, else
// the one of that name in a profile the connection speaks (a model's
// tool call, an untyped step on a declaring server).
func profileOp(n *document.Node, conn *registry.Connection) *profiles.Operation {
	if n.ProfileOp != nil {
		return n.ProfileOp
	}
	for _, sp := range conn.Profiles() {
		if sp.Profile == nil {
			continue
		}
		if op, ok := sp.Profile.Operations[n.Op]; ok {
			return op
		}
	}
	return nil
}

// onceKey names a once-operation's record: by the connection's identity
// instance (a replaced server did not see the first call), the operation
// and the call's idempotency key. Hashed, so the key's length is fixed.
func (e *Executions) onceKey(conn *registry.Connection, op, idemKey string) string {
	h := sha256.Sum256([]byte(conn.Name() + "\x00" + conn.Identity().Instance + "\x00" + op + "\x00" + idemKey))
	return e.store.Key("once", hex.EncodeToString(h[:]))
}

// onceRecorded returns the recorded outcome of a once-call, if any.
func (e *Executions) onceRecorded(ctx context.Context, key string) (*onceOutcome, bool, error) {
	data, err := e.store.Client.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("once: read the recorded outcome: %w", err)
	}
	var o onceOutcome
	if err := json.Unmarshal(data, &o); err != nil {
		return nil, false, fmt.Errorf("once: the recorded outcome is not JSON: %w", err)
	}
	return &o, true, nil
}

// onceRecord keeps a once-call's outcome before it is reported. The first
// record wins (SET NX): two racing runners report the same outcome.
func (e *Executions) onceRecord(ctx context.Context, key string, o onceOutcome) error {
	data, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("once: encode the outcome: %w", err)
	}
	if err := e.store.Client.SetNX(context.WithoutCancel(ctx), key, data, e.onceTTL()).Err(); err != nil {
		return fmt.Errorf("once: record the outcome: %w", err)
	}
	return nil
}

// recordable says whether a once-call's outcome is one to keep: a result,
// or a tool error the server answered with (it may have acted). A lost
// connection, a timeout or a guarded refusal is not an outcome: the call
// is sent again with the same key.
func recordable(err error) bool {
	if err == nil {
		return true
	}
	var ce *connect.CallError
	return errors.As(err, &ce) && ce.Code != connect.CodeGuarded
}

// replay is a recorded outcome as the call's answer.
func (o *onceOutcome) replay() (any, error) {
	if o.Error != "" {
		return nil, &connect.CallError{Op: o.Op, Message: o.Error}
	}
	return o.Output, nil
}
