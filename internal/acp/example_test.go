package acp

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// The TypeScript SDK's example agent: a real ACP agent nobody here wrote.
// Its turn (dist/examples/agent.js) is, a second apart: a message chunk;
// tool_call call_1 (read); tool_call_update call_1 completed; a message
// chunk; tool_call call_2 (edit); session/request_permission for call_2
// with options allow (allow_once) and reject (reject_once). Allowed, it
// sends tool_call_update call_2 completed and a chunk " Perfect! …";
// rejected, a chunk " I understand you prefer not to make that change. …";
// cancelled, nothing more. It answers end_turn, or cancelled when
// session/cancel arrived while it was waiting between two steps.
const exampleSDK = "@agentclientprotocol/sdk@1.9.0"

// exampleAgent returns the command that runs the example agent.
func exampleAgent(t *testing.T) Command {
	t.Helper()
	dir := npmtest.Require(t, "acp-sdk", exampleSDK)
	node := npmtest.Node(t)
	return Command{
		Path:   node,
		Args:   []string{filepath.Join(dir, "dist", "examples", "agent.js")},
		Env:    []string{"PATH=" + os.Getenv("PATH")},
		Dir:    dir,
		Stderr: testWriter{t},
	}
}

// transcript records the lines of a connection, in the order seen.
type transcript struct {
	mu    sync.Mutex
	lines []string
}

func (tr *transcript) wire(out bool, line []byte) {
	dir := "<- "
	if out {
		dir = "-> "
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.lines = append(tr.lines, dir+string(line))
}

func (tr *transcript) String() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.lines, "\n") + "\n"
}

func (tr *transcript) contains(s string) bool { return strings.Contains(tr.String(), s) }

var hexSession = regexp.MustCompile(`"sessionId":"[0-9a-f]{32}"`)

// TestExampleAgentGolden fixes the wire format: every line of initialize,
// session/new and a turn whose permission request is allowed.
func TestExampleAgentGolden(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	var tr transcript
	rec := &recorder{perm: func(_ context.Context, r PermissionRequest) (PermissionOutcome, error) {
		return r.Pick(AllowOnce, AllowAlways), nil
	}}
	conn, err := Start(t.Context(), exampleAgent(t), rec, Options{
		ClientInfo: &Implementation{Name: "patchbay", Version: "test"},
		FS:         &FSOptions{Root: root, Write: true},
		Wire:       tr.wire,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := conn.Initialize(ctx); err != nil {
		t.Fatal(err)
	}
	id, err := conn.NewSession(ctx, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := conn.Prompt(ctx, id, "Update the <database> config & say so")
	if err != nil || stop != StopEndTurn {
		t.Fatalf("Prompt = %q, %v; want end_turn", stop, err)
	}
	got := hexSession.ReplaceAllString(tr.String(), `"sessionId":"SESSION"`)
	got = strings.ReplaceAll(got, root, "ROOT")
	golden := filepath.Join("testdata", "example_turn.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal([]byte(got), want) {
		t.Errorf("wire differs from %s (run with -update after checking):\n got:\n%s\nwant:\n%s", golden, got, want)
	}
}

// TestExampleAgentPermission answers the example's permission request
// each way and checks what the agent reports back.
func TestExampleAgentPermission(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		kinds     []PermissionOptionKind // nil: cancelled
		wantText  string
		wantCall2 bool // tool_call_update call_2 completed
	}{
		{"allowed", []PermissionOptionKind{AllowOnce}, " Perfect! I've successfully updated the configuration.", true},
		{"denied", []PermissionOptionKind{RejectOnce}, " I understand you prefer not to make that change.", false},
		{"cancelled", nil, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := &recorder{perm: func(_ context.Context, r PermissionRequest) (PermissionOutcome, error) {
				return r.Pick(tt.kinds...), nil
			}}
			conn, id := startExample(t, rec, Options{})
			stop, err := conn.Prompt(t.Context(), id, "go")
			if err != nil || stop != StopEndTurn {
				t.Fatalf("Prompt = %q, %v; want end_turn", stop, err)
			}
			checkPermissionAsked(t, rec)
			text := rec.texts()
			if !strings.HasPrefix(text, "I'll help you with that.") {
				t.Errorf("text %q lacks the turn's first chunk", text)
			}
			if tt.wantText != "" && !strings.Contains(text, tt.wantText) {
				t.Errorf("text %q lacks %q", text, tt.wantText)
			}
			for _, other := range tests {
				if other.wantText != "" && other.wantText != tt.wantText && strings.Contains(text, other.wantText) {
					t.Errorf("text %q has the %s answer", text, other.name)
				}
			}
			kinds := map[UpdateKind]int{}
			call2 := false
			for _, n := range rec.seen() {
				kinds[n.Kind]++
				if n.Kind == UpdateToolCallUpdate && n.ToolCall != nil && n.ToolCall.ToolCallID == "call_2" && n.ToolCall.Status == "completed" {
					call2 = true
				}
			}
			if call2 != tt.wantCall2 {
				t.Errorf("tool_call_update call_2 completed: %v, want %v", call2, tt.wantCall2)
			}
			if kinds[UpdateToolCall] != 2 || kinds[UpdateToolCallUpdate] < 1 || kinds[UpdateAgentMessageChunk] < 2 {
				t.Errorf("update kinds %v", kinds)
			}
			if err := conn.LoadSession(t.Context(), id, "/work", nil); !errors.Is(err, ErrLoadUnsupported) {
				t.Errorf("LoadSession = %v, want ErrLoadUnsupported (the example does not declare loadSession)", err)
			}
		})
	}
}

// checkPermissionAsked checks the example's permission request decoded.
func checkPermissionAsked(t *testing.T, rec *recorder) {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.asked) != 1 {
		t.Fatalf("%d permission requests, want 1", len(rec.asked))
	}
	r := rec.asked[0]
	if r.ToolCall.ToolCallID != "call_2" || r.ToolCall.Kind != "edit" || len(r.Options) != 2 ||
		r.Options[0] != (PermissionOption{OptionID: "allow", Name: "Allow this change", Kind: AllowOnce}) ||
		!bytes.Contains(r.ToolCall.RawInput, []byte(`"path":"/home/user/project/config.json"`)) {
		t.Errorf("permission request %+v", r)
	}
	// The tool_call the request is about was delivered before it.
	var last SessionNotification
	for _, n := range rec.updates {
		if n.Kind == UpdateToolCall {
			last = n
		}
	}
	if last.ToolCall == nil || last.ToolCall.ToolCallID != "call_2" {
		t.Errorf("last tool_call %+v, want call_2", last)
	}
}

