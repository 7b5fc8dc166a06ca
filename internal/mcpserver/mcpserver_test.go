package mcpserver_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// The keys of the tests: alice runs, bob runs under a narrower
// allowlist, approver decides approvals.
const (
	aliceKey    = "alice-key"
	bobKey      = "bob-key"
	carolKey    = "carol-key"
	daveKey     = "dave-key"
	approverKey = "approver-key"
	runnerKey   = "runner-key"
	erinKey     = "erin-key"
	secretValue = "s3cr3t-value-for-redaction"
)

// The two eras a client may speak, as the Go SDK names them.
var eras = []string{"2026-07-28", "2025-11-25"}

type bundle struct {
	url   string
	execs *harness.Executions
	mem   *connecttest.Memory
	face  *mcpserver.Server
	als   *gates.Allowlists
	calls atomic.Int64
}

func setup(t *testing.T, o mcpserver.Options) *bundle {
	t.Helper()
	return setupWith(t, o, harness.ExecutionsOptions{}, nil)
}

// setupWith is setup with more engine options (agents), and a wrapper
// around the HTTP handler (nil: none).
func setupWith(t *testing.T, o mcpserver.Options, eo harness.ExecutionsOptions, wrap func(http.Handler) http.Handler) *bundle {
	t.Helper()
	b := &bundle{}
	b.mem = connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "add", Description: "adds a and b",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"number"}},"required":["a","b"]}`)},
			Fn: func(_ context.Context, a map[string]any) (any, error) {
				b.calls.Add(1)
				x, _ := a["a"].(float64)
				y, _ := a["b"].(float64)
				return map[string]any{"sum": x + y}, nil
			}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "guarded", InputSchema: json.RawMessage(`{"type":"object"}`)},
			Fn: func(_ context.Context, a map[string]any) (any, error) { return "done after approval", nil }},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "wipe", InputSchema: json.RawMessage(`{"type":"object"}`)}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "open", InputSchema: json.RawMessage(`{"type":"object"}`)},
			Fn: func(context.Context, map[string]any) (any, error) {
				return map[string]any{"window": map[string]any{"$ref": "win-1", "kind": "window"}}, nil
			}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "use", InputSchema: json.RawMessage(`{"type":"object"}`)},
			Fn: func(_ context.Context, a map[string]any) (any, error) {
				return map[string]any{"used": a["window"]}, nil
			}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "leak", InputSchema: json.RawMessage(`{"type":"object"}`)},
			Fn: func(context.Context, map[string]any) (any, error) { return "the token is " + secretValue, nil }},
	)
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("mem", b.mem))
	must(t, reg.Add("ask", connecttest.NewMemory(connecttest.Asking("color", connect.Question{
		Mode: "form", Message: "Which color?",
		RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{
			"color": map[string]any{"type": "string", "enum": []any{"red", "green"}}}, "required": []any{"color"}},
	}))))
	must(t, reg.Start(context.Background()))
	must(t, reg.SetPolicy("mem", registry.Policy{Approve: []string{"guarded"}, Deny: []string{"wipe"}}))
	st := storetest.New(t)
	als := gates.NewAllowlists(st)
	for name, body := range map[string]string{
		"wide":   `{"connections":{"mem":{"ops":["*"]}}}`,
		"narrow": `{"connections":{"mem":{"ops":["add"]}}}`,
		"agents": `{"connections":{"mem":{"ops":["*"]}},"agents":["codex","example","denier"]}`,
		"askers": `{"connections":{"ask":{"ops":["*"]}}}`,
	} {
		al, err := gates.ParseAllowlist(name, []byte(body))
		must(t, err)
		_, err = als.Put(context.Background(), al, "setup")
		must(t, err)
	}
	redactor := secrets.NewSecretRedactor()
	redactor.Add(secretValue)
	eo.Allowlists, eo.Redactor, eo.Credentials = als, redactor, signedOut{"dave"}
	b.execs = harness.NewExecutions(st, reg, &eo)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = b.execs.Run(ctx, 4); close(done) }()
	o.Engine = b.execs
	o.PublicURL = "https://patchbay.example"
	face := mcpserver.New(o)
	b.face = face
	keys := []api.Key{
		{SHA256: sha256.Sum256([]byte(aliceKey)), Principal: authz.Principal{Name: "alice", Allowlist: "wide"}},
		{SHA256: sha256.Sum256([]byte(bobKey)), Principal: authz.Principal{Name: "bob", Allowlist: "narrow"}},
		{SHA256: sha256.Sum256([]byte(carolKey)), Principal: authz.Principal{Name: "carol", Allowlist: "wide"}},
		{SHA256: sha256.Sum256([]byte(daveKey)), Principal: authz.Principal{Name: "dave", Allowlist: "wide"}},
		{SHA256: sha256.Sum256([]byte(approverKey)), Principal: authz.Principal{Name: "approver", Allowlist: "wide", Roles: []authz.Role{authz.Approve}}},
		{SHA256: sha256.Sum256([]byte(runnerKey)), Principal: authz.Principal{Name: "runner", Allowlist: "agents"}},
		{SHA256: sha256.Sum256([]byte(erinKey)), Principal: authz.Principal{Name: "erin", Allowlist: "askers"}},
	}
	var h http.Handler = api.New(api.Options{Executions: b.execs, Registry: reg, Allowlists: als, APIKeys: keys, MCP: face})
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	b.execs.SetAgentBridge(srv.URL + "/mcp")
	t.Cleanup(func() {
		srv.Close()
		cancel()
		<-done
		reg.Close()
	})
	b.url = srv.URL
	b.als = als
	go face.Watch(ctx)
	return b
}

// signedOut is the per-caller credentials of a connection its principal
// has not signed in to.
type signedOut struct{ principal string }

func (s signedOut) Headers(_ context.Context, _, principal string) (map[string]string, bool, error) {
	if principal == s.principal {
		return nil, false, fmt.Errorf("no token for %s: %w", principal, connect.ErrNeedsSignIn)
	}
	return nil, false, nil
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// bearer adds a key to every request.
type bearer struct {
	key  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.next.RoundTrip(r)
}

func dial(t *testing.T, b *bundle, key, era string, opts *sdk.ClientOptions) *sdk.ClientSession {
	t.Helper()
	if opts == nil {
		opts = &sdk.ClientOptions{}
	}
	client := sdk.NewClient(&sdk.Implementation{Name: "patchbay-test", Version: "1"}, opts)
	tr := &sdk.StreamableClientTransport{Endpoint: b.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{key, http.DefaultTransport}}, MaxRetries: -1}
	cs, err := client.Connect(t.Context(), tr, &sdk.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
		t.Fatalf("%s: connect: %v", era, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func toolNames(t *testing.T, cs *sdk.ClientSession) []string {
	t.Helper()
	var names []string
	for tool, err := range cs.Tools(t.Context(), nil) {
		must(t, err)
		names = append(names, tool.Name)
	}
	return names
}

func text(res *sdk.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*sdk.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "")
}

func TestGoSDKListsAndCallsAsTheCaller(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{})
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			alice := dial(t, b, aliceKey, era, nil)
			if got, want := strings.Join(toolNames(t, alice), ","), "mem_add,mem_guarded,mem_leak,mem_open,mem_use,mem_wipe"; got != want {
				t.Errorf("alice's tools = %s, want %s", got, want)
			}
			bob := dial(t, b, bobKey, era, nil)
			if got := strings.Join(toolNames(t, bob), ","); got != "mem_add" {
				t.Errorf("bob's tools = %s, want mem_add alone", got)
			}

			res, err := alice.CallTool(t.Context(), &sdk.CallToolParams{Name: "mem_add", Arguments: map[string]any{"a": 2, "b": 3}})
			must(t, err)
			if res.IsError || !strings.Contains(text(res), `"sum":5`) {
				t.Fatalf("add = %+v (%s), want sum 5", res, text(res))
			}
			id, _ := res.Meta[mcpserver.MetaExecution].(string)
			ex, err := b.execs.Get(t.Context(), id)
			must(t, err)
			if ex.Principal != "alice" || ex.Status != harness.ExecSucceeded || len(ex.Steps) != 1 {
				t.Fatalf("execution %s = %+v, want alice's, succeeded, one step", id, ex)
			}
			if key := ex.Steps[0].IdempotencyKey; !strings.HasPrefix(key, id+":tool:") {
				t.Errorf("idempotency key = %s, want %s:tool:<call id>", key, id)
			}

			// A tool bob is not offered is not his to call.
			res, err = bob.CallTool(t.Context(), &sdk.CallToolParams{Name: "mem_leak", Arguments: map[string]any{}})
			if err == nil && !res.IsError {
				t.Errorf("bob called mem_leak: %s", text(res))
			}

			// A denied operation is refused at the gate, as a tool error.
			res, err = alice.CallTool(t.Context(), &sdk.CallToolParams{Name: "mem_wipe", Arguments: map[string]any{}})
			must(t, err)
			if !res.IsError || !strings.Contains(text(res), "steering_denied") {
				t.Errorf("wipe = %s, want a steering_denied tool error", text(res))
			}

			// A secret in a result never reaches the client.
			res, err = alice.CallTool(t.Context(), &sdk.CallToolParams{Name: "mem_leak", Arguments: map[string]any{}})
			must(t, err)
			if strings.Contains(text(res), secretValue) || !strings.Contains(text(res), "<redacted>") {
				t.Errorf("leak = %s, want the secret redacted", text(res))
			}
		})
	}
}

func TestSessionsListsLiveClients(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{})
	for _, era := range eras {
		cs := dial(t, b, aliceKey, era, nil)
		_, err := cs.CallTool(t.Context(), &sdk.CallToolParams{Name: "mem_add", Arguments: map[string]any{"a": 1, "b": 2}})
		must(t, err)
	}
	got := map[string]mcpserver.Session{}
	for _, s := range b.face.Sessions() {
		got[s.Era] = s
	}
	for _, era := range eras {
		s, ok := got[era]
		if !ok || s.Principal != "alice" || s.Client != "patchbay-test" || s.Calls != 1 || s.LastCall.IsZero() {
			t.Errorf("%s: session %+v, want alice's patchbay-test client with one call", era, s)
		}
	}
	if s := got["2025-11-25"]; s.ID == "" {
		t.Error("the 2025-era session has no id")
	}
}

// TestRefsAndExecutionsStayTheCallers: a ref one caller's call returns
// is accepted by that caller's next call (in the 2025 era, within its
// session) and refused to another caller; the executions are the
// caller's alone.
func TestRefsAndExecutionsStayTheCallers(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{})
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			alice := dial(t, b, aliceKey, era, nil)
			res, err := alice.CallTool(t.Context(), &sdk.CallToolParams{Name: "mem_open", Arguments: map[string]any{}})
			must(t, err)
			window, _ := res.StructuredContent.(map[string]any)["window"].(map[string]any)
			token, _ := window["$ref"].(string)
			if res.IsError || token == "" || token == "win-1" {
				t.Fatalf("open = %s, want a sealed ref", text(res))
			}
			use := &sdk.CallToolParams{Name: "mem_use", Arguments: map[string]any{"window": map[string]any{"$ref": token}}}
			res, err = alice.CallTool(t.Context(), use)
			must(t, err)
			if res.IsError || !strings.Contains(text(res), "win-1") {
				t.Errorf("alice using her ref = %s, want the raw ref at the connection", text(res))
			}
			aliceExec, _ := res.Meta[mcpserver.MetaExecution].(string)

			carol := dial(t, b, carolKey, era, nil)
			res, err = carol.CallTool(t.Context(), use)
			must(t, err)
			if !res.IsError || !strings.Contains(text(res), "steering_denied") {
				t.Errorf("carol using alice's ref = %s, want it refused", text(res))
			}
			if era == "2025-11-25" {
				other := dial(t, b, aliceKey, era, nil)
				res, err = other.CallTool(t.Context(), use)
				must(t, err)
				if !res.IsError {
					t.Errorf("alice using her ref in another session = %s, want it refused", text(res))
				}
			}

			// Carol cannot read alice's execution, and her list lacks it.
			if status := getAs(t, b, carolKey, "/v1/executions/"+aliceExec); status != http.StatusNotFound {
				t.Errorf("carol GET alice's execution = %d, want 404", status)
			}
			if status := getAs(t, b, aliceKey, "/v1/executions/"+aliceExec); status != http.StatusOK {
				t.Errorf("alice GET her execution = %d, want 200", status)
			}
		})
	}
}

func getAs(t *testing.T, b *bundle, key, path string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func TestACallerNotSignedInIsToldWhere(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{})
	dave := dial(t, b, daveKey, "2026-07-28", nil)
	res, err := dave.CallTool(t.Context(), &sdk.CallToolParams{Name: "mem_add", Arguments: map[string]any{"a": 1, "b": 2}})
	must(t, err)
	if !res.IsError || !strings.Contains(text(res), "https://patchbay.example/oauth/mem/start") {
		t.Errorf("dave's call = %s, want a tool error naming the sign-in URL", text(res))
	}
}

func TestAnEditedAllowlistChangesTheList(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{ListCheck: 50 * time.Millisecond})
	changed := make(chan struct{}, 4)
	alice := dial(t, b, aliceKey, "2025-11-25", &sdk.ClientOptions{
		ToolListChangedHandler: func(context.Context, *sdk.ToolListChangedRequest) { changed <- struct{}{} },
	})
	before := toolNames(t, alice)
	time.Sleep(200 * time.Millisecond) // a check records what alice is offered
	al, err := gates.ParseAllowlist("wide", []byte(`{"connections":{"mem":{"ops":["add","guarded"]}}}`))
	must(t, err)
	_, err = b.als.Put(t.Context(), al, "test")
	must(t, err)
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no notifications/tools/list_changed after the allowlist changed")
	}
	if after := toolNames(t, alice); strings.Join(after, ",") != "mem_add,mem_guarded" {
		t.Errorf("tools after the edit = %v (before %v), want mem_add,mem_guarded", after, before)
	}
}

// TestSignInIsAskedForAsAURL: a 2026-era client that takes URL
// elicitations is asked to open the sign-in URL; its retry with the
// answer, still not signed in, gets the tool error (no loop).
func TestSignInIsAskedForAsAURL(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{})
	w := newWire(t, b, daveKey, true)
	w.tasks, w.elicitURL = false, true
	call := map[string]any{"name": "mem_add", "arguments": map[string]any{"a": 1, "b": 2}}
	_, first := w.send("tools/call", call, nil)
	req, _ := first.Result["inputRequests"].(map[string]any)["sign-in"].(map[string]any)
	params, _ := req["params"].(map[string]any)
	if first.Result["resultType"] != "input_required" || req["method"] != "elicitation/create" ||
		params["mode"] != "url" || params["url"] != "https://patchbay.example/oauth/mem/start" {
		t.Fatalf("first answer = %+v, want a URL elicitation of the sign-in", first.Result)
	}
	call["inputResponses"] = map[string]any{"sign-in": map[string]any{"action": "accept"}}
	_, retry := w.send("tools/call", call, nil)
	content, _ := retry.Result["content"].([]any)
	if retry.Result["isError"] != true || len(content) == 0 || !strings.Contains(fmt.Sprint(content[0]), "/oauth/mem/start") {
		t.Fatalf("retry = %+v, want the tool error naming the sign-in", retry.Result)
	}
}

func TestACallIDNamesOneCall(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{})
	alice := dial(t, b, aliceKey, "2026-07-28", nil)
	call := func(a float64) *sdk.CallToolResult {
		res, err := alice.CallTool(t.Context(), &sdk.CallToolParams{Name: "mem_add", Arguments: map[string]any{"a": a, "b": 1},
			Meta: sdk.Meta{mcpserver.MetaCallID: "one-call"}})
		must(t, err)
		return res
	}
	first, again := call(1), call(1)
	if first.Meta[mcpserver.MetaExecution] != again.Meta[mcpserver.MetaExecution] || b.calls.Load() != 1 {
		t.Errorf("a retry ran as %v (first %v), %d calls reached the connection: want the first call's execution, one call",
			again.Meta[mcpserver.MetaExecution], first.Meta[mcpserver.MetaExecution], b.calls.Load())
	}
	if other := call(2); !other.IsError || !strings.Contains(text(other), "another call") {
		t.Errorf("the call id with other arguments = %s, want it refused", text(other))
	}
	bob := dial(t, b, bobKey, "2026-07-28", nil)
	res, err := bob.CallTool(t.Context(), &sdk.CallToolParams{Name: "mem_add", Arguments: map[string]any{"a": 1, "b": 1},
		Meta: sdk.Meta{mcpserver.MetaCallID: "one-call"}})
	must(t, err)
	if res.IsError || res.Meta[mcpserver.MetaExecution] == first.Meta[mcpserver.MetaExecution] {
		t.Errorf("bob's call with alice's call id = %s (%v): want a call of his own", text(res), res.Meta)
	}
}

func TestNoKeyNoTools(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{})
	for _, key := range []string{"", "wrong"} {
		req, _ := http.NewRequest(http.MethodPost, b.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("key %q: status %d, WWW-Authenticate %q; want 401 with a challenge", key, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}
}

// approveWhenWaiting approves the first approval that appears, as the
// approver key, and returns its id.
func approveWhenWaiting(t *testing.T, b *bundle) <-chan string {
	t.Helper()
	out := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for ctx.Err() == nil {
			list, err := b.execs.Approvals().List(ctx, gates.ApprovalPending, 10)
			if err == nil && len(list) > 0 {
				ap := list[0]
				if _, err := b.execs.Approvals().Decide(ctx, ap.ID, gates.ApprovalApproved, "approver", ""); err == nil {
					out <- ap.ID
					return
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		close(out)
	}()
	return out
}

func TestGuardedCallWaitsForAnotherKeysApproval(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{})
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			var progress atomic.Int64
			alice := dial(t, b, aliceKey, era, &sdk.ClientOptions{
				ProgressNotificationHandler: func(context.Context, *sdk.ProgressNotificationClientRequest) { progress.Add(1) },
			})
			approved := approveWhenWaiting(t, b)
			params := &sdk.CallToolParams{Name: "mem_guarded", Arguments: map[string]any{}}
			params.SetProgressToken("p1")
			res, err := alice.CallTool(t.Context(), params)
			must(t, err)
			if res.IsError || text(res) != "done after approval" {
				t.Fatalf("guarded = %s, want its result after approval", text(res))
			}
			if <-approved == "" {
				t.Fatal("no approval was asked for")
			}
			if progress.Load() == 0 {
				t.Error("no progress notification while the call waited")
			}
		})
	}
}

func TestHeldCallNamesItsApprovalAndARetryGetsTheOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{Hold: 300 * time.Millisecond})
	for i, era := range eras {
		t.Run(era, func(t *testing.T) {
			alice := dial(t, b, aliceKey, era, nil)
			callID := "retry-" + string(rune('a'+i))
			params := &sdk.CallToolParams{Name: "mem_guarded", Arguments: map[string]any{}, Meta: sdk.Meta{mcpserver.MetaCallID: callID}}
			res, err := alice.CallTool(t.Context(), params)
			must(t, err)
			ap, _ := res.Meta[mcpserver.MetaApproval].(string)
			if !res.IsError || ap == "" || !strings.Contains(text(res), ap) || !strings.Contains(text(res), callID) {
				t.Fatalf("held = %s (meta %v), want a tool error naming the approval and the call id", text(res), res.Meta)
			}
			if _, err := b.execs.Approvals().Decide(t.Context(), ap, gates.ApprovalApproved, "approver", ""); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				res, err = alice.CallTool(t.Context(), params)
				must(t, err)
				if !res.IsError || time.Now().After(deadline) {
					break
				}
			}
			if res.IsError || text(res) != "done after approval" {
				t.Fatalf("retry = %s, want the approved call's result", text(res))
			}
		})
	}
}

func TestAnotherCallersSessionIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{})
	alice := dial(t, b, aliceKey, "2025-11-25", nil)
	sid := alice.ID()
	if sid == "" {
		t.Fatal("no session id in the 2025 era")
	}
	req, _ := http.NewRequest(http.MethodPost, b.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Authorization", "Bearer "+bobKey)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("bob with alice's session: %d, want 404", resp.StatusCode)
	}
}

func TestCallsInFlightAreCapped(t *testing.T) {
	t.Parallel()
	b := setup(t, mcpserver.Options{CallsPerPrincipal: 1, Hold: 5 * time.Second})
	alice := dial(t, b, aliceKey, "2026-07-28", nil)
	held := make(chan struct{})
	go func() {
		defer close(held)
		_, _ = alice.CallTool(context.Background(), &sdk.CallToolParams{Name: "mem_guarded", Arguments: map[string]any{}})
	}()
	waitPending(t, b)
	resp := post(t, b, aliceKey, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"mem_add","arguments":{"a":1,"b":1}}}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a second call in flight: %d (Retry-After %q), want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	<-held
}

// waitPending returns once an approval is pending.
func waitPending(t *testing.T, b *bundle) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		list, err := b.execs.Approvals().List(t.Context(), gates.ApprovalPending, 10)
		must(t, err)
		if len(list) > 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no approval became pending")
}

// post sends one JSON-RPC message as a 2025-era client without a
// session would, and returns the response (its body read and closed).
func post(t *testing.T, b *bundle, key, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.url+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}
