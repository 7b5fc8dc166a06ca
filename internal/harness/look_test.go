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
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/pools"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// lookCounter is an Observer that also counts looks.
type lookCounter struct {
	mu     sync.Mutex
	tokens map[string]int // "read form" → tokens
}

func (c *lookCounter) CallDone(string, string, string, time.Duration) {}
func (c *lookCounter) ExecutionEntered(harness.ExecState)             {}
func (c *lookCounter) LookTokens(read, form string, tokens int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tokens == nil {
		c.tokens = map[string]int{}
	}
	c.tokens[read+" "+form] += tokens
}

func (c *lookCounter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tokens[key]
}

// lookMessages is the look layer text of each request: the user
// messages after the first (the input).
func lookMessages(req agent.ModelRequest) []string {
	var out []string
	for i, m := range req.Messages {
		if i > 0 && m.Role == agent.RoleUser {
			out = append(out, m.Text)
		}
	}
	return out
}

func lookEvents(t *testing.T, execs *harness.Executions, id string) []map[string]any {
	t.Helper()
	events, err := execs.Events(context.Background(), id, "", 0)
	must(t, err)
	var out []map[string]any
	for _, ev := range events {
		if ev.Type == agent.EventLook {
			out = append(out, ev.Data)
		}
	}
	return out
}

// TestModelLooksAtItsConnection runs an agent over a server declaring
// browser@1: the page summary before every round (whole, then as changes),
// the tree before the first round and after the round that clicked, a
// screenshot only when asked for, with its image withheld.
func TestModelLooksAtItsConnection(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		page := newPage()
		page.titles = []string{"Sign in", "Sign in"}
		srv := pageServer(page)
		reg := startRegistry(t, map[string]connect.Provider{"web": srv}, nil)
		models := &scriptModels{rounds: []agent.ModelResponse{
			{ToolCalls: []agent.ModelToolCall{toolCall("c1", "web_call", `{"op":"ui.hover","args":{"element":"button \"Sign in\""}}`)}},
			{ToolCalls: []agent.ModelToolCall{toolCall("c2", "web_ui_click", `{"element":"button \"Sign in\""}`)}},
			{ToolCalls: []agent.ModelToolCall{toolCall("c3", "web_look", `{"read":"screen.current"}`), toolCall("c4", "web_look", `{"read":"ui.tree"}`),
				toolCall("c5", "web_call", `{"op":"screen.current","args":{}}`)}},
			{Text: "Signed in."},
		}}
		red := secrets.NewSecretRedactor()
		red.Add(leaked)
		obs := &lookCounter{}
		execs := startWorkers(t, st, reg, 1, "agents", `{"connections":{"web":{"ops":["*"]}}}`, harness.ExecutionsOptions{Models: models, Redactor: red, Observer: obs})
		page.mu.Lock()
		page.tree = append(page.tree, `- text "key `+leaked+`"`)
		page.mu.Unlock()

		doc := `{"version":1,"connections":{"web":{"profile":"browser@^1"}},"root":{"kind":"model","id":"turn","model":"fake/m1"}}`
		ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Input: "Sign in.", Principal: "alice", Allowlist: "agents"})
		must(t, err)
		ex, err = execs.Wait(ctx, ex.ID, 20*time.Second)
		must(t, err)
		if ex.Status != harness.ExecSucceeded || ex.Output != "Signed in." {
			t.Fatalf("execution %s %+v %v", ex.Status, ex.Error, ex.Output)
		}
		reqs := models.requests()
		if len(reqs) != 4 {
			t.Fatalf("%d rounds, want 4", len(reqs))
		}
		last := func(i int) string {
			msgs := lookMessages(reqs[i])
			if len(msgs) == 0 {
				t.Fatalf("round %d: no look layer", i+1)
			}
			return msgs[len(msgs)-1]
		}
		want := []struct{ has, hasNot []string }{
			{[]string{"[web browser.page.summary]\nhttp://app.test/login — Sign in", "[web ui.tree]\n- textbox \"Email\" [ref=e1]\n- button \"Sign in\" [ref=e2]\n- text \"key <redacted>\""}, []string{"screen.current"}},
			{[]string{"[web browser.page.summary: unchanged]"}, []string{"ui.tree", "login"}},
			{[]string{"[web browser.page.summary: changes since last shown]\n- http://app.test/login — Sign in\n+ http://app.test/home — Home",
				"[web ui.tree: changes since last shown]\n- - textbox \"Email\" [ref=e1]\n- - button \"Sign in\" [ref=e2]\n- - text \"key <redacted>\"\n+ - heading \"Welcome\" [ref=e3]\n+ - button \"Sign out\" [ref=e4]"}, nil},
			{[]string{"[web browser.page.summary: unchanged]"}, []string{"ui.tree"}},
		}
		for i, w := range want {
			got := last(i)
			for _, s := range w.has {
				if !strings.Contains(got, s) {
					t.Errorf("round %d look:\n%s\nwant it to hold:\n%s", i+1, got, s)
				}
			}
			for _, s := range w.hasNot {
				if strings.Contains(got, s) {
					t.Errorf("round %d look:\n%s\nwant no %q", i+1, got, s)
				}
			}
		}
		var ops []string
		for _, c := range srv.Calls() {
			ops = append(ops, c.Op)
		}
		if !strings.Contains(strings.Join(ops, ","), "ui.hover,browser.page.summary,ui.click") {
			t.Errorf("server calls = %v, want the read-only hover (through web_call) and then the click", ops)
		}
		if n := page.count("ui.tree"); n != 2 {
			t.Errorf("ui.tree read %d times, want 2 (before round 1, after the click)", n)
		}
		if n := page.count("screen.current"); n != 2 {
			t.Errorf("screen.current read %d times, want 2 (asked for once, called once)", n)
		}

		// The look tool: offered with the ask reads only, answering the
		// read with its sensitive image withheld.
		var lookTool *agent.ModelTool
		for i, tool := range reqs[0].Tools {
			if tool.Name == "web_look" {
				lookTool = &reqs[0].Tools[i]
			}
		}
		if lookTool == nil || !strings.Contains(string(lookTool.InputSchema), `"enum":["screen.current"]`) {
			t.Fatalf("web_look tool = %+v", lookTool)
		}
		results := reqs[3].Messages[len(reqs[3].Messages)-2].ToolResults
		if len(results) != 3 || results[0].Content != "[web screen.current]\n[screenshot image/png]" || results[0].IsError ||
			!results[1].IsError || !strings.Contains(results[1].Content, `"ui.tree" is not a read this step may ask for`) ||
			results[2].Content != `{"data":"[sensitive blob withheld]","mimeType":"image/png"}` {
			t.Fatalf("look results = %+v", results)
		}
		data, _ := json.Marshal(reqs)
		rec, _ := json.Marshal(ex)
		for _, secret := range []string{"iVBORw0KGgo", leaked} {
			if strings.Contains(string(data), secret) || strings.Contains(string(rec), secret) {
				t.Fatalf("%q reached the model or the record", secret)
			}
		}

		events := lookEvents(t, execs, ex.ID)
		var forms []string
		for _, ev := range events {
			forms = append(forms, ev["read"].(string)+" "+ev["form"].(string))
			if tok, _ := ev["tokens"].(float64); tok <= 0 || ev["connection"] != "web" {
				t.Errorf("look event without tokens or connection: %v", ev)
			}
		}
		wantForms := "browser.page.summary full,ui.tree full,browser.page.summary unchanged,browser.page.summary diff,ui.tree diff,screen.current full,browser.page.summary unchanged"
		if strings.Join(forms, ",") != wantForms {
			t.Fatalf("look events:\n%s\nwant\n%s", strings.Join(forms, ","), wantForms)
		}
		if obs.get("ui.tree full") == 0 || obs.get("browser.page.summary diff") == 0 {
			t.Fatalf("observer tokens = %v", obs.tokens)
		}
	})
}

