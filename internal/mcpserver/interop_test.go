package mcpserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/mcpserver"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// The clients nobody here wrote that /mcp is tested against, pinned so
// that a release cannot change a result without a commit.
const (
	// tsSDK is the TypeScript SDK's v1 line, which speaks the 2025 era
	// (initialize, Mcp-Session-Id); the same pin as the other interop
	// tests (internal/oauth, internal/bearer, cmd/server).
	tsSDK = "@modelcontextprotocol/sdk@1.32.2"
	// tsClient is the TypeScript SDK's v2 client package, released with
	// tsSDK, which speaks 2026-07-28 (server/discover, no session).
	tsClient = "@modelcontextprotocol/client@2.4.0"
	// inspector is the MCP Inspector, run in its CLI mode (Node 22).
	inspector = "@modelcontextprotocol/inspector@2.12.0"
	// serverConformance is the conformance suite whose server scenarios
	// run against /mcp: the release internal/mcp's client scenarios pin.
	serverConformance = "@modelcontextprotocol/conformance@0.2.0-alpha.12"
)

// aliceTools are the tools alice is offered, sorted.
const aliceTools = "mem_add,mem_guarded,mem_leak,mem_open,mem_use,mem_wipe"

// sortedNames is names sorted, joined with commas: the order of tools/list
// is not part of what a client may rely on.
func sortedNames(names []string) string {
	return strings.Join(slices.Sorted(slices.Values(names)), ",")
}

// tsProc is one node process running testdata/tsclient.mjs: the test
// sends it a command a line and reads its answer a line, so it can act
// (approve, look at the ledger) between two steps of a real client.
type tsProc struct {
	in     io.WriteCloser
	lines  chan string
	stderr *logBuffer
}

func startTSClient(t *testing.T, flavor, dir string) *tsProc {
	t.Helper()
	script, err := filepath.Abs(filepath.Join("testdata", "tsclient.mjs"))
	must(t, err)
	node := npmtest.Node(t)
	cmd := exec.Command(node, script, flavor, dir)
	cmd.Env = []string{"PATH=" + filepath.Dir(node), "NO_COLOR=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &tsProc{lines: make(chan string, 16), stderr: &logBuffer{}}
	cmd.Stderr = p.stderr
	p.in, err = cmd.StdinPipe()
	must(t, err)
	out, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() {
		_ = p.in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	return p
}

// tsAnswer is what tsclient.mjs answers a command.
type tsAnswer struct {
	OK    bool   `json:"ok"`
	Error string `json:"error"`
	// connect
	SDK             string `json:"sdk"`
	Era             string `json:"era"`
	ProtocolVersion string `json:"protocolVersion"`
	SessionID       string `json:"sessionId"`
	Server          string `json:"server"`
	// list
	Tools []string `json:"tools"`
	// call
	Result   *tsResult `json:"result"`
	Progress []struct {
		Progress float64 `json:"progress"`
		Message  string  `json:"message"`
	} `json:"progress"`
	raw string
}

type tsResult struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StructuredContent map[string]any `json:"structuredContent"`
	IsError           bool           `json:"isError"`
	Meta              map[string]any `json:"_meta"`
}

func (r *tsResult) text() string {
	var parts []string
	for _, c := range r.Content {
		parts = append(parts, c.Text)
	}
	return strings.Join(parts, "")
}

func (r *tsResult) meta(key string) string {
	s, _ := r.Meta[key].(string)
	return s
}

// send runs one command and returns its answer, whether it succeeded or
// not.
func (p *tsProc) send(t *testing.T, cmd map[string]any) tsAnswer {
	t.Helper()
	line, err := json.Marshal(cmd)
	must(t, err)
	if _, err := p.in.Write(append(line, '\n')); err != nil {
		t.Fatalf("tsclient: write %s: %v\n%s", line, err, p.stderr)
	}
	select {
	case out, ok := <-p.lines:
		if !ok {
			t.Fatalf("tsclient exited at %s:\n%s", line, p.stderr)
		}
		var a tsAnswer
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("tsclient answered %s with %q: %v", line, out, err)
		}
		a.raw = out
		return a
	case <-time.After(90 * time.Second):
		t.Fatalf("tsclient did not answer %s within 90s:\n%s", line, p.stderr)
	}
	return tsAnswer{}
}

