package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/profiles"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// declaring is a Memory connection whose server declares profiles.
type declaring struct {
	*connecttest.Memory
	profiles map[string]string
}

func (d *declaring) Connect(context.Context) (connect.Conn, error) { return d, nil }

func (d *declaring) Manifest() connect.Manifest {
	m := d.Memory.Manifest()
	m.Profiles = d.profiles
	return m
}

func chatOps(post func(context.Context, map[string]any) (any, error)) []connecttest.MemoryOp {
	schema := func(fields ...string) json.RawMessage {
		props := map[string]any{}
		for _, f := range fields {
			props[f] = map[string]any{"type": "string"}
		}
		b, _ := json.Marshal(map[string]any{"type": "object", "required": fields, "properties": props})
		return b
	}
	return []connecttest.MemoryOp{
		{Operation: connect.Operation{Name: "chat.post", InputSchema: schema("channel", "text")}, Fn: post},
		{Operation: connect.Operation{Name: "chat.reply", InputSchema: schema("thread", "text")}},
	}
}

func posted(_ context.Context, a map[string]any) (any, error) {
	return map[string]any{"message": "m1", "thread": a["channel"].(string) + "/m1"}, nil
}

func startRegistry(t *testing.T, conns map[string]connect.Provider, bindings map[string]*profiles.Binding) *registry.Registry {
	t.Helper()
	reg := registry.NewRegistry(nil)
	for name, p := range conns {
		if err := reg.Add(name, p); err != nil {
			t.Fatal(err)
		}
		if b := bindings[name]; b != nil {
			if err := reg.SetBinding(name, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	_ = reg.Start(context.Background()) // a contradicting server fails to start; its status says why
	t.Cleanup(func() { _ = reg.Close() })
	return reg
}

func TestDeclaredProfilesAreChecked(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		declares map[string]string
		ops      []connecttest.MemoryOp
		want     string // in LastError; "" means ready
	}{
		{"chat@1 with its operations", map[string]string{"chat": "1.0.0"}, chatOps(posted), ""},
		{"a newer minor version", map[string]string{"chat": "1.4.0"}, chatOps(posted), ""},
		{"a profile this server does not know", map[string]string{"fax": "3.0.0"}, chatOps(posted), ""},
		{"chat@1 without chat.reply", map[string]string{"chat": "1.0.0"}, chatOps(posted)[:1], "missing operation chat.reply"},
		{"browser@1 without ui.click", map[string]string{"browser": "1.0.0"}, []connecttest.MemoryOp{{Operation: connect.Operation{Name: "navigate"}}}, "missing operation ui.click"},
		{"a version that is not semver", map[string]string{"chat": "one"}, chatOps(posted), "not a semantic version"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := startRegistry(t, map[string]connect.Provider{"c": &declaring{connecttest.NewMemory(tc.ops...), tc.declares}}, nil)
			c, _ := reg.Get("c")
			st := c.Status()
			if tc.want == "" {
				if st.State != connect.StateReady || len(c.Profiles()) != 1 {
					t.Fatalf("status = %+v, profiles = %+v", st, c.Profiles())
				}
				return
			}
			if st.State != connect.StateUnavailable || !strings.Contains(st.LastError, tc.want) {
				t.Fatalf("status = %s %q, want unavailable naming %q", st.State, st.LastError, tc.want)
			}
		})
	}
}

// typedSetup runs workers over a registry with "chat", a server declaring
// chat@1 whose chat.post answers with post.
func typedSetup(t *testing.T, st *store.Store, post func(context.Context, map[string]any) (any, error)) *harness.Executions {
	t.Helper()
	reg := startRegistry(t, map[string]connect.Provider{"chat": &declaring{connecttest.NewMemory(chatOps(post)...), map[string]string{"chat": "1.0.0"}}}, nil)
	return startWorkers(t, st, reg, 1, "test", `{"connections":{"chat":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
}

func typedDoc(entry, op, args string) string {
	return `{"version":1,"connections":{"chat":` + entry + `},"root":{"kind":"call","id":"p","connection":"chat","op":"` + op + `","args":` + args + `}}`
}

func TestTypedStepValidation(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		execs := typedSetup(t, st, posted)
		cases := []struct{ name, doc, pointer string }{
			{"unknown profile", typedDoc(`{"profile":"fax@^1"}`, "chat.post", `{}`), "/workflow/connections/chat/profile"},
			{"unsatisfied range", typedDoc(`{"profile":"chat@^2"}`, "chat.post", `{}`), "/workflow/connections/chat/profile"},
			{"profile the connection does not speak", typedDoc(`{"profile":"browser@^1"}`, "chat.post", `{}`), "/workflow/connections/chat/profile"},
			{"operation the profile lacks", typedDoc(`{"profile":"chat@^1"}`, "chat.fax", `{}`), "/workflow/root/op"},
			{"arguments against the profile", typedDoc(`{"profile":"chat@^1"}`, "chat.post", `{"channel":"#a","text":""}`), "/workflow/root/args"},
		}
		for _, tc := range cases {
			_, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(tc.doc), Principal: "tester", Allowlist: "test"})
			var ve *fault.ValidationError
			if !errors.As(err, &ve) || ve.Problems[0].Path != tc.pointer {
				t.Errorf("%s: err = %v, want a problem at %s", tc.name, err, tc.pointer)
			}
		}
	})
}

func TestTypedStepRuns(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		broken := func(_ context.Context, a map[string]any) (any, error) {
			if a["channel"] == "#broken" {
				return map[string]any{"message": "m1"}, nil
			}
			return posted(ctx, a)
		}
		execs := typedSetup(t, st, broken)
		run := func(args string) *harness.Execution {
			t.Helper()
			ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(typedDoc(`{"profile":"chat@^1"}`, "chat.post", args)), Input: map[string]any{"text": ""}, Principal: "tester", Allowlist: "test"})
			if err != nil {
				t.Fatal(err)
			}
			if ex, err = execs.Wait(ctx, ex.ID, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			return ex
		}
		if ex := run(`{"channel":"#a","text":"hi"}`); ex.Status != harness.ExecSucceeded || ex.Output.(map[string]any)["thread"] != "#a/m1" {
			t.Fatalf("typed post: %s %+v %v", ex.Status, ex.Error, ex.Output)
		}
		ex := run(`{"channel":"#broken","text":"hi"}`)
		if ex.Status != harness.ExecFailed || ex.Error.Code != fault.StepFailed || !strings.Contains(ex.Error.Message, "contradicts chat@1.0.0") {
			t.Fatalf("contradicting result: %s %+v", ex.Status, ex.Error)
		}
		// Computed arguments are checked when the step runs.
		ex = run(`{"channel":"#a","text":{"$expr":"$input.text"}}`)
		if ex.Status != harness.ExecFailed || !strings.Contains(ex.Error.Message, "do not match chat@1.0.0 operation chat.post") {
			t.Fatalf("computed arguments: %s %+v", ex.Status, ex.Error)
		}
	})
}

const chatBinding = `binding: memo-chat
profile: chat@^1
operations:
  chat.post:
    tool: send
    args: { to: args.channel, body: args.text }
    result: '{"message": result.id, "thread": result.to + "/" + result.id}'
  chat.reply:
    tool: send
    args: { to: args.thread, body: args.text }
    result: '{"message": result.id, "thread": result.to}'
`

func loadBinding(t *testing.T, body string) *profiles.Binding {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "b.yaml"), []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cat := profiles.Builtin()
	if err := cat.LoadDir(dir); err != nil {
		t.Fatal(err)
	}
	// The binding is named by the file's first line.
	name := strings.TrimPrefix(strings.SplitN(body, "\n", 2)[0], "binding: ")
	b, ok := cat.Binding(name)
	if !ok {
		t.Fatalf("binding %q did not load", name)
	}
	return b
}

func TestBoundConnectionRunsProfileOperations(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "send"}, Fn: func(_ context.Context, a map[string]any) (any, error) {
			return map[string]any{"id": "x9", "to": a["to"]}, nil
		}})
		reg := startRegistry(t, map[string]connect.Provider{"chat": mem}, map[string]*profiles.Binding{"chat": loadBinding(t, chatBinding)})
		c, _ := reg.Get("chat")
		if p := c.Profiles(); len(p) != 1 || p[0].Binding != "memo-chat" || p[0].Version != "1.0.0" {
			t.Fatalf("profiles = %+v", p)
		}
		execs := startWorkers(t, st, reg, 1, "test", `{"connections":{"chat":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(typedDoc(`{"profile":"chat@^1.0"}`, "chat.post", `{"channel":"#a","text":"hi"}`)), Principal: "tester", Allowlist: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if ex, err = execs.Wait(ctx, ex.ID, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if ex.Status != harness.ExecSucceeded || ex.Output.(map[string]any)["thread"] != "#a/x9" {
			t.Fatalf("bound post: %s %+v %v", ex.Status, ex.Error, ex.Output)
		}
		calls := mem.Calls()
		if len(calls) != 1 || calls[0].Op != "send" || calls[0].Args["to"] != "#a" || calls[0].Args["body"] != "hi" {
			t.Fatalf("server calls = %+v", calls)
		}
	})
}

func TestBindingToAMissingToolIsUnavailable(t *testing.T) {
	t.Parallel()
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "post"}})
	reg := startRegistry(t, map[string]connect.Provider{"chat": mem}, map[string]*profiles.Binding{"chat": loadBinding(t, chatBinding)})
	c, _ := reg.Get("chat")
	if st := c.Status(); st.State != connect.StateUnavailable || !strings.Contains(st.LastError, `binding memo-chat: the server has no tool "send"`) {
		t.Fatalf("status = %s %q", st.State, st.LastError)
	}
}