// startExample starts the example agent and opens a session.
func startExample(t *testing.T, c Client, opts Options) (*Conn, string) {
	t.Helper()
	conn, err := Start(t.Context(), exampleAgent(t), c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := conn.Initialize(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.ProtocolVersion != 1 || res.AgentCapabilities.LoadSession {
		t.Errorf("initialize result %+v", res)
	}
	id, err := conn.NewSession(ctx, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn, id
}

// TestExampleAgentCancel cancels Prompt's ctx mid-turn: session/cancel
// goes out, the agent answers cancelled, and Close leaves no process.
func TestExampleAgentCancel(t *testing.T) {
	t.Parallel()
	var tr transcript
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rec := &recorder{onUpdate: func(n SessionNotification) {
		if n.Kind == UpdateAgentMessageChunk {
			cancel() // mid-turn: the agent now waits a second before its next step
		}
	}}
	conn, id := startExample(t, rec, Options{Wire: tr.wire})
	pid := conn.proc.pid()
	start := time.Now()
	stop, err := conn.Prompt(ctx, id, "go")
	if err != nil || stop != StopCancelled {
		t.Fatalf("Prompt = %q, %v; want cancelled", stop, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the cancelled turn took %s", d)
	}
	if !tr.contains(`-> {"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"` + id + `"}}`) {
		t.Errorf("no session/cancel sent:\n%s", tr.String())
	}
	rec.mu.Lock()
	asked := len(rec.asked)
	rec.mu.Unlock()
	if asked != 0 {
		t.Errorf("permission asked %d times after cancel", asked)
	}
	if !alive(pid) {
		t.Fatalf("the agent (pid %d) exited before Close", pid)
	}
	if err := conn.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	waitGone(t, "the example agent", pid)
	if !errors.Is(conn.Err(), ErrClosed) {
		t.Errorf("Err = %v, want ErrClosed", conn.Err())
	}
}

// TestExampleAgentCancelDuringPermission cancels while the agent waits
// for a permission answer: patchbay answers it cancelled itself, as ACP
// requires, and the handler's ctx is cancelled.
func TestExampleAgentCancelDuringPermission(t *testing.T) {
	t.Parallel()
	var tr transcript
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	handlerDone := make(chan error, 1)
	rec := &recorder{perm: func(hctx context.Context, _ PermissionRequest) (PermissionOutcome, error) {
		cancel() // the user walks away while asked
		<-hctx.Done()
		handlerDone <- hctx.Err()
		return PermissionOutcome{OptionID: "allow"}, nil // too late: dropped
	}}
	conn, id := startExample(t, rec, Options{Wire: tr.wire})
	stop, err := conn.Prompt(ctx, id, "go")
	if err != nil {
		t.Fatalf("Prompt: %v", err)
	}
	// The example returns from its turn without throwing when the outcome
	// is cancelled, so it answers end_turn rather than cancelled.
	if stop != StopEndTurn && stop != StopCancelled {
		t.Errorf("stop = %q", stop)
	}
	select {
	case err := <-handlerDone:
		if err == nil {
			t.Error("handler ctx not cancelled")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the permission handler's ctx was not cancelled")
	}
	out := tr.String()
	if !strings.Contains(out, `"result":{"outcome":{"outcome":"cancelled"}}`) || strings.Contains(out, `"outcome":"selected"`) {
		t.Errorf("permission not answered cancelled (only):\n%s", out)
	}
}