// do is send for a command that must succeed.
func (p *tsProc) do(t *testing.T, cmd map[string]any) tsAnswer {
	t.Helper()
	a := p.send(t, cmd)
	if !a.OK {
		t.Fatalf("%v: %s\n%s", cmd, a.Error, p.stderr)
	}
	return a
}

// TestInteropTypeScriptClients has the official TypeScript client drive
// /mcp in each era, as alice (and bob), through the steps an MCP host
// takes: list, call, a guarded call approved by another key while the
// client is held (with progress), a held call retried with its call id
// after approval, a secret redacted, a denied call refused.
func TestInteropTypeScriptClients(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, flavor, folder, spec string
		mode                       string // how the client negotiates its era
		wantEra, wantVersion       string
		session                    bool // the era has an Mcp-Session-Id
	}{
		{"sdk v1 2025-11-25", "sdk", "sdk", tsSDK, "legacy", "legacy", "2025-11-25", true},
		{"client v2 2026-07-28", "client", "mcp-client", tsClient, "pin", "modern", "2026-07-28", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := npmtest.Require(t, tt.folder, tt.spec)
			b := setup(t, mcpserver.Options{})
			short := setup(t, mcpserver.Options{Hold: 300 * time.Millisecond})
			ts := startTSClient(t, tt.flavor, dir)
			connect := func(t *testing.T, as string, b *bundle, key, mode string) tsAnswer {
				t.Helper()
				a := ts.do(t, map[string]any{"op": "connect", "as": as, "url": b.url + "/mcp", "key": key, "mode": mode})
				if a.Era != tt.wantEra || a.ProtocolVersion != tt.wantVersion || (a.SessionID != "") != tt.session || a.Server != "patchbay" {
					t.Errorf("%s connected as %+v, want era %s, version %s, a session id: %v, server patchbay", as, a, tt.wantEra, tt.wantVersion, tt.session)
				}
				return a
			}
			hello := connect(t, "alice", b, aliceKey, tt.mode)
			t.Logf("%s: era %s, protocol %s, session %q", hello.SDK, hello.Era, hello.ProtocolVersion, hello.SessionID)
			connect(t, "bob", b, bobKey, tt.mode)
			connect(t, "held", short, aliceKey, tt.mode)
			if tt.flavor == "client" {
				// A v2 client left to choose probes with server/discover
				// and must pick the modern era.
				connect(t, "auto", b, aliceKey, "auto")
			}
			call := func(t *testing.T, as, tool string, args map[string]any, extra map[string]any) tsAnswer {
				t.Helper()
				cmd := map[string]any{"op": "call", "as": as, "tool": tool, "args": args}
				for k, v := range extra {
					cmd[k] = v
				}
				a := ts.do(t, cmd)
				if a.Result == nil {
					t.Fatalf("%s %s: no result in %s", as, tool, a.raw)
				}
				return a
			}

			if tt.session {
				// A question a call's server asks reaches the calling
				// client, whose elicitation handler answers it.
				ts.do(t, map[string]any{"op": "connect", "as": "erin", "url": b.url + "/mcp", "key": erinKey, "mode": tt.mode,
					"elicit": map[string]any{"color": "green"}})
				a := call(t, "erin", "ask_color", map[string]any{}, nil)
				if a.Result.IsError || !strings.Contains(a.Result.text(), `"color":"green"`) {
					t.Errorf("erin's ask_color = %s, want the client's answer sent to the server", a.raw)
				}
				var asked struct {
					Asked []string `json:"asked"`
				}
				_ = json.Unmarshal([]byte(ts.do(t, map[string]any{"op": "asked"}).raw), &asked)
				if len(asked.Asked) != 1 || asked.Asked[0] != "Which color?" {
					t.Errorf("the client was asked %v", asked.Asked)
				}
			}
			if got := sortedNames(ts.do(t, map[string]any{"op": "list", "as": "alice"}).Tools); got != aliceTools {
				t.Errorf("alice's tools = %s, want %s", got, aliceTools)
			}
			if got := sortedNames(ts.do(t, map[string]any{"op": "list", "as": "bob"}).Tools); got != "mem_add" {
				t.Errorf("bob's tools = %s, want mem_add alone", got)
			}
			t.Run("tools/list one tool a page", func(t *testing.T) {
				// The client follows nextCursor to the end; every tool must
				// come once. mcp-go finds where a cursor (the last name
				// sent) resumes by binary search over the names, so the
				// list the tool filter returns must be in name order.
				paged := setup(t, mcpserver.Options{PageSize: 1})
				connect(t, "paged", paged, aliceKey, tt.mode)
				// Before its server closes, which waits for the 2025
				// era's open GET stream.
				t.Cleanup(func() { ts.send(t, map[string]any{"op": "close", "as": "paged"}) })
				if got := sortedNames(ts.do(t, map[string]any{"op": "list", "as": "paged"}).Tools); got != aliceTools {
					t.Errorf("alice's tools, one a page = %s, want %s", got, aliceTools)
				}
			})

			add := call(t, "alice", "mem_add", map[string]any{"a": 2, "b": 3}, nil).Result
			if add.IsError || add.StructuredContent["sum"] != 5.0 || !strings.Contains(add.text(), `"sum":5`) {
				t.Errorf("mem_add(2, 3) = %+v, want sum 5", add)
			}
			ex, err := b.execs.Get(t.Context(), add.meta(mcpserver.MetaExecution))
			if err != nil || ex.Principal != "alice" || ex.Status != harness.ExecSucceeded {
				t.Errorf("the add's execution %q = %+v, %v; want alice's, succeeded", add.meta(mcpserver.MetaExecution), ex, err)
			}

			// Held with progress while another key approves.
			approved := approveWhenWaiting(t, b)
			guarded := call(t, "alice", "mem_guarded", map[string]any{}, map[string]any{"progress": true})
			if guarded.Result.IsError || guarded.Result.text() != "done after approval" {
				t.Errorf("guarded = %s, want its result after approval", guarded.raw)
			}
			if <-approved == "" {
				t.Error("no approval was asked for")
			}
			if len(guarded.Progress) == 0 {
				t.Error("no progress notification reached the client while the call waited")
			}
			t.Logf("progress while held: %+v", guarded.Progress)

			// Held past Options.Hold: a tool error naming the approval;
			// the same call id again, after approval, gets the outcome.
			callID := "ts-" + tt.flavor
			meta := map[string]any{"meta": map[string]any{mcpserver.MetaCallID: callID}}
			held := call(t, "held", "mem_guarded", map[string]any{}, meta).Result
			ap := held.meta(mcpserver.MetaApproval)
			if !held.IsError || ap == "" || !strings.Contains(held.text(), ap) || !strings.Contains(held.text(), callID) || held.meta(mcpserver.MetaCallID) != callID {
				t.Fatalf("held = %+v, want a tool error naming the approval and the call id", held)
			}
			if _, err := short.execs.Approvals().Decide(t.Context(), ap, gates.ApprovalApproved, "approver", ""); err != nil {
				t.Fatal(err)
			}
			var retry *tsResult
			for deadline := time.Now().Add(10 * time.Second); ; {
				retry = call(t, "held", "mem_guarded", map[string]any{}, meta).Result
				if !retry.IsError || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if retry.IsError || retry.text() != "done after approval" {
				t.Errorf("retry = %+v, want the approved call's result", retry)
			}
			if got, want := retry.meta(mcpserver.MetaExecution), held.meta(mcpserver.MetaExecution); got != want {
				t.Errorf("the retry ran as execution %s, the held call as %s: want one execution", got, want)
			}

			leak := call(t, "alice", "mem_leak", map[string]any{}, nil)
			if strings.Contains(leak.raw, secretValue) || !strings.Contains(leak.Result.text(), "<redacted>") {
				t.Errorf("leak = %s, want the secret redacted", leak.raw)
			}
			wipe := call(t, "alice", "mem_wipe", map[string]any{}, nil).Result
			if !wipe.IsError || !strings.Contains(wipe.text(), "steering_denied") {
				t.Errorf("wipe = %+v, want a steering_denied tool error", wipe)
			}
			// A tool bob is not offered is not his to call: a JSON-RPC
			// error or a tool error, never its result.
			if a := ts.send(t, map[string]any{"op": "call", "as": "bob", "tool": "mem_leak", "args": map[string]any{}}); a.OK && (a.Result == nil || !a.Result.IsError) {
				t.Errorf("bob called mem_leak: %s", a.raw)
			}

			// The admin UI's list of live clients names this one, as it
			// said who it is (initialize, or 2026's per-request _meta).
			name, version, _ := strings.Cut(strings.TrimPrefix(hello.SDK, "@modelcontextprotocol/"), "@")
			var listed *mcpserver.Session
			for _, s := range b.face.Sessions() {
				if s.Principal == "alice" && s.Client == "patchbay-interop-"+tt.flavor {
					listed = &s
					break
				}
			}
			if listed == nil || listed.Version != version || listed.Era != tt.wantVersion || listed.Calls != 4 || listed.ID != hello.SessionID {
				t.Errorf("the live %s client of alice = %+v, want version %s, era %s, 4 calls (add, guarded, leak, wipe), id %q (all: %+v)", name, listed, version, tt.wantVersion, hello.SessionID, b.face.Sessions())
			}

			for _, as := range []string{"alice", "bob", "held"} {
				ts.do(t, map[string]any{"op": "close", "as": as})
			}
			if tt.session {
				// Closing ended the session (DELETE /mcp).
				for _, s := range b.face.Sessions() {
					if s.ID == hello.SessionID {
						t.Errorf("session %s is still listed after the client closed it", s.ID)
					}
				}
			}
		})
	}
}

