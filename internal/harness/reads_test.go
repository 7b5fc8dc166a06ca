package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/profiles"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// fakePage is the state of a browser a fake server drives: a page whose
// title a click changes, and a counter of the reads taken.
type fakePage struct {
	mu     sync.Mutex
	url    string
	title  string
	tree   []string
	reads  map[string]int
	titles []string // successive titles summary reads answer, then title
}

func newPage() *fakePage {
	return &fakePage{url: "http://app.test/login", title: "Sign in", tree: []string{`- textbox "Email" [ref=e1]`, `- button "Sign in" [ref=e2]`}, reads: map[string]int{}}
}

func (p *fakePage) count(read string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reads[read]
}

func (p *fakePage) summary(context.Context, map[string]any) (any, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads["browser.page.summary"]++
	if len(p.titles) > 0 {
		p.title, p.titles = p.titles[0], p.titles[1:]
	}
	return map[string]any{"url": p.url, "title": p.title}, nil
}

func (p *fakePage) uiTree(context.Context, map[string]any) (any, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads["ui.tree"]++
	return map[string]any{"tree": strings.Join(p.tree, "\n")}, nil
}

func (p *fakePage) screen(context.Context, map[string]any) (any, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reads["screen.current"]++
	return map[string]any{"data": "iVBORw0KGgoAAAANSUhEUg==", "mimeType": "image/png"}, nil
}

func (p *fakePage) click(_ context.Context, a map[string]any) (any, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a["element"] == `button "Sign in"` {
		p.url, p.title = "http://app.test/home", "Home"
		p.tree = append(p.tree[:0:0], `- heading "Welcome" [ref=e3]`, `- button "Sign out" [ref=e4]`)
	}
	return map[string]any{"done": true}, nil
}

func obj(props ...string) json.RawMessage {
	m := map[string]any{}
	for _, p := range props {
		m[p] = map[string]any{"type": "string"}
	}
	s := map[string]any{"type": "object", "properties": m}
	if len(props) > 0 {
		s["required"] = props
	}
	b, _ := json.Marshal(s)
	return b
}

// pageServer is a server declaring browser@1: its operations, and by
// patchbay's convention a read-only tool named after each read.
func pageServer(p *fakePage) *declaring {
	ro := connect.Annotations{ReadOnlyHint: ptr(true)}
	ops := []connecttest.MemoryOp{
		{Operation: connect.Operation{Name: "navigate", InputSchema: obj("url")}},
		{Operation: connect.Operation{Name: "ui.click", InputSchema: obj("element")}, Fn: p.click},
		{Operation: connect.Operation{Name: "ui.fill", InputSchema: obj("element", "text")}},
		{Operation: connect.Operation{Name: "ui.press", InputSchema: obj("key")}},
		{Operation: connect.Operation{Name: "ui.hover", InputSchema: obj("element"), Annotations: ro}},
		{Operation: connect.Operation{Name: "browser.page.summary", InputSchema: obj(), Annotations: ro}, Fn: p.summary},
		{Operation: connect.Operation{Name: "ui.tree", InputSchema: obj(), Annotations: ro}, Fn: p.uiTree},
		{Operation: connect.Operation{Name: "screen.current", InputSchema: obj(), Annotations: ro}, Fn: p.screen},
	}
	return &declaring{connecttest.NewMemory(ops...), map[string]string{"browser": "1.0.0"}}
}

const snapBinding = `binding: memo-browser
profile: browser@^1
operations:
  navigate: { tool: go, args: { url: args.url } }
  ui.click: { tool: click, args: { element: args.element } }
  ui.fill:  { tool: go }
  ui.press: { tool: go }
reads:
  browser.page.summary:
    tool: snapshot
    args: { mode: '"brief"' }
    project: '{"url": result.location, "title": result.heading}'
`

func verifyDoc(conn, entry, read, claims string) string {
	return `{"version":1,"connections":{"` + conn + `":` + entry + `},"root":{"kind":"verify","id":"v","connection":"` + conn +
		`","read":"` + read + `","claims":` + claims + `,"timeoutMs":3000,"intervalMs":10}}`
}

