package harness

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// The tool bridge: an acp-agent node's agent reaches connections only
// through /mcp, with a credential minted for that node run alone. The
// credential names a live node run of this process (the agent is its
// child and is handed this process's own /mcp URL), so nothing about it
// is stored: it stops working when the node run ends, a crash included,
// and it names no other execution.
//
// What the agent is offered is the tool set a model node with the same
// picks would see, cut to the execution's allowlist. Each call is a call
// step of the node's execution, through the same six gates with the
// execution's principal, keyed "<execution>:tool:<callId>". ACP carries
// no call id of the agent's model to MCP, so the call id is derived from
// what is called: "<node>.<hash of tool and arguments>.<k>", k counting
// the calls of that tool with those arguments this node run has answered.
// A resumed node's agent that makes the same calls again therefore gets
// their recorded outcomes (nothing is sent twice), and the same call made
// again while the first still runs or waits (the agent's client gave up
// on it while an approval was pending) joins the first.
//
// A guarded call waits for its approval in place, holding the agent's
// request: the agent process lives for the node run anyway (bounded by
// the entry's timeoutMs), so the run does not park.

// BridgeCredentialPrefix starts every node credential, so /mcp knows to
// look for a live node rather than an API key or an access token.
const BridgeCredentialPrefix = "pbn_"

// approvalPoll is how often a bridged call or a permission request
// waiting for a person looks at its approval.
const approvalPoll = 250 * time.Millisecond

// bridge is one node run's side of the tool bridge.
type bridge struct {
	id       string          // sha256 of the credential, hex
	ctx      context.Context // the node run's: its calls end with it
	r        *run
	f        *frame
	n        *document.Node
	ts       *agent.ToolSet
	al       *gates.Allowlist
	maxCalls int // 0: unbounded

	mu       sync.Mutex
	answered map[string]int           // call hash → calls answered
	inflight map[string]*inflightCall // call hash → the call running now
	calls    int
}

// openBridge mints the node run's credential and registers its bridge;
// close forgets it, after which the credential is refused.
func (r *run) openBridge(ctx context.Context, f *frame, n *document.Node, ts *agent.ToolSet, al *gates.Allowlist) (credential string, close func()) {
	credential = BridgeCredentialPrefix + strings.ToLower(rand.Text()+rand.Text())
	sum := sha256.Sum256([]byte(credential))
	b := &bridge{id: hex.EncodeToString(sum[:]), ctx: ctx, r: r, f: f, n: n, ts: ts, al: al, maxCalls: n.Model.MaxRounds,
		answered: map[string]int{}, inflight: map[string]*inflightCall{}}
	r.e.bridges.Store(b.id, b)
	return credential, func() { r.e.bridges.Delete(b.id) }
}

// BridgeCaller is who a node credential stands for.
type BridgeCaller struct {
	// Bridge names the node run (the credential's digest).
	Bridge    string
	Execution string
	Node      string
	// Principal is the execution's: the gates see it as the caller.
	Principal string
}

// Bridge finds the live node run a credential was minted for.
func (e *Executions) Bridge(credential string) (BridgeCaller, bool) {
	if !strings.HasPrefix(credential, BridgeCredentialPrefix) {
		return BridgeCaller{}, false
	}
	sum := sha256.Sum256([]byte(credential))
	v, ok := e.bridges.Load(hex.EncodeToString(sum[:]))
	if !ok {
		return BridgeCaller{}, false
	}
	b := v.(*bridge)
	return BridgeCaller{Bridge: b.id, Execution: b.r.rec.ID, Node: b.n.ID, Principal: b.r.rec.Principal}, true
}

// ErrBridgeClosed: the node run a credential was minted for has ended.
var ErrBridgeClosed = errors.New("this agent's node run has ended")

func (e *Executions) bridge(id string) (*bridge, error) {
	v, ok := e.bridges.Load(id)
	if !ok {
		return nil, ErrBridgeClosed
	}
	return v.(*bridge), nil
}

// BridgeTools is what a node's agent is offered.
func (e *Executions) BridgeTools(id string) (*ToolOffer, error) {
	b, err := e.bridge(id)
	if err != nil {
		return nil, err
	}
	return &ToolOffer{ts: b.ts, al: b.al}, nil
}