// TestInteropInspectorCLI lists and calls mem_add with the MCP Inspector's
// CLI in each era it offers, sending alice's key as a header.
func TestInteropInspectorCLI(t *testing.T) {
	t.Parallel()
	dir := npmtest.Require(t, "inspector", inspector)
	node := npmtest.Node22(t)
	b := setup(t, mcpserver.Options{})
	// The tap keeps what the Inspector sent, to tell the era it spoke.
	tap := npmtest.NewTap(t, b.url)
	home := t.TempDir()
	run := func(t *testing.T, args ...string) map[string]any {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		args = append([]string{filepath.Join(dir, "clients", "launcher", "build", "index.js"), "--cli", tap.URL + "/mcp",
			"--transport", "http", "--header", "Authorization: Bearer " + aliceKey, "--format", "json", "--quiet"}, args...)
		cmd := exec.CommandContext(ctx, node, args...)
		// Its catalog and stored state go to a home of its own.
		cmd.Env = []string{"HOME=" + home, "PATH=" + filepath.Dir(node), "NO_COLOR=1"}
		var stderr logBuffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("inspector %v: %v\n%s\n%s", args[1:], err, out, &stderr)
		}
		var v struct {
			Result map[string]any `json:"result"`
		}
		if err := json.Unmarshal(out, &v); err != nil || v.Result == nil {
			t.Fatalf("inspector %v printed %q: %v", args[1:], out, err)
		}
		return v.Result
	}
	for _, era := range []string{"legacy", "modern"} {
		t.Run(era, func(t *testing.T) {
			from := tap.Count()
			list := run(t, "--protocol-era", era, "--method", "tools/list")
			var names []string
			tools, _ := list["tools"].([]any)
			for _, tool := range tools {
				m, _ := tool.(map[string]any)
				names = append(names, fmt.Sprint(m["name"]))
			}
			if got := sortedNames(names); got != aliceTools {
				t.Errorf("tools/list = %s, want %s", got, aliceTools)
			}
			res := run(t, "--protocol-era", era, "--method", "tools/call", "--tool-name", "mem_add", "--tool-arg", "a=2", "b=3")
			sc, _ := res["structuredContent"].(map[string]any)
			if res["isError"] == true || sc["sum"] != 5.0 {
				t.Errorf("tools/call mem_add a=2 b=3 = %v, want sum 5", res)
			}
			var initialize, modern bool
			var sent []string
			for _, e := range tap.Since(from) {
				var msg struct {
					Method string `json:"method"`
				}
				_ = json.Unmarshal([]byte(e.Body), &msg)
				sent = append(sent, strings.TrimSpace(e.Method+" "+msg.Method))
				initialize = initialize || strings.Contains(e.Body, `"method":"initialize"`)
				modern = modern || strings.Contains(e.Body, `"io.modelcontextprotocol/protocolVersion":"2026-07-28"`)
				if e.Status/100 != 2 {
					t.Errorf("the inspector's %s %s (%.200s) was answered %d", e.Method, e.Path, e.Body, e.Status)
				}
			}
			if want := era == "legacy"; initialize != want || modern == want {
				t.Errorf("%s: initialize sent %v, 2026-07-28 _meta sent %v", era, initialize, modern)
			}
			t.Logf("the inspector (%s) sent: %s", era, strings.Join(sent, ", "))
		})
	}
}

