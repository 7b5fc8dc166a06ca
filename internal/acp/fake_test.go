package acp

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// The test binary doubles as a fake agent (TestMain runs fakeAgent when
// ACP_FAKE_AGENT names a mode):
//   - basic: a small well-behaved agent (see fakeBasic);
//   - stubborn: ignores SIGTERM and stdin EOF, and starts a sleeper in a
//     session of its own (pids written to ACP_PID_FILE);
//   - sleeper: ignores SIGTERM and sleeps.
func fakeAgent(mode string) int {
	switch mode {
	case "basic":
		fakeBasic(os.Stdin, os.Stdout)
		return 0
	case "stubborn":
		return fakeStubborn()
	case "sleeper":
		signal.Ignore(syscall.SIGTERM)
		time.Sleep(time.Hour)
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown fake agent mode", mode)
	return 2
}

func fakeStubborn() int {
	signal.Ignore(syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	sleeper := exec.Command(os.Args[0])
	sleeper.Env = append(os.Environ(), "ACP_FAKE_AGENT=sleeper")
	sleeper.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sleeper.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pids := fmt.Sprintf("%d %d\n", os.Getpid(), sleeper.Process.Pid)
	if err := os.WriteFile(os.Getenv("ACP_PID_FILE"), []byte(pids), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // EOF changes nothing
	time.Sleep(time.Hour)
	return 0
}

// fakeBasic answers initialize (loadSession and http MCP declared),
// session/new (ids s1, s2, …), session/load (replays two updates first)
// and session/prompt: the prompt "wait" waits for session/cancel and
// answers cancelled; any other sends one update of every kind tested
// (and one of a kind ACP does not have yet) and answers end_turn.
func fakeBasic(r io.Reader, w io.Writer) {
	a := &fakeWriter{w: w}
	var (
		mu      sync.Mutex
		waiting = map[string]chan struct{}{}
		next    int
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m message
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		var p struct {
			SessionID string         `json:"sessionId"`
			Prompt    []ContentBlock `json:"prompt"`
		}
		_ = json.Unmarshal(m.Params, &p)
		switch m.Method {
		case "initialize":
			a.result(m.ID, `{"protocolVersion":1,"agentCapabilities":{"loadSession":true,"mcpCapabilities":{"http":true}},"authMethods":[],"agentInfo":{"name":"fake","version":"1"}}`)
		case "session/new":
			mu.Lock()
			next++
			id := "s" + strconv.Itoa(next)
			mu.Unlock()
			a.result(m.ID, `{"sessionId":"`+id+`"}`)
		case "session/load":
			a.update(p.SessionID, `{"sessionUpdate":"user_message_chunk","content":{"type":"text","text":"earlier"}}`)
			a.update(p.SessionID, `{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"answer"}}`)
			a.result(m.ID, `{}`)
		case "session/cancel":
			mu.Lock()
			if ch := waiting[p.SessionID]; ch != nil {
				close(ch)
				delete(waiting, p.SessionID)
			}
			mu.Unlock()
		case "session/prompt":
			if len(p.Prompt) == 1 && p.Prompt[0].Text == "wait" {
				ch := make(chan struct{})
				mu.Lock()
				waiting[p.SessionID] = ch
				mu.Unlock()
				go func(id json.RawMessage) {
					<-ch
					a.result(id, `{"stopReason":"cancelled"}`)
				}(m.ID)
				continue
			}
			for _, u := range fakeUpdates {
				a.update(p.SessionID, u)
			}
			a.result(m.ID, `{"stopReason":"end_turn"}`)
		default:
			if m.ID != nil {
				a.line(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"error":{"code":-32601,"message":"Method not found"}}`)
			}
		}
	}
}

// fakeUpdates are the updates fakeBasic sends in a turn, in order.
var fakeUpdates = []string{
	`{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"thinking"}}`,
	`{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"hello"}}`,
	`{"sessionUpdate":"tool_call","toolCallId":"t1","title":"Read","kind":"read","status":"pending","locations":[{"path":"/w/a.go","line":3}],"rawInput":{"path":"/w/a.go"}}`,
	`{"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"completed","rawOutput":{"ok":true}}`,
	`{"sessionUpdate":"plan","entries":[{"content":"step one","priority":"high","status":"in_progress"}]}`,
	`{"sessionUpdate":"available_commands_update","availableCommands":[{"name":"review","description":"Review"}]}`,
	`{"sessionUpdate":"current_mode_update","currentModeId":"code"}`,
	`{"sessionUpdate":"future_update","novel":{"x":[1,2,3]}}`,
	`{"sessionUpdate":"agent_message_chunk","content":{"type":"image","data":"AAAA","mimeType":"image/png"}}`,
	`{"sessionUpdate":"tool_call","toolCallId":42}`,
}

type fakeWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (a *fakeWriter) line(s string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, _ = io.WriteString(a.w, s+"\n")
}

func (a *fakeWriter) result(id json.RawMessage, result string) {
	a.line(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":` + result + `}`)
}

func (a *fakeWriter) update(sessionID, update string) {
	a.line(`{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"` + sessionID + `","update":` + update + `}}`)
}
