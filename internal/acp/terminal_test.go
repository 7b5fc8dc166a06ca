package acp

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestOutputTruncatesAtCharacters(t *testing.T) {
	t.Parallel()
	o := &output{limit: 5}
	fmt.Fprint(o, "ab")
	if text, truncated := o.text(); text != "ab" || truncated {
		t.Errorf("text %q truncated %v", text, truncated)
	}
	fmt.Fprint(o, "cdé€") // é is 2 bytes, € 3: keeping 5 bytes would split é
	if text, truncated := o.text(); text != "€" && text != "é€" || !truncated {
		t.Errorf("text %q truncated %v", text, truncated)
	}
	if text, _ := o.text(); len(text) > 5 || !strings.HasSuffix(text, "€") {
		t.Errorf("text %q", text)
	}
}

// TestTerminal runs commands for an agent: create, output, wait, kill,
// release, with cwd confined to the root.
func TestTerminal(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	var tr transcript
	conn, p := pipeConn(t, &recorder{}, Options{
		Terminal: &TerminalOptions{Root: root, Env: []string{"PATH=/usr/bin:/bin", "BASE=base"}, MaxOutputBytes: 64},
		Wire:     tr.wire,
	})
	p.handshake(t.Context(), conn, `{}`)
	if !tr.contains(`"terminal":true`) {
		t.Errorf("terminal not declared:\n%s", tr.String())
	}
	call := func(method, params string) message {
		t.Helper()
		p.send(`{"jsonrpc":"2.0","id":7,"method":"` + method + `","params":{"sessionId":"s1",` + params + `}}`)
		return p.recv()
	}
	result := func(m message, v any) {
		t.Helper()
		if m.Error != nil {
			t.Fatalf("error %v", m.Error)
		}
		if err := json.Unmarshal(m.Result, v); err != nil {
			t.Fatal(err)
		}
	}
	var created struct{ TerminalID string }
	var out struct {
		Output     string
		Truncated  bool
		ExitStatus *exitStatus
	}
	var status exitStatus

	cwd, _ := json.Marshal(filepath.Join(root, "sub"))
	result(call("terminal/create", `"command":"sh","args":["-c","pwd; echo $BASE $EXTRA; exit 3"],"env":[{"name":"EXTRA","value":"x"}],"cwd":`+string(cwd)), &created)
	result(call("terminal/wait_for_exit", `"terminalId":"`+created.TerminalID+`"`), &status)
	if status.ExitCode == nil || *status.ExitCode != 3 || status.Signal != nil {
		t.Errorf("exit status %+v", status)
	}
	result(call("terminal/output", `"terminalId":"`+created.TerminalID+`"`), &out)
	resolved, _ := filepath.EvalSymlinks(filepath.Join(root, "sub"))
	if out.Output != resolved+"\nbase x\n" || out.Truncated || out.ExitStatus == nil {
		t.Errorf("output %+v", out)
	}
	result(call("terminal/release", `"terminalId":"`+created.TerminalID+`"`), &struct{}{})
	if m := call("terminal/output", `"terminalId":"`+created.TerminalID+`"`); m.Error == nil || m.Error.Code != CodeNotFound {
		t.Errorf("output after release: %+v", m)
	}

	// Output bounded, a kill reported as a signal.
	result(call("terminal/create", `"command":"sh","args":["-c","yes 0123456789"],"outputByteLimit":1000`), &created)
	time.Sleep(100 * time.Millisecond)
	result(call("terminal/kill", `"terminalId":"`+created.TerminalID+`"`), &struct{}{})
	result(call("terminal/wait_for_exit", `"terminalId":"`+created.TerminalID+`"`), &status)
	if status.Signal == nil || *status.Signal != "SIGKILL" {
		t.Errorf("exit status after kill %+v", status)
	}
	result(call("terminal/output", `"terminalId":"`+created.TerminalID+`"`), &out)
	if len(out.Output) > 64 || !out.Truncated {
		t.Errorf("output of %d bytes, truncated %v", len(out.Output), out.Truncated)
	}

	for _, tt := range []struct{ params, want string }{
		{`"command":"sh","cwd":"/"`, "outside the directory"},
		{`"command":"sh","cwd":"sub"`, "not absolute"},
		{`"command":"no-such-command-here"`, "not found in PATH"},
		{`"command":"sh","sessionId":"other"`, "unknown session"},
	} {
		m := call("terminal/create", tt.params)
		if m.Error == nil || !strings.Contains(m.Error.Message, tt.want) {
			t.Errorf("create %s: %+v, want an error with %q", tt.params, m, tt.want)
		}
	}

	// Close kills a command still running.
	result(call("terminal/create", `"command":"sleep","args":["300"]`), &created)
	term, err := conn.terms.get("s1", created.TerminalID)
	if err != nil {
		t.Fatal(err)
	}
	pid := term.cmd.Process.Pid
	if err := conn.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	waitGone(t, "a terminal's command", pid)
}