// memoPool is a pool "chats" whose leases are fresh Memory servers with
// the tool "send" (memo-chat binds chat@1 onto it); each lease's server is
// kept in servers.
func memoPool(t *testing.T, st *store.Store, servers *[]*connecttest.Memory) *registry.Registry {
	t.Helper()
	pool, err := pools.New(st, "chats", 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	prov, err := pools.NewProvider(pool, pools.ProviderOptions{Wait: 5 * time.Second, Provision: func(context.Context, map[string]any) (connect.Conn, error) {
		mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "send"}, Fn: func(_ context.Context, a map[string]any) (any, error) {
			return map[string]any{"id": "x9", "to": a["to"]}, nil
		}})
		mu.Lock()
		*servers = append(*servers, mem)
		mu.Unlock()
		return mem, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return startRegistry(t, map[string]connect.Provider{"chats": prov}, map[string]*profiles.Binding{"chats": loadBinding(t, chatBinding)})
}

// TestBoundPoolLeasesSpeakTheProfile: a binding on a pool binds every
// lease's server, so a typed step on a handle runs the profile operation
// as the bound tool of its own fresh server, and its once record is kept.
func TestBoundPoolLeasesSpeakTheProfile(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		var servers []*connecttest.Memory
		reg := memoPool(t, st, &servers)
		c, _ := reg.Get("chats")
		if p := c.Profiles(); c.State() != connect.StateReady || len(p) != 1 || p[0].Binding != "memo-chat" {
			t.Fatalf("pool: %s, profiles %+v", c.State(), p)
		}
		execs := startWorkers(t, st, reg, 1, "test", `{"connections":{"chats":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		doc := `{"version":1,"connections":{"team":{"from":"chats","profile":"chat@^1"}},
			"root":{"kind":"call","id":"p","connection":"team","op":"chat.post","args":{"channel":"#a","text":"hi"}}}`
		ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Principal: "tester", Allowlist: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if ex, err = execs.Wait(ctx, ex.ID, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if ex.Status != harness.ExecSucceeded || ex.Output.(map[string]any)["thread"] != "#a/x9" {
			t.Fatalf("bound post on a lease: %s %+v %v", ex.Status, ex.Error, ex.Output)
		}
		// The probe's server answered no call; the lease's sent one.
		var sends []connect.CallRequest
		for _, s := range servers {
			sends = append(sends, s.Calls()...)
		}
		if len(servers) != 2 || len(sends) != 1 || sends[0].Op != "send" || sends[0].Args["body"] != "hi" {
			t.Fatalf("%d servers, calls %+v", len(servers), sends)
		}
		if keys, _ := st.Client.Keys(ctx, st.Key("once", "*")).Result(); len(keys) != 1 {
			t.Fatalf("once records = %v, want the post's", keys)
		}
		// Checked against what the pool speaks, not just the catalog.
		for _, tc := range []struct{ entry, op, pointer string }{
			{`{"from":"chats","profile":"browser@^1"}`, "navigate", "/workflow/connections/team/profile"},
			{`{"from":"chats","profile":"chat@^2"}`, "chat.post", "/workflow/connections/team/profile"},
			{`{"from":"chats","profile":"chat@^1"}`, "chat.fax", "/workflow/root/op"},
		} {
			doc := `{"version":1,"connections":{"team":` + tc.entry + `},"root":{"kind":"call","id":"p","connection":"team","op":"` + tc.op + `","args":{"url":"http://x/"}}}`
			_, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Principal: "tester", Allowlist: "test"})
			var ve *fault.ValidationError
			if !errors.As(err, &ve) || ve.Problems[0].Path != tc.pointer {
				t.Errorf("%s %s: err = %v, want a problem at %s", tc.entry, tc.op, err, tc.pointer)
			}
		}
	})
}