// TestLookDiffsAcrossAResume parks a turn for an approval after its first
// look: the resumed run replays that look from the ledger (the page is not
// read again for it) and shows the next one as changes against it.
func TestLookDiffsAcrossAResume(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		page := newPage()
		reg := startRegistry(t, map[string]connect.Provider{"web": pageServer(page)}, nil)
		must(t, reg.SetPolicy("web", registry.Policy{Approve: []string{"ui.click"}}))
		models := &scriptModels{rounds: []agent.ModelResponse{
			{ToolCalls: []agent.ModelToolCall{toolCall("c1", "web_ui_click", `{"element":"button \"Sign in\""}`)}},
			{Text: "Done."},
		}}
		execs := startWorkers(t, st, reg, 1, "agents", `{"connections":{"web":{"ops":["*"]}}}`, harness.ExecutionsOptions{Models: models})
		doc := `{"version":1,"connections":{"web":{"look":{"ui.tree":"ask"}}},"root":{"kind":"model","id":"turn","model":"fake/m1"}}`
		ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Input: "Sign in.", Principal: "alice", Allowlist: "agents"})
		must(t, err)
		ap := waitApproval(t, execs, ex.ID)
		waitStatus(t, execs, ex.ID, harness.ExecWaiting)
		_, err = execs.Approvals().Decide(ctx, ap.ID, gates.ApprovalApproved, "bob", "")
		must(t, err)
		ex, err = execs.Wait(ctx, ex.ID, 20*time.Second)
		must(t, err)
		if ex.Status != harness.ExecSucceeded {
			t.Fatalf("execution %s %+v", ex.Status, ex.Error)
		}
		reqs := models.requests()
		if len(reqs) != 2 {
			t.Fatalf("%d rounds sent, want 2", len(reqs))
		}
		msgs := lookMessages(reqs[1])
		if len(msgs) != 2 || msgs[0] != lookMessages(reqs[0])[0] {
			t.Fatalf("the resumed transcript's looks = %q, want round 1's look replayed as sent", msgs)
		}
		if !strings.Contains(msgs[1], "[web browser.page.summary: changes since last shown]\n- http://app.test/login — Sign in\n+ http://app.test/home — Home") ||
			strings.Contains(msgs[1], "ui.tree") {
			t.Fatalf("round 2 look:\n%s", msgs[1])
		}
		if n := page.count("browser.page.summary"); n != 2 {
			t.Fatalf("summary read %d times, want 2: the replayed look is not taken again", n)
		}
	})
}

