package harness

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

func TestRegistryAdd(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		add  string
		want fault.Code
	}{
		{"letters", "demo", ""},
		{"digits underscore dash", "a1_b-c", ""},
		{"starts with digit", "1demo", fault.CodeConnectionInvalid},
		{"starts with dash", "-demo", fault.CodeConnectionInvalid},
		{"dot", "de.mo", fault.CodeConnectionInvalid},
		{"empty", "", fault.CodeConnectionInvalid},
		{"too long", "a" + string(make([]byte, 64)), fault.CodeConnectionInvalid},
		{"taken", "taken", fault.CodeConnectionNameTaken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reg := registry.NewRegistry(nil)
			if err := reg.Add("taken", connecttest.NewMemory()); err != nil {
				t.Fatal(err)
			}
			err := reg.Add(tt.add, connecttest.NewMemory())
			if got := codeOf(err); got != tt.want {
				t.Fatalf("Add(%q) = %v, want code %q", tt.add, err, tt.want)
			}
		})
	}
}

func TestRegistryGetUnknown(t *testing.T) {
	t.Parallel()
	_, err := registry.NewRegistry(nil).Get("nope")
	if codeOf(err) != fault.CodeConnectionUnknown {
		t.Fatalf("Get = %v, want CONNECTION_UNKNOWN", err)
	}
}

func TestRegistryNilProvider(t *testing.T) {
	t.Parallel()
	if err := registry.NewRegistry(nil).Add("x", nil); codeOf(err) != fault.CodeConnectionInvalid {
		t.Fatalf("Add(nil) = %v", err)
	}
}

// failing is a provider whose connect or close fails.
type failing struct {
	connectErr, closeErr error
	closed               *atomic.Int32
}

func (f failing) Connect(context.Context) (connect.Conn, error) {
	if f.connectErr != nil {
		return nil, f.connectErr
	}
	return closer{Memory: connecttest.NewMemory(), err: f.closeErr, closed: f.closed}, nil
}

type closer struct {
	*connecttest.Memory
	err    error
	closed *atomic.Int32
}

func (c closer) Close() error { c.closed.Add(1); return c.err }

func TestStartAndCloseContinuePastFailures(t *testing.T) {
	t.Parallel()
	boom, bang := errors.New("boom"), errors.New("bang")
	var closed atomic.Int32
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("a", failing{closeErr: bang, closed: &closed}))
	must(t, reg.Add("b", failing{connectErr: boom, closed: &closed}))
	must(t, reg.Add("c", failing{closed: &closed}))

	err := reg.Start(context.Background())
	if !errors.Is(err, boom) {
		t.Fatalf("Start = %v, want boom", err)
	}
	states := map[string]connect.State{}
	for _, c := range reg.List() {
		states[c.Name()] = c.Status().State
	}
	if states["a"] != connect.StateReady || states["b"] != connect.StateUnavailable || states["c"] != connect.StateReady {
		t.Fatalf("states = %v", states)
	}
	b, _ := reg.Get("b")
	if b.Status().LastError == "" {
		t.Fatal("unavailable connection has no last error")
	}
	if _, err := b.Call(context.Background(), connect.CallRequest{Op: "x"}); !errors.Is(err, connect.ErrUnavailable) {
		t.Fatalf("call on unavailable = %v", err)
	}

	err = reg.Close()
	if !errors.Is(err, bang) {
		t.Fatalf("Close = %v, want bang", err)
	}
	if closed.Load() != 2 {
		t.Fatalf("closed %d conns, want 2 (every one that connected)", closed.Load())
	}
	for _, c := range reg.List() {
		if c.Status().State != connect.StateClosed {
			t.Fatalf("%s is %s after Close", c.Name(), c.Status().State)
		}
	}
}

func TestMemoryRecordsCalls(t *testing.T) {
	t.Parallel()
	m := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("mem", m))
	must(t, reg.Start(context.Background()))
	c, _ := reg.Get("mem")
	out, err := c.Call(context.Background(), connect.CallRequest{Op: "echo", Args: map[string]any{"x": 1.0}, IdempotencyKey: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if out.(map[string]any)["x"] != 1.0 {
		t.Fatalf("out = %v", out)
	}
	if _, err := c.Call(context.Background(), connect.CallRequest{Op: "nope"}); !errors.Is(err, connect.ErrUnknownOperation) {
		t.Fatalf("unknown op = %v", err)
	}
	calls := m.Calls()
	if len(calls) != 1 || calls[0].IdempotencyKey != "k" {
		t.Fatalf("calls = %+v", calls)
	}
}

func codeOf(err error) fault.Code {
	var he *fault.Error
	if errors.As(err, &he) {
		return he.Code
	}
	return ""
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
