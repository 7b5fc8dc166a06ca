package harness_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/profiles"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// A chat.post (once in chat@1) whose runner dies after the server acted
// and patchbay recorded the outcome, but before the ledger heard of it,
// has one effect: the runner that takes over sends the pending call again
// with the same idempotency key, and the record answers it. The server
// ignores idempotency keys, so without the record it would post twice,
// as an operation the profile does not mark once does.
func TestOnceAnswersARepeatedKeyFromTheRecord(t *testing.T) {
	t.Parallel()
	cases := []struct {
		op, args  string
		wantPosts int32
	}{
		{"chat.post", `{"channel":"#a","text":"hi"}`, 1},
		{"note", `{}`, 2}, // not a profile operation: the server's repeat is its own affair
	}
	for _, tc := range cases {
		t.Run(tc.op, func(t *testing.T) {
			t.Parallel()
			st := storetest.New(t)
			var posts atomic.Int32
			var execID atomic.Value
			ctx := context.Background()
			// The runner dies just after the server acted: its claim is
			// taken, and nothing it writes to the ledger counts any more.
			act := func(ctx context.Context, a map[string]any) (any, error) {
				if posts.Add(1) == 1 {
					waitFor(t, "the execution's id", func() bool { return execID.Load() != nil })
					id := execID.Load().(string)
					must(t, st.Client.Incr(ctx, st.Key("{exec:"+id+"}", "epoch")).Err())
					must(t, st.Client.Del(ctx, st.Key("{exec:"+id+"}", "owner")).Err())
				}
				return map[string]any{"message": "m1", "thread": "#a/m1"}, nil
			}
			ops := append(chatOps(act), connecttest.MemoryOp{Operation: connect.Operation{Name: "note"}, Fn: act})
			ops[0].Fn = act
			reg := startRegistry(t, map[string]connect.Provider{"chat": &declaring{connecttest.NewMemory(ops...), map[string]string{"chat": "1.0.0"}}}, nil)
			opts := harness.ExecutionsOptions{Visibility: 300 * time.Millisecond}
			execs := startWorkers(t, st, reg, 1, "test", `{"connections":{"chat":{"ops":["*"]}}}`, opts)
			doc := `{"version":1,"connections":{"chat":{}},"root":{"kind":"call","id":"p","connection":"chat","op":"` + tc.op + `","args":` + tc.args + `}}`
			ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Principal: "tester", Allowlist: "test"})
			must(t, err)
			execID.Store(ex.ID)
			ex, err = execs.Wait(ctx, ex.ID, 20*time.Second)
			must(t, err)
			if ex.Status != harness.ExecSucceeded {
				t.Fatalf("%s: %+v", ex.Status, ex.Error)
			}
			if got := posts.Load(); got != tc.wantPosts {
				t.Fatalf("the server acted %d times, want %d", got, tc.wantPosts)
			}
		})
	}
}

// vault@1 is a test profile with a guarded operation.
const vaultProfile = `profile: vault
version: 1.0.0
description: A store whose erasing is guarded.
operations:
  vault.erase:
    description: Erase an entry.
    effects: true
    guarded: true
    input: { type: object, properties: { key: { type: string } } }
    output: { type: object }
  vault.put:
    description: Store an entry.
    effects: true
    input: { type: object, properties: { key: { type: string } } }
    output: { type: object }
`

// guarding is a vault@1 server that refuses vault.put on key "root" as
// guarded (code "guarded") unless the call carries an approval. It keeps
// the approval every call arrived with, refused or not.
type guarding struct {
	*connecttest.Memory
	calls atomic.Int32 // calls it acted on

	mu   sync.Mutex
	sent []string // every call's approval id, "" for none, in order
}

// sends is a copy of what every call so far carried as its approval.
func (g *guarding) sends() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.sent)
}

func (g *guarding) Connect(context.Context) (connect.Conn, error) { return g, nil }

func (g *guarding) Manifest() connect.Manifest {
	m := g.Memory.Manifest()
	m.Profiles = map[string]string{"vault": "1.0.0"}
	return m
}

