package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// fakeCredentials hands each signed-in principal a token of its own.
type fakeCredentials struct {
	mu     sync.Mutex
	tokens map[string]string // principal → token
	asked  []string
}

func (f *fakeCredentials) Headers(_ context.Context, connection, principal string) (map[string]string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, connection+"/"+principal)
	tok, ok := f.tokens[principal]
	if !ok {
		return nil, false, fmt.Errorf("%s has not signed in to %s: %w", principal, connection, connect.ErrNeedsSignIn)
	}
	return map[string]string{"Authorization": "Bearer " + tok}, true, nil
}

type credBundle struct {
	execs *harness.Executions
	mem   *connecttest.Memory
	reg   *registry.Registry
}

func setupCredentials(t *testing.T, st *store.Store, access registry.Access, creds connect.Credentials) credBundle {
	t.Helper()
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "whoami"}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("svc", mem))
	must(t, reg.SetAccess("svc", access))
	must(t, reg.Start(context.Background()))
	execs := startWorkers(t, st, reg, 1, "ops", `{"connections":{"svc":{"ops":["*"]}}}`,
		harness.ExecutionsOptions{Credentials: creds})
	return credBundle{execs: execs, mem: mem, reg: reg}
}

func (b credBundle) run(t *testing.T, principal string) *harness.Execution {
	t.Helper()
	doc := json.RawMessage(callDoc("whoami", `{}`))
	var ex *harness.Execution
	var err error
	if principal == "" {
		// A trusted host run, as a trigger starts it.
		ex, _, err = b.execs.SubmitOnce(context.Background(), "test:"+time.Now().String(), doc, nil)
	} else {
		ex, err = b.execs.Submit(context.Background(), harness.Request{Workflow: doc, Principal: principal, Allowlist: "ops"})
	}
	must(t, err)
	ex, err = b.execs.Wait(context.Background(), ex.ID, 10*time.Second)
	must(t, err)
	return ex
}

// Each principal's call carries that principal's own credentials, and a
// principal who has not signed in is refused at gate 6 without a call.
func TestCallsCarryTheirPrincipalsCredentials(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		creds := &fakeCredentials{tokens: map[string]string{"alice": "tok-alice-0123456789", "bob": "tok-bob-0123456789"}}
		b := setupCredentials(t, st, registry.Access{SignIn: registry.SignInPerUser}, creds)
		for _, who := range []string{"alice", "bob", "alice"} {
			if ex := b.run(t, who); ex.Status != harness.ExecSucceeded {
				t.Fatalf("%s: %s %+v", who, ex.Status, ex.Error)
			}
		}
		calls := b.mem.Calls()
		if len(calls) != 3 {
			t.Fatalf("%d calls, want 3", len(calls))
		}
		for i, who := range []string{"alice", "bob", "alice"} {
			if calls[i].Principal != who || calls[i].Headers["Authorization"] != "Bearer tok-"+who+"-0123456789" {
				t.Fatalf("call %d: principal %q headers %v, want %s's own", i, calls[i].Principal, calls[i].Headers, who)
			}
		}

		ex := b.run(t, "carol")
		if ex.Status != harness.ExecFailed || ex.Error.Code != fault.SteeringDenied || ex.Error.Gate != fault.GateSecrets {
			t.Fatalf("carol without a sign-in: %s %+v, want steering_denied at gate 6", ex.Status, ex.Error)
		}
		if len(b.mem.Calls()) != 3 {
			t.Fatal("a call without credentials reached the server")
		}
	})
}