func TestLookValidation(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		reg := startRegistry(t, map[string]connect.Provider{"web": pageServer(newPage())}, nil)
		execs := startWorkers(t, st, reg, 1, "agents", `{"connections":{"web":{"ops":["*"]}}}`, harness.ExecutionsOptions{Models: &scriptModels{}})
		for entry, pointer := range map[string]string{
			`{"look":{"ui.tree":"always"}}`:                       "/workflow/connections/web/look/ui.tree",
			`{"profile":"browser@^1","look":{"ui.trees":"turn"}}`: "/workflow/connections/web/look/ui.trees",
			`{"look":["ui.tree"]}`:                                "/workflow/connections/web/look",
		} {
			doc := `{"version":1,"connections":{"web":` + entry + `},"root":{"kind":"model","id":"turn","model":"fake/m1"}}`
			_, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(doc), Principal: "alice", Allowlist: "agents"})
			var ve *fault.ValidationError
			if !errors.As(err, &ve) || ve.Problems[0].Path != pointer {
				t.Errorf("%s: err = %v, want a problem at %s", entry, err, pointer)
			}
		}
	})
}

// TestReadsOnAPoolHandle leases a browser from a pool whose servers
// declare browser@1: a model turn looks at the handle (leasing it), clicks
// through it, and a verify reads the same lease.
func TestReadsOnAPoolHandle(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		pool, err := pools.New(st, "browsers", 2, nil)
		must(t, err)
		var mu sync.Mutex
		var pages []*fakePage
		prov, err := pools.NewProvider(pool, pools.ProviderOptions{Wait: 5 * time.Second, RefreshEvery: 50 * time.Millisecond,
			Provision: func(context.Context, map[string]any) (connect.Conn, error) {
				p := newPage()
				mu.Lock()
				pages = append(pages, p)
				mu.Unlock()
				return pageServer(p), nil
			}})
		must(t, err)
		reg := startRegistry(t, map[string]connect.Provider{"browsers": prov}, nil)
		models := &scriptModels{rounds: []agent.ModelResponse{
			{ToolCalls: []agent.ModelToolCall{toolCall("c1", "app_ui_click", `{"element":"button \"Sign in\""}`)}},
			{Text: "Signed in."},
		}}
		execs := startWorkers(t, st, reg, 1, "test", `{"connections":{"browsers":{"ops":["*"]}}}`, harness.ExecutionsOptions{Models: models})
		doc := `{"version":1,"connections":{"app":{"from":"browsers","profile":"browser@^1","look":{"ui.tree":"ask"}}},"root":{"kind":"sequence","id":"s","steps":[
			{"kind":"model","id":"turn","model":"fake/m1"},
			{"kind":"verify","id":"home","connection":"app","read":"browser.page.summary","claims":[{"at":"title","equals":"Home"}],"timeoutMs":2000}]}}`
		ex := runRead(t, execs, doc)
		if ex.Status != harness.ExecSucceeded || ex.Output.(map[string]any)["url"] != "http://app.test/home" {
			t.Fatalf("execution %s %+v %v", ex.Status, ex.Error, ex.Output)
		}
		reqs := models.requests()
		if len(reqs) != 2 || !strings.Contains(lookMessages(reqs[0])[0], "[app browser.page.summary]\nhttp://app.test/login — Sign in") ||
			!strings.Contains(lookMessages(reqs[1])[1], "+ http://app.test/home — Home") {
			t.Fatalf("looks on the handle: %q", [][]string{lookMessages(reqs[0]), lookMessages(reqs[1])})
		}
		mu.Lock()
		defer mu.Unlock()
		var read []int
		for _, p := range pages {
			if n := p.count("browser.page.summary"); n > 0 {
				read = append(read, n)
			}
		}
		if len(read) != 1 || read[0] != 3 {
			t.Fatalf("summary reads per browser = %v, want 3 on the one leased browser (two looks, one verify)", read)
		}
	})
}