// expectedFailure is a conformance scenario that cannot pass against
// /mcp, and why.
type expectedFailure struct {
	why string
	// checks are the ids of the checks that fail; nil: the one check
	// named as the scenario.
	checks []string
}

// Reasons shared by several scenarios.
const (
	noPrompts   = "/mcp serves tools only: no prompts capability (prompts/* answers -32601)"
	noResources = "/mcp serves tools only: no resources capability (resources/* answers -32601)"
	noTasks     = "calls the tasks suite's fixture tools (greet, slow_compute, failing_job, confirm_delete, …), which are not patchbay's; /mcp's tasks are tested with the clients' own task APIs (TestInteropTypeScriptTasks) and on the wire (TestTasksWire2026)"
)

// fixture is the reason of a scenario that calls the suite's own fixture
// tools: patchbay offers the operations of its connections, as
// <connection>_<op>, and no other tool.
func fixture(tools ...string) string {
	return "calls the suite's fixture tool " + strings.Join(tools, ", ") + "; /mcp offers only <connection>_<op> tools"
}

// serverBaseline is, per protocol revision, each server scenario that is
// expected to fail against /mcp, with why. Every other scenario the
// revision requires (or runs not scored) must pass; a baselined scenario
// that passes, or fails other checks than these, fails the test, so that
// the baseline stays true.
var serverBaseline = map[string]map[string]expectedFailure{
	"2025-11-25": {
		"logging-set-level":             {why: "no logging capability: patchbay logs to its own log, not to MCP clients"},
		"completion-complete":           {why: "no completions capability: /mcp serves tools only"},
		"tools-call-simple-text":        {why: fixture("test_simple_text")},
		"tools-call-image":              {why: fixture("test_image_content")},
		"tools-call-audio":              {why: fixture("test_audio_content")},
		"tools-call-embedded-resource":  {why: fixture("test_embedded_resource")},
		"tools-call-mixed-content":      {why: fixture("test_multiple_content_types")},
		"tools-call-with-logging":       {why: "no logging capability (logging/setLevel answers -32601), and " + fixture("test_tool_with_logging")},
		"tools-call-error":              {why: fixture("test_error_handling")},
		"tools-call-with-progress":      {why: fixture("test_tool_with_progress") + " (progress while a call is held: TestInteropTypeScriptClients)"},
		"tools-call-sampling":           {why: fixture("test_sampling")},
		"tools-call-elicitation":        {why: fixture("test_elicitation")},
		"elicitation-sep1034-defaults":  {why: fixture("test_elicitation_sep1034_defaults"), checks: []string{"elicitation-sep1034-general"}},
		"elicitation-sep1330-enums":     {why: fixture("test_elicitation_sep1330_enums"), checks: []string{"elicitation-sep1330-general"}},
		"resources-list":                {why: noResources},
		"resources-read-text":           {why: noResources},
		"resources-read-binary":         {why: noResources},
		"resources-templates-read":      {why: noResources},
		"resources-subscribe":           {why: noResources},
		"resources-unsubscribe":         {why: noResources},
		"prompts-list":                  {why: noPrompts},
		"prompts-get-simple":            {why: noPrompts},
		"prompts-get-with-args":         {why: noPrompts},
		"prompts-get-embedded-resource": {why: noPrompts},
		"prompts-get-with-image":        {why: noPrompts},
		"dns-rebinding-protection":      dnsRebinding,
		"json-schema-2020-12":           {why: fixture("json_schema_2020_12_tool"), checks: []string{"json-schema-2020-12-tool-found"}},
	},
	"2026-07-28": {
		"server-stateless": {why: "23 checks pass; these 4 need the suite's diagnostic tools test_missing_capability, test_streaming_elicitation and test_logging_tool, which /mcp does not offer",
			checks: []string{"sep-2575-server-rejects-undeclared-capability", "sep-2575-missing-capability-http-400", "sep-2575-http-server-no-independent-requests-on-stream", "sep-2575-server-no-log-without-loglevel"}},
		"completion-complete":           {why: "no completions capability: /mcp serves tools only"},
		"tools-call-simple-text":        {why: fixture("test_simple_text")},
		"tools-call-image":              {why: fixture("test_image_content")},
		"tools-call-audio":              {why: fixture("test_audio_content")},
		"tools-call-embedded-resource":  {why: fixture("test_embedded_resource")},
		"tools-call-mixed-content":      {why: fixture("test_multiple_content_types")},
		"tools-call-error":              {why: fixture("test_error_handling")},
		"tools-call-with-progress":      {why: fixture("test_tool_with_progress") + " (progress while a call is held: TestInteropTypeScriptClients)"},
		"resources-list":                {why: noResources},
		"resources-read-text":           {why: noResources},
		"resources-read-binary":         {why: noResources},
		"resources-templates-read":      {why: noResources},
		"prompts-list":                  {why: noPrompts},
		"prompts-get-simple":            {why: noPrompts},
		"prompts-get-with-args":         {why: noPrompts},
		"prompts-get-embedded-resource": {why: noPrompts},
		"prompts-get-with-image":        {why: noPrompts},
		"dns-rebinding-protection":      dnsRebinding,
		"caching": {why: "tools/list's caching hints pass; the prompts and resources lists whose hints it checks are not served (tools only)",
			checks: []string{"sep-2549-prompts-list-caching-hints", "sep-2549-resources-list-caching-hints", "sep-2549-resources-templates-list-caching-hints"}},
		"input-required-result-basic-elicitation":       {why: fixture("test_input_required_result_elicitation"), checks: []string{"sep-2322-elicitation-incomplete"}},
		"input-required-result-basic-sampling":          {why: fixture("test_input_required_result_sampling"), checks: []string{"sep-2322-sampling-incomplete"}},
		"input-required-result-basic-list-roots":        {why: fixture("test_input_required_result_list_roots"), checks: []string{"sep-2322-list-roots-incomplete"}},
		"input-required-result-request-state":           {why: fixture("test_input_required_result_request_state"), checks: []string{"sep-2322-request-state-incomplete"}},
		"input-required-result-multiple-input-requests": {why: fixture("test_input_required_result_multiple_inputs"), checks: []string{"sep-2322-multiple-inputs-incomplete"}},
		"input-required-result-multi-round":             {why: fixture("test_input_required_result_multi_round"), checks: []string{"sep-2322-multi-round-r1"}},
		"input-required-result-non-tool-request":        {why: noPrompts + "; it needs a prompt that asks for input", checks: []string{"sep-2322-non-tool-incomplete"}},
		"input-required-result-result-type":             {why: fixture("test_input_required_result_elicitation"), checks: []string{"sep-2322-result-type-included"}},
		"input-required-result-tampered-state":          {why: "needs the requestState of a fixture tool's input_required result first; " + fixture("test_input_required_result_*"), checks: []string{"sep-2322-reject-tampered-state"}},
		"input-required-result-capability-check":        {why: fixture("test_input_required_result_capabilities"), checks: []string{"sep-2322-respect-client-capabilities"}},
		// Not scored at 2026-07-28: the tasks extension, and scenarios
		// pending against the suite's own reference server. /mcp serves
		// the extension (tasks.go); what fails is what needs the suite's
		// fixture tools.
		"tasks-lifecycle": {why: noTasks, checks: []string{"tasks-sync-tool-call", "sep-2663-result-type-task-on-create", "sep-2663-tasks-get-status-working", "sep-2663-tasks-get-status-completed",
			"sep-2663-tool-error-uses-completed-status", "sep-2663-tasks-get-status-failed", "sep-2663-cancel-ack-empty-result", "tasks-cancel-terminal-idempotent-ack"}},
		"tasks-capability-negotiation": {why: noTasks + " (the extension advertised, and tasks/* refused -32021 to a client not declaring it, pass)",
			checks: []string{"sep-2663-server-rejects-undeclared-client", "tasks-per-request-meta-opt-in"}},
		"tasks-wire-fields":           {why: noTasks, checks: []string{"tasks-wire-field-renames", "tasks-no-early-ttl-expiry", "tasks-no-related-task-meta-on-inlined-result"}},
		"tasks-request-state-removal": {why: noTasks, checks: []string{"tasks-request-state-removal-setup"}},
		"tasks-mrtr-input":            {why: noTasks, checks: []string{"sep-2663-tasks-get-status-input-required", "tasks-mrtr-tasks-update-resumes", "tasks-mrtr-partial-fulfillment"}},
		"tasks-request-headers": {why: noTasks, checks: []string{"tasks-headers-tolerate-mcp-method-on-tools-call", "sep-2663-routing-headers-accepted-on-tasks-get",
			"sep-2663-server-rejects-mismatched-mcp-name-on-tasks-get"}},
		"tasks-dispatch-and-envelope": {why: noTasks + " (tasks/result and tasks/list -32601, and tasks/get of an unknown task -32602, pass)",
			checks: []string{"tasks-server-directed-creation-no-hint", "sep-2663-legacy-task-param-ignored", "tasks-immediate-result-shortcut",
				"tasks-result-type-complete-on-non-task-responses", "sep-2663-durable-create-strong-consistency"}},
		"tasks-required-task-error": {why: noTasks, checks: []string{"sep-2663-server-returns-missing-capability-when-required"}},
		"tasks-mrtr-composition":    {why: noTasks, checks: []string{"sep-2663-mrtr-synchronous-before-task-creation"}},
		"json-schema-2020-12":       {why: fixture("json_schema_2020_12_tool"), checks: []string{"json-schema-2020-12-tool-found"}},
		"http-custom-header-server-validation": {why: "needs a tool whose input schema carries x-mcp-header annotations (SEP-2243); no connection operation here declares one",
			checks: []string{"sep-2243-server-no-xmcp-tool", "sep-2243-server-decode-base64", "sep-2243-server-validate-param-match", "sep-2243-server-reject-invalid-param-chars", "sep-2243-server-reject-param-mismatch"}},
	},
}