// A connection that acts as a user is hidden from executions that run for
// no principal (a trusted host run), before any credential is asked for.
func TestActsAsUserNeedsAPrincipal(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		for _, access := range []registry.Access{{RequiresPrincipal: true}, {SignIn: registry.SignInPerUser}} {
			creds := &fakeCredentials{tokens: map[string]string{"": "tok-nobody-0123456789"}}
			b := setupCredentials(t, st, access, creds)
			ex := b.run(t, "")
			if ex.Status != harness.ExecFailed || ex.Error.Gate != fault.GateDeclared || !strings.Contains(ex.Error.Message, "no principal") {
				t.Fatalf("%+v: %s %+v, want refused at gate 1", access, ex.Status, ex.Error)
			}
			if len(b.mem.Calls()) != 0 || len(creds.asked) != 0 {
				t.Fatalf("%+v: calls %d, credentials asked %v", access, len(b.mem.Calls()), creds.asked)
			}
		}
	})
}

// needsSignIn fails to connect until signed in.
type needsSignIn struct {
	mu       sync.Mutex
	signedIn bool
	mem      *connecttest.Memory
}

func (n *needsSignIn) Connect(ctx context.Context) (connect.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.signedIn {
		return nil, fmt.Errorf("server answered 401: %w", connect.ErrNeedsSignIn)
	}
	return n.mem.Connect(ctx)
}

// A connection that cannot connect before a sign-in shows needs_sign_in,
// and a Kick after the sign-in connects it at once rather than after the
// reconnect backoff.
func TestNeedsSignInThenKick(t *testing.T) {
	t.Parallel()
	p := &needsSignIn{mem: connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "x"}})}
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("remote", p))
	must(t, reg.SetAccess("remote", registry.Access{SignIn: registry.SignInShared}))
	t.Cleanup(func() { _ = reg.Close() })
	if err := reg.Start(context.Background()); !errors.Is(err, connect.ErrNeedsSignIn) {
		t.Fatalf("Start = %v", err)
	}
	c, err := reg.Get("remote")
	must(t, err)
	if st := c.Status(); st.State != connect.StateNeedsSignIn || st.SignIn != registry.SignInShared {
		t.Fatalf("status %+v, want needs_sign_in (shared)", st)
	}
	// Let the backoff grow past anything the test would wait for.
	time.Sleep(2 * time.Second)
	p.mu.Lock()
	p.signedIn = true
	p.mu.Unlock()
	must(t, reg.Kick("remote"))
	deadline := time.Now().Add(time.Second)
	for c.Status().State != connect.StateReady {
		if time.Now().After(deadline) {
			t.Fatalf("not ready 1s after the kick: %+v", c.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A shared sign-in whose refresh the server refused takes the whole
// connection to needs_sign_in, with the link to sign in again; one user's
// missing sign-in on a per-user connection does not.
func TestRefusedSharedSignInNeedsSignIn(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{registry.SignInShared, registry.SignInPerUser} {
		// A store each: workers of one registry must not take the other's work.
		storetest.Each(t, func(t *testing.T, st *store.Store) {
			creds := &fakeCredentials{tokens: map[string]string{}} // every sign-in gone
			b := setupCredentials(t, st, registry.Access{SignIn: kind}, creds)
			ex := b.run(t, "alice")
			if ex.Status != harness.ExecFailed || ex.Error.Gate != fault.GateSecrets {
				t.Fatalf("%s: %s %+v, want refused at gate 6", kind, ex.Status, ex.Error)
			}
			c, err := b.reg.Get("svc")
			must(t, err)
			s := c.Status()
			want := connect.StateReady
			if kind == registry.SignInShared {
				want = connect.StateNeedsSignIn
			}
			if s.State != want || s.SignInURL != "/oauth/svc/start" {
				t.Fatalf("%s: status %+v, want %s with the sign-in link", kind, s, want)
			}
		})
	}
}

// rotating hands out tok-1 first and tok-2 once asked to replace it.
type rotating struct {
	fakeCredentials
	refreshed int
}

func (r *rotating) Refresh(_ context.Context, _, principal string, rejected map[string]string) (map[string]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refreshed++
	r.tokens[principal] = "tok-2-0123456789"
	return map[string]string{"Authorization": "Bearer tok-2-0123456789"}, nil
}

// strict accepts only tok-2 (the server revoked tok-1 early).
type strict struct{ *connecttest.Memory }

func (s strict) Connect(context.Context) (connect.Conn, error) { return s, nil }
func (s strict) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	if req.Headers["Authorization"] != "Bearer tok-2-0123456789" {
		return nil, fmt.Errorf("server answered 401: %w", connect.ErrNeedsSignIn)
	}
	return s.Memory.Call(ctx, req)
}

// A call whose credentials the server rejects is sent once more with the
// replacement the credentials give (an OAuth token revoked before its
// expiry, refreshed).
func TestRejectedCredentialsReplacedOnce(t *testing.T) {
	t.Parallel()
	st := storetest.New(t)
	creds := &rotating{fakeCredentials: fakeCredentials{tokens: map[string]string{"alice": "tok-1-0123456789"}}}
	mem := strict{connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "whoami"}})}
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("svc", mem))
	must(t, reg.SetAccess("svc", registry.Access{SignIn: registry.SignInPerUser}))
	must(t, reg.Start(context.Background()))
	execs := startWorkers(t, st, reg, 1, "ops", `{"connections":{"svc":{"ops":["*"]}}}`, harness.ExecutionsOptions{Credentials: creds})
	ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(callDoc("whoami", `{}`)), Principal: "alice", Allowlist: "ops"})
	must(t, err)
	ex, err = execs.Wait(context.Background(), ex.ID, 10*time.Second)
	must(t, err)
	if ex.Status != harness.ExecSucceeded || creds.refreshed != 1 || len(mem.Calls()) != 1 {
		t.Fatalf("%s %+v, refreshed %d, calls that reached the server %d", ex.Status, ex.Error, creds.refreshed, len(mem.Calls()))
	}
}

