package mcp_test

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"strings"
	"time"
)

// fakeStdio is a stdio MCP server of the 2025 era that misbehaves on
// purpose, run by the test binary itself (PATCHBAY_FAKE_MCP=mode). Modes
// change tools/list: "dup" lists a tool twice, "badschema" lists one whose
// inputSchema is not JSON Schema. Tools misbehave by name: crash exits
// mid-call, hang never answers, garbage writes a line that is not JSON,
// huge answers with a 4 KiB text, sample asks the client for sampling
// first, ping pings the client first; echo works. Mode "events" declares
// events and offers "tick" by push: events/stream sends active, one event
// and a heartbeat and stays open; the tool "cancelled" answers with the
// request ids of the notifications/cancelled received.
func fakeStdio(mode string, in io.Reader, out io.Writer) int {
	if mode == "asking" {
		return askingStdio(in, out) // a 2026-07-28 server; stdio_calls_test.go
	}
	w := bufio.NewWriter(out)
	send := func(v any) {
		b, _ := json.Marshal(v)
		w.Write(b)
		w.WriteByte('\n')
		w.Flush()
	}
	lines := bufio.NewScanner(in)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	var pendingCall json.RawMessage // id of a call waiting on our request
	var cancelled []string          // requestIds of notifications/cancelled
	for lines.Scan() {
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Name      string          `json:"name"`
				RequestID json.RawMessage `json:"requestId"`
			} `json:"params"`
			Result json.RawMessage `json:"result"`
			Error  json.RawMessage `json:"error"`
		}
		if json.Unmarshal(lines.Bytes(), &msg) != nil {
			continue
		}
		reply := func(result any) { send(map[string]any{"jsonrpc": "2.0", "id": msg.ID, "result": result}) }
		if msg.Method == "" && msg.ID != nil {
			// The client's answer to our sampling or ping request: report it
			// as the pending call's result.
			answer := "result"
			if msg.Error != nil {
				answer = "error: " + string(msg.Error)
			}
			send(map[string]any{"jsonrpc": "2.0", "id": pendingCall, "result": map[string]any{
				"content": []any{map[string]any{"type": "text", "text": answer}}}})
			continue
		}
		switch msg.Method {
		case "initialize":
			caps := map[string]any{"tools": map[string]any{}}
			if mode == "events" {
				caps["events"] = map[string]any{}
			}
			reply(map[string]any{"protocolVersion": "2025-06-18", "capabilities": caps,
				"serverInfo": map[string]any{"name": "fake", "version": "1"}})
		case "events/list":
			reply(map[string]any{"events": []any{map[string]any{"name": "tick", "delivery": []string{"push"}}}})
		case "events/stream":
			meta := map[string]any{"io.modelcontextprotocol/subscriptionId": msg.ID}
			note := func(method string, params map[string]any) {
				params["_meta"] = meta
				send(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
			}
			note("notifications/events/active", map[string]any{"cursor": "0", "truncated": false})
			note("notifications/events/event", map[string]any{"eventId": "e1", "name": "tick", "timestamp": "2026-01-01T00:00:00Z", "data": map[string]any{}, "cursor": "1"})
			note("notifications/events/heartbeat", map[string]any{"cursor": "1"})
		case "notifications/cancelled":
			cancelled = append(cancelled, string(msg.Params.RequestID))
		case "tools/list":
			tools := []any{}
			names := []string{"echo", "crash", "hang", "garbage", "huge", "sample", "ping"}
			if mode == "events" {
				names = append(names, "cancelled")
			}
			for _, n := range names {
				tools = append(tools, map[string]any{"name": n, "inputSchema": map[string]any{"type": "object"}})
			}
			switch mode {
			case "dup":
				tools = append(tools, map[string]any{"name": "echo", "inputSchema": map[string]any{"type": "object"}})
			case "badschema":
				tools = append(tools, map[string]any{"name": "bad", "inputSchema": map[string]any{"type": 12}})
			}
			reply(map[string]any{"tools": tools})
		case "tools/call":
			switch msg.Params.Name {
			case "crash":
				os.Exit(3)
			case "hang":
			case "garbage":
				w.WriteString("this is not json\n")
				w.Flush()
			case "huge":
				reply(map[string]any{"content": []any{map[string]any{"type": "text", "text": strings.Repeat("x", 4096)}}})
			case "sample":
				pendingCall = msg.ID
				send(map[string]any{"jsonrpc": "2.0", "id": "s1", "method": "sampling/createMessage",
					"params": map[string]any{"messages": []any{}, "maxTokens": 10}})
			case "ping":
				pendingCall = msg.ID
				send(map[string]any{"jsonrpc": "2.0", "id": "p1", "method": "ping"})
			case "cancelled":
				reply(map[string]any{"content": []any{map[string]any{"type": "text", "text": strings.Join(cancelled, ",")}}})
			default:
				reply(map[string]any{"content": []any{map[string]any{"type": "text", "text": "ok"}}})
			}
		case "":
		default:
			if msg.ID != nil {
				send(map[string]any{"jsonrpc": "2.0", "id": msg.ID, "error": map[string]any{"code": -32601, "message": "method not found"}})
			}
		}
	}
	time.Sleep(10 * time.Millisecond)
	return 0
}