// dnsRebinding: /mcp turns mcp-go's Host/Origin check off on purpose
// (see New in server.go): it is served behind a bearer credential on the
// configured address, and a page that rebinds a name cannot send the
// key. The suite's request with a foreign Host and Origin reaches /mcp
// through the test's proxy, which adds alice's key, and is served.
var dnsRebinding = expectedFailure{
	why:    "/mcp does not check Host/Origin (server.go: WithDisableLocalhostProtection; the bearer key is the protection); a foreign Host/Origin with a valid key is served (200), where the suite wants 4xx",
	checks: []string{"localhost-host-rebinding-rejected"},
}

// conformanceRequirements is the part of requirements/<revision>.yaml
// that lists server scenarios.
type conformanceRequirements struct {
	Server    []string `yaml:"server"`
	NotScored []struct {
		Scenario string `yaml:"scenario"`
		Leg      string `yaml:"leg"`
		Reason   string `yaml:"reason"`
	} `yaml:"not_scored"`
}

type conformanceCheck struct {
	ID           string `json:"id"`
	Status       string `json:"status"`
	ErrorMessage string `json:"errorMessage"`
}

var resultDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$`)

// TestServerConformance runs the official conformance suite's server
// scenarios against /mcp for each revision it has requirements for: the
// required ones and those it runs not scored. The suite cannot send a
// credential, so a loopback proxy adds alice's key. Most scenarios call
// the suite's own fixture tools or features /mcp does not serve; those
// are baselined with why (serverBaseline), and every other one must pass.
func TestServerConformance(t *testing.T) {
	t.Parallel()
	suite := npmtest.Require(t, "conformance", serverConformance)
	node := npmtest.Node22(t)
	for _, rev := range []string{"2026-07-28", "2025-11-25"} {
		t.Run(rev, func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(filepath.Join(suite, "requirements", rev+".yaml"))
			must(t, err)
			var req conformanceRequirements
			must(t, yaml.Unmarshal(data, &req))
			scenarios := map[string]bool{} // name → scored
			for _, s := range req.Server {
				scenarios[s] = true
			}
			for _, s := range req.NotScored {
				if s.Leg == "server" {
					scenarios[s.Scenario] = false
				}
			}
			baseline := serverBaseline[rev]
			for name := range baseline {
				if _, ok := scenarios[name]; !ok {
					t.Errorf("serverBaseline[%s] names %s, which the suite does not run at %s", rev, name, rev)
				}
			}

			// The suite opens a session per scenario and closes none: the
			// per-caller cap would refuse it after 16.
			b := setup(t, mcpserver.Options{SessionsPerPrincipal: 1000})
			target, err := url.Parse(b.url)
			must(t, err)
			proxy := httputil.NewSingleHostReverseProxy(target)
			// The Host and Origin the suite sends go through as they are.
			withKey := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Header.Set("Authorization", "Bearer "+aliceKey)
				proxy.ServeHTTP(w, r)
			}))
			t.Cleanup(withKey.Close)

			out := t.TempDir()
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, filepath.Join(suite, "dist", "index.js"), "server",
				"--url", withKey.URL+"/mcp", "--requirements", rev, "-o", out)
			cmd.Env = []string{"PATH=" + filepath.Dir(node), "HOME=" + t.TempDir(), "NO_COLOR=1"}
			log, _ := cmd.CombinedOutput() // it exits non-zero when any scenario fails
			results := readConformanceResults(t, out)

			var passed, scored, scoredPassed int
			var baselined []string
			for _, name := range slices.Sorted(maps.Keys(scenarios)) {
				checks, ran := results[name]
				if !ran {
					t.Errorf("%s: the suite left no result:\n%s", name, log)
					continue
				}
				var failed []string
				tally := map[string]int{}
				for _, c := range checks {
					tally[strings.ToLower(c.Status)]++
					if c.Status == "FAILURE" {
						failed = append(failed, c.ID)
					}
				}
				if scenarios[name] {
					scored++
				}
				exp, isBaselined := baseline[name]
				switch {
				case len(failed) == 0 && isBaselined:
					t.Errorf("%s now passes at %s: take it out of serverBaseline (it was baselined: %s)", name, rev, exp.why)
				case len(failed) == 0:
					passed++
					if scenarios[name] {
						scoredPassed++
					}
					t.Logf("conformance server %s %-46s pass (%s)", rev, name, countChecks(tally))
				case !isBaselined:
					t.Errorf("%s fails at %s:\n%s", name, rev, describeChecks(checks))
				default:
					want := exp.checks
					if want == nil {
						want = []string{name}
					}
					if !slices.Equal(slices.Sorted(slices.Values(failed)), slices.Sorted(slices.Values(want))) {
						t.Errorf("%s (baselined) fails %v at %s, the baseline says %v:\n%s", name, failed, rev, want, describeChecks(checks))
					}
					baselined = append(baselined, name)
					t.Logf("conformance server %s %-46s baselined: %s", rev, name, exp.why)
				}
			}
			t.Logf("conformance server %s SUMMARY: %d/%d scenarios pass (%d/%d required), %d baselined", rev, passed, len(scenarios), scoredPassed, scored, len(baselined))
		})
	}
}

// readConformanceResults reads the checks of each scenario the suite
// saved under dir (server-<scenario>-<time>/checks.json).
func readConformanceResults(t *testing.T, dir string) map[string][]conformanceCheck {
	t.Helper()
	entries, err := os.ReadDir(dir)
	must(t, err)
	results := map[string][]conformanceCheck{}
	for _, e := range entries {
		m := resultDir.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name(), "checks.json"))
		must(t, err)
		var checks []conformanceCheck
		if err := json.Unmarshal(data, &checks); err != nil {
			t.Fatalf("%s: %v", e.Name(), err)
		}
		results[m[1]] = checks
	}
	return results
}

func describeChecks(checks []conformanceCheck) string {
	var b strings.Builder
	for _, c := range checks {
		if c.Status == "SUCCESS" {
			continue
		}
		fmt.Fprintf(&b, "  %s %s: %s\n", c.Status, c.ID, c.ErrorMessage)
	}
	return b.String()
}

// countChecks says how a scenario's checks came out: a pass with no
// success (only info or skipped checks) exercised nothing.
func countChecks(tally map[string]int) string {
	var parts []string
	for _, status := range slices.Sorted(maps.Keys(tally)) {
		parts = append(parts, fmt.Sprintf("%d %s", tally[status], status))
	}
	return strings.Join(parts, ", ")
}

// logBuffer collects a child's output for failure messages.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() < 64<<10 {
		b.b.Write(p)
	}
	return len(p), nil
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
