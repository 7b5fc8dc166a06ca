// Package connecttest is an in-memory provider for tests: a Memory
// connection answers the operations it is given and records every call.
package connecttest

import (
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"sync"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// MemoryOp is one scripted operation of a Memory connection.
type MemoryOp struct {
	Operation connect.Operation
	// Fn answers a call; nil answers with the arguments unchanged.
	Fn func(ctx context.Context, args map[string]any) (any, error)
	// Request, when set, answers instead of Fn, given the whole request
	// (its Asker, say).
	Request func(ctx context.Context, req connect.CallRequest) (any, error)
}

// Memory is an in-process connection with scripted operations that records
// every call it receives. It serves tests and examples; it is its own
// Provider and Conn.
type Memory struct {
	ops      []MemoryOp
	identity connect.Identity

	mu    sync.Mutex
	calls []connect.CallRequest
}

// NewMemory returns a Memory connection offering ops.
func NewMemory(ops ...MemoryOp) *Memory {
	return &Memory{ops: ops, identity: connect.Identity{Surface: "memory", Instance: rand.Text(), Epoch: 1}}
}

// Connect returns m itself.
func (m *Memory) Connect(context.Context) (connect.Conn, error) { return m, nil }

// Manifest lists the scripted operations.
func (m *Memory) Manifest() connect.Manifest {
	ops := make([]connect.Operation, len(m.ops))
	for i, op := range m.ops {
		ops[i] = op.Operation
	}
	return connect.Manifest{Operations: ops}
}

// Identity is fixed for the life of m.
func (m *Memory) Identity() connect.Identity { return m.identity }

// Info says what m is.
func (m *Memory) Info() map[string]any { return map[string]any{"transport": "memory"} }

// Call records req and answers with the operation's Fn.
func (m *Memory) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	m.mu.Lock()
	m.calls = append(m.calls, req)
	m.mu.Unlock()
	for _, op := range m.ops {
		if op.Operation.Name != req.Op {
			continue
		}
		switch {
		case op.Request != nil:
			return op.Request(ctx, req)
		case op.Fn == nil:
			return req.Args, nil
		}
		return op.Fn(ctx, req.Args)
	}
	return nil, fmt.Errorf("memory: %q: %w", req.Op, connect.ErrUnknownOperation)
}

// Calls returns a copy of the calls received so far, in order.
func (m *Memory) Calls() []connect.CallRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// Close does nothing; a Memory connection holds no resources.
func (m *Memory) Close() error { return nil }

// Asking is an operation whose calls ask q through the call's Asker and
// answer with the answer: {"action", "content"}. A call without an Asker
// answers {"action": "decline"}, as a server told so would.
func Asking(name string, q connect.Question) MemoryOp {
	return MemoryOp{Operation: connect.Operation{Name: name}, Request: func(ctx context.Context, req connect.CallRequest) (any, error) {
		if req.Ask == nil {
			return map[string]any{"action": connect.AnswerDecline}, nil
		}
		a, err := req.Ask(ctx, q)
		if err != nil {
			return nil, err
		}
		return map[string]any{"action": a.Action, "content": a.Content}, nil
	}}
}

// Held is an operation whose calls wait until release is called (or their
// context ends), then answer with their arguments: it keeps an execution
// running for as long as a test likes. release may be called any number
// of times.
func Held(name string) (op MemoryOp, release func()) {
	gate := make(chan struct{})
	op = MemoryOp{Operation: connect.Operation{Name: name}, Fn: func(ctx context.Context, a map[string]any) (any, error) {
		select {
		case <-gate:
			return a, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}}
	return op, sync.OnceFunc(func() { close(gate) })
}