// BridgeCall runs one call of the node's agent as a call step of the
// node's execution and returns what the agent is answered: the redacted
// output, or the refusal or failure as a tool error.
func (e *Executions) BridgeCall(ctx context.Context, id, tool string, args map[string]any) (agent.ModelToolResult, error) {
	b, err := e.bridge(id)
	if err != nil {
		return agent.ModelToolResult{}, err
	}
	return b.call(ctx, tool, args)
}

func (b *bridge) call(ctx context.Context, tool string, args map[string]any) (agent.ModelToolResult, error) {
	if args == nil {
		args = map[string]any{}
	}
	hash := callHash(tool, args)
	b.mu.Lock()
	if c, ok := b.inflight[hash]; ok {
		// The same call again while the first is still running or
		// waiting: an agent that gave up on it (its client timed out
		// while an approval was pending) and called again. It gets the
		// first one's outcome.
		b.mu.Unlock()
		select {
		case <-c.done:
			return c.res, c.err
		case <-ctx.Done():
			return agent.ModelToolResult{}, ctx.Err()
		}
	}
	c := &inflightCall{done: make(chan struct{})}
	b.inflight[hash] = c
	k := b.answered[hash]
	b.calls++
	over := b.maxCalls > 0 && b.calls > b.maxCalls
	b.mu.Unlock()
	callID := fmt.Sprintf("%s.%s.%d", b.n.ID, hash, k)
	// The call is the node's, not the request's: one the agent gives up
	// on still finishes in the ledger.
	c.res, c.err = b.run(b.ctx, callID, tool, args, over)
	b.mu.Lock()
	delete(b.inflight, hash)
	if c.err == nil {
		b.answered[hash]++
	}
	b.mu.Unlock()
	close(c.done)
	return c.res, c.err
}

// inflightCall is a bridged call being run, which the same call made
// again joins.
type inflightCall struct {
	done chan struct{}
	res  agent.ModelToolResult
	err  error
}

// run is the call as a step, waiting in place while its approval is
// pending.
func (b *bridge) run(ctx context.Context, callID, tool string, args map[string]any, over bool) (agent.ModelToolResult, error) {
	r := b.r
	tn := &document.Node{Kind: agent.EntryTool, ID: ToolStepID(callID)}
	res := agent.ModelToolResult{CallID: callID}
	if t := b.ts.ByName[tool]; t != nil && t.Lists {
		return r.listOps(t.Pair, res, args), nil
	}
	var refuse error
	if over {
		refuse = fault.Deny(fault.GatePolicy, fmt.Sprintf("this agent may make at most %d tool calls (the node's until)", b.maxCalls))
	}
	for {
		res, err := r.runToolCall(ctx, b.f, tn, b.ts, tool, args, refuse, res)
		if !errors.Is(err, errWaiting) {
			return res, err
		}
		if err := r.awaitDecision(ctx, tn.ID+b.f.suffix); err != nil {
			return res, err
		}
	}
}

// awaitDecision waits until the approval of the step at key is decided
// (or expires), for a step that waits in place rather than parking.
func (r *run) awaitDecision(ctx context.Context, key string) error {
	r.mu.Lock()
	id := ""
	if i := r.entry(key); i >= 0 {
		id = r.rec.Steps[i].ApprovalID
	}
	r.mu.Unlock()
	if id == "" {
		return fmt.Errorf("step %s waits with no approval", key)
	}
	return pollUntil(ctx, func() (bool, error) {
		ap, err := r.e.approvals.Get(ctx, id)
		if err != nil {
			return false, &storageError{err}
		}
		return ap.State != gates.ApprovalPending || time.Now().After(ap.ExpiresAt), nil
	})
}

// pollUntil calls look at once and then every approvalPoll until it says
// done or fails, or ctx ends: how a run waits in place for a person's
// decision (an approval, an answer), which any replica may record.
func pollUntil(ctx context.Context, look func() (done bool, err error)) error {
	t := time.NewTicker(approvalPoll)
	defer t.Stop()
	for {
		if done, err := look(); done || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// callHash names a call by what it calls: the tool and its arguments
// (encoding/json sorts map keys, so equal arguments hash equally).
func callHash(tool string, args map[string]any) string {
	data, _ := json.Marshal(args)
	sum := sha256.Sum256(append([]byte(tool+"\x00"), data...))
	return hex.EncodeToString(sum[:6])
}