func runRead(t *testing.T, execs *harness.Executions, doc string) *harness.Execution {
	t.Helper()
	ctx := context.Background()
	ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Principal: "tester", Allowlist: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if ex, err = execs.Wait(ctx, ex.ID, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	return ex
}

func TestVerifyReadRetriesUntilTheClaimsHold(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		page := newPage()
		page.titles = []string{"Loading", "Loading", "Dashboard " + leaked}
		reg := startRegistry(t, map[string]connect.Provider{"web": pageServer(page)}, nil)
		red := secrets.NewSecretRedactor()
		red.Add(leaked)
		execs := startWorkers(t, st, reg, 1, "test", `{"connections":{"web":{"ops":["*"]}}}`, harness.ExecutionsOptions{Redactor: red})

		ex := runRead(t, execs, verifyDoc("web", `{"profile":"browser@^1"}`, "browser.page.summary", `[{"at":"title","contains":"Dashboard"},{"at":"url","equals":"http://app.test/login"}]`))
		if ex.Status != harness.ExecSucceeded {
			t.Fatalf("verify read: %s %+v", ex.Status, ex.Error)
		}
		out := ex.Output.(map[string]any)
		if out["title"] != "Dashboard <redacted>" {
			t.Fatalf("output = %v, want the read's value with the secret redacted", out)
		}
		if n := page.count("browser.page.summary"); n != 3 {
			t.Fatalf("summary read %d times, want 3 (retried until the claim held)", n)
		}
		if data, _ := json.Marshal(ex); strings.Contains(string(data), leaked) {
			t.Fatalf("the secret reached the execution record: %s", data)
		}

		ex = runRead(t, execs, strings.Replace(verifyDoc("web", `{}`, "browser.page.summary", `[{"at":"title","equals":"Never"}]`), `"timeoutMs":3000`, `"timeoutMs":200`, 1))
		if ex.Status != harness.ExecFailed || ex.Error.Code != fault.StepFailed || !strings.Contains(ex.Error.Message, "verify timed out") {
			t.Fatalf("a claim that never holds: %s %+v", ex.Status, ex.Error)
		}
	})
}