// refusing is a server that answers every call 401 and, once it has,
// cannot be connected to again until someone signs in (the shared token
// was dropped).
type refusing struct {
	*connecttest.Memory
	mu      sync.Mutex
	refused bool
}

func (r *refusing) Connect(context.Context) (connect.Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refused {
		return nil, fmt.Errorf("no shared sign-in: %w", connect.ErrNeedsSignIn)
	}
	return r, nil
}

func (r *refusing) Call(context.Context, connect.CallRequest) (any, error) {
	r.mu.Lock()
	r.refused = true
	r.mu.Unlock()
	return nil, fmt.Errorf("server answered 401: %w", connect.ErrNeedsSignIn)
}

// A call the server refuses for its credentials, even after the harness
// asked for replacements, fails; on a shared sign-in it takes the whole
// connection to needs_sign_in, on a per-user one only that call fails.
func TestRefusedCallNeedsSignIn(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{registry.SignInShared, registry.SignInPerUser} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			st := storetest.New(t)
			creds := &fakeCredentials{tokens: map[string]string{"alice": "tok-alice-0123456789"}}
			srv := &refusing{Memory: connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "whoami"}})}
			reg := registry.NewRegistry(nil)
			must(t, reg.Add("svc", srv))
			must(t, reg.SetAccess("svc", registry.Access{SignIn: kind}))
			must(t, reg.Start(context.Background()))
			t.Cleanup(func() { _ = reg.Close() })
			execs := startWorkers(t, st, reg, 1, "ops", `{"connections":{"svc":{"ops":["*"]}}}`, harness.ExecutionsOptions{Credentials: creds})
			ex, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(callDoc("whoami", `{}`)), Principal: "alice", Allowlist: "ops"})
			must(t, err)
			ex, err = execs.Wait(context.Background(), ex.ID, 10*time.Second)
			must(t, err)
			if ex.Status != harness.ExecFailed || !strings.Contains(ex.Error.Message, connect.ErrNeedsSignIn.Error()) {
				t.Fatalf("execution %s %+v, want failed for a sign-in", ex.Status, ex.Error)
			}
			c, err := reg.Get("svc")
			must(t, err)
			want := connect.StateReady
			if kind == registry.SignInShared {
				want = connect.StateNeedsSignIn
			}
			if s := c.Status(); s.State != want {
				t.Fatalf("status %+v, want %s", s, want)
			}
		})
	}
}