func (g *guarding) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	g.mu.Lock()
	g.sent = append(g.sent, req.Approval)
	g.mu.Unlock()
	if req.Op == "vault.put" && req.Args["key"] == "root" && req.Approval == "" {
		return nil, &connect.CallError{Op: req.Op, Message: "the root entry is guarded", Code: connect.CodeGuarded}
	}
	g.calls.Add(1)
	return map[string]any{}, nil
}

func guardedSetup(t *testing.T, st *store.Store, pol registry.Policy) (*harness.Executions, *guarding) {
	t.Helper()
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "vault.yaml"), []byte(vaultProfile), 0o600))
	cat := profiles.Builtin()
	must(t, cat.LoadDir(dir))
	srv := &guarding{Memory: connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "vault.erase"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "vault.put"}},
	)}
	reg := registry.NewRegistry(nil)
	reg.SetProfiles(cat)
	must(t, reg.Add("vault", srv))
	must(t, reg.SetPolicy("vault", pol))
	must(t, reg.Start(context.Background()))
	t.Cleanup(func() { _ = reg.Close() })
	return startWorkers(t, st, reg, 1, "test", `{"connections":{"vault":{"ops":["*"]}}}`, harness.ExecutionsOptions{}), srv
}

// An operation a profile marks guarded, and a target the server refuses as
// guarded, wait for a person's approval and run once approved; a policy
// that allows the operation runs it without one.
func TestGuardedWaitsForApproval(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, op, key string
		policy        registry.Policy
		approvals     int
	}{
		{"marked guarded", "vault.erase", "a", registry.Policy{}, 1},
		{"allowed by the policy", "vault.erase", "a", registry.Policy{Allow: []string{"vault.erase"}}, 0},
		{"refused as guarded by the server", "vault.put", "root", registry.Policy{}, 1},
		{"not guarded", "vault.put", "a", registry.Policy{}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				execs, srv := guardedSetup(t, st, tc.policy)
				doc := `{"version":1,"connections":{"vault":{"profile":"vault@^1"}},"root":{"kind":"call","id":"v","connection":"vault","op":"` + tc.op + `","args":{"key":"` + tc.key + `"}}}`
				id := submitAs(t, execs, "test", doc)
				if tc.approvals > 0 {
					parked(t, execs, id, tc.approvals)
					if n := srv.calls.Load(); n != 0 {
						t.Fatalf("the server acted %d times before the approval", n)
					}
				}
				ex := approveUntilDone(t, execs, id)
				if ex.Status != harness.ExecSucceeded {
					t.Fatalf("%s: %+v", ex.Status, ex.Error)
				}
				if n := srv.calls.Load(); n != 1 {
					t.Fatalf("the server acted %d times, want 1", n)
				}
			})
		})
	}
}

// A target the server refuses as guarded is sent twice in all: the
// refused call, then, once a person approves, the call with the
// approval's id. The resumed run does not try it bare again first.
func TestServerGuardedCallIsSentAgainOnceWithTheApproval(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		execs, srv := guardedSetup(t, st, registry.Policy{})
		doc := `{"version":1,"connections":{"vault":{"profile":"vault@^1"}},"root":{"kind":"call","id":"v","connection":"vault","op":"vault.put","args":{"key":"root"}}}`
		id := submitAs(t, execs, "test", doc)
		aps := parked(t, execs, id, 1)
		if got := srv.sends(); !slices.Equal(got, []string{""}) {
			t.Fatalf("before the approval the server was sent %q, want one call without an approval", got)
		}
		approve(t, execs, aps...)
		ex := approveUntilDone(t, execs, id)
		if ex.Status != harness.ExecSucceeded {
			t.Fatalf("%s: %+v", ex.Status, ex.Error)
		}
		if got := srv.sends(); !slices.Equal(got, []string{"", aps[0].ID}) {
			t.Fatalf("the server was sent %q, want the refused call and then one carrying %s", got, aps[0].ID)
		}
		if n := srv.calls.Load(); n != 1 {
			t.Fatalf("the server acted %d times, want 1", n)
		}
	})
}