func TestVerifyReadValidation(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		reg := startRegistry(t, map[string]connect.Provider{
			"web":   pageServer(newPage()),
			"plain": connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "ping"}}),
		}, nil)
		execs := startWorkers(t, st, reg, 1, "test", `{"connections":{"web":{"ops":["ui.*","navigate"]},"plain":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		cases := []struct {
			name, doc, pointer string
			code               fault.Code
		}{
			{"unknown read", verifyDoc("web", `{"profile":"browser@^1"}`, "browser.page.sumary", `[{"equals":1}]`), "/workflow/root/read", fault.CodeValidationFailed},
			{"unknown read, no entry profile", verifyDoc("web", `{}`, "chat.thread.recent", `[{"equals":1}]`), "/workflow/root/read", fault.CodeValidationFailed},
			{"a connection without a profile", verifyDoc("plain", `{}`, "browser.page.summary", `[{"equals":1}]`), "/workflow/root/connection", fault.CodeValidationFailed},
			{"no connection", strings.Replace(verifyDoc("web", `{}`, "ui.tree", `[{"equals":1}]`), `"connection":"web",`, "", 1), "/workflow/root/connection", fault.CodeValidationFailed},
			{"read not granted", verifyDoc("web", `{}`, "browser.page.summary", `[{"equals":1}]`), "/workflow/root/read", gates.CodeConnectionNotAllowed},
		}
		for _, tc := range cases {
			_, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(tc.doc), Principal: "tester", Allowlist: "test"})
			var ve *fault.ValidationError
			if !errors.As(err, &ve) || ve.Problems[0].Path != tc.pointer || ve.Problems[0].Code != tc.code {
				t.Errorf("%s: err = %v, want %s at %s", tc.name, err, tc.code, tc.pointer)
			}
		}
	})
}

// TestReadGoesThroughTheBindingAndThePolicy reads a bound connection
// (tool, arguments, projection) and shows that the policy judges a read
// by its name and by the tool that takes it.
func TestReadGoesThroughTheBindingAndThePolicy(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		mem := connecttest.NewMemory(
			connecttest.MemoryOp{Operation: connect.Operation{Name: "go"}},
			connecttest.MemoryOp{Operation: connect.Operation{Name: "click"}},
			connecttest.MemoryOp{Operation: connect.Operation{Name: "snapshot", InputSchema: json.RawMessage(`{"type":"object","properties":{"mode":{"enum":["brief"]}},"required":["mode"]}`)},
				Fn: func(context.Context, map[string]any) (any, error) {
					return map[string]any{"location": "http://app.test/", "heading": "Start"}, nil
				}},
		)
		b := loadBinding(t, snapBinding)
		reg := startRegistry(t, map[string]connect.Provider{"web": mem, "locked": mem, "held": mem}, map[string]*profiles.Binding{"web": b, "locked": b, "held": b})
		if err := reg.SetPolicy("locked", registry.Policy{Deny: []string{"snapshot"}}); err != nil {
			t.Fatal(err)
		}
		if err := reg.SetPolicy("held", registry.Policy{Approve: []string{"browser.*"}}); err != nil {
			t.Fatal(err)
		}
		execs := startWorkers(t, st, reg, 1, "test", `{"connections":{"web":{"ops":["*"]},"locked":{"ops":["*"]},"held":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		ex := runRead(t, execs, verifyDoc("web", `{"profile":"browser@^1"}`, "browser.page.summary", `[{"at":"title","equals":"Start"}]`))
		if ex.Status != harness.ExecSucceeded || ex.Output.(map[string]any)["url"] != "http://app.test/" {
			t.Fatalf("bound read: %s %+v %v", ex.Status, ex.Error, ex.Output)
		}
		calls := mem.Calls()
		if len(calls) != 1 || calls[0].Op != "snapshot" || calls[0].Args["mode"] != "brief" {
			t.Fatalf("server calls = %+v, want one snapshot with the bound arguments", calls)
		}
		for conn, want := range map[string]string{"locked": "refused at gate 4", "held": "cannot wait for approval"} {
			ex := runRead(t, execs, strings.Replace(verifyDoc(conn, `{}`, "browser.page.summary", `[{"equals":1}]`), `"timeoutMs":3000`, `"timeoutMs":100`, 1))
			if ex.Status != harness.ExecFailed || !strings.Contains(ex.Error.Message, want) {
				t.Errorf("%s: %s %+v, want a refusal saying %q", conn, ex.Status, ex.Error, want)
			}
		}
		if n := len(mem.Calls()); n != 1 {
			t.Fatalf("%d server calls, want none beyond the first: refused reads are not sent", n)
		}
	})
}

// resourceful is a Memory connection that can also read resources.
type resourceful struct {
	*connecttest.Memory
	mu   sync.Mutex
	uris []string
}

func (r *resourceful) Connect(context.Context) (connect.Conn, error) { return r, nil }

func (r *resourceful) ReadResource(_ context.Context, uri string, _ map[string]string) (any, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.uris = append(r.uris, uri)
	return "- button \"Go\" [ref=e1]", nil
}

func TestBoundReadFromAResource(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		mem := &resourceful{Memory: connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "go"}},
			connecttest.MemoryOp{Operation: connect.Operation{Name: "click"}}, connecttest.MemoryOp{Operation: connect.Operation{Name: "snapshot"}})}
		b := loadBinding(t, snapBinding+"  ui.tree:\n    resource: page://tree\n    project: '{\"tree\": result}'\n")
		reg := startRegistry(t, map[string]connect.Provider{"web": mem}, map[string]*profiles.Binding{"web": b})
		execs := startWorkers(t, st, reg, 1, "test", `{"connections":{"web":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
		ex := runRead(t, execs, verifyDoc("web", `{}`, "ui.tree", `[{"at":"tree","contains":"Go"}]`))
		mem.mu.Lock()
		defer mem.mu.Unlock()
		if ex.Status != harness.ExecSucceeded || len(mem.uris) != 1 || mem.uris[0] != "page://tree" {
			t.Fatalf("resource read: %s %+v %v, uris %v", ex.Status, ex.Error, ex.Output, mem.uris)
		}
	})
}
