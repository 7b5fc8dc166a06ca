package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"go.opentelemetry.io/otel/trace"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// tap is the client's end of a stdio pipe that keeps every line the client
// writes: the bytes on the wire.
type tap struct {
	w *io.PipeWriter

	mu    sync.Mutex
	part  []byte
	lines [][]byte
}

func (t *tap) Write(p []byte) (int, error) {
	t.mu.Lock()
	t.part = append(t.part, p...)
	for {
		i := bytes.IndexByte(t.part, '\n')
		if i < 0 {
			break
		}
		t.lines = append(t.lines, bytes.Clone(t.part[:i]))
		t.part = t.part[i+1:]
	}
	t.mu.Unlock()
	return t.w.Write(p)
}

func (t *tap) Close() error { return t.w.Close() }

// calls are the tools/call requests written so far.
func (t *tap) calls() [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out [][]byte
	for _, l := range t.lines {
		var m struct{ Method string }
		if json.Unmarshal(l, &m) == nil && m.Method == string(mcp.MethodToolsCall) {
			out = append(out, l)
		}
	}
	return out
}

// pipePeer serves srv over an in-process stdio pipe and returns the
// client's two ends: what it reads, and the tap it writes to.
func pipePeer(t *testing.T, srv *server.MCPServer) (io.Reader, *tap) {
	t.Helper()
	fromServer, toClient := io.Pipe()
	fromClient, toServer := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	stdio := server.NewStdioServer(srv)
	stdio.SetErrorLogger(log.New(io.Discard, "", 0))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = stdio.Listen(ctx, fromClient, toClient)
	}()
	t.Cleanup(func() {
		cancel()
		_ = toServer.Close()
		_ = toClient.Close()
		<-done
	})
	return fromServer, &tap{w: toServer}
}

// wireServer offers echo, and pick, which asks one question first
// (input_required) and answers with what it was told.
func wireServer() *server.MCPServer {
	s := server.NewMCPServer("wire", "1.0.0", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("echo"), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(fmt.Sprint(req.GetArguments()["text"])), nil
	})
	s.AddTool(mcp.NewTool("pick"), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		if res := server.ElicitationResponse(req.Params.InputResponses, "q"); res != nil {
			return mcp.NewToolResultText(fmt.Sprintf("pick: %s %v", res.Action, res.Content)), nil
		}
		return server.NewInputRequestBuilder("round-1 <&>").Elicit("q", mcp.ElicitationParams{
			Message: "Which color?", RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"color": map[string]any{"type": "string"}}},
		}).ToolResult(), nil
	})
	return s
}

// TestCallWireParity: a tools/call sent over stdio by directCall carries
// the bytes mcp-go's Client.CallTool sends for the same call (the JSON-RPC
// id aside), on a 2026-07-28 connection (_meta with the protocol version,
// client capabilities and info merged with patchbay's fields) and on a
// 2025 one (patchbay's fields only), with and without those fields, in
// the round that answers an input_required result, and with the answers
// of a parked call. Both go through capture, as in production.
func TestCallWireParity(t *testing.T) {
	t.Parallel()
	traced := trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled,
	}
	traced.TraceState, _ = trace.ParseTraceState("pb=1,other=x")
	accept := func(context.Context, connect.Question) (connect.Answer, error) {
		return connect.Answer{Action: connect.AnswerAccept, Content: map[string]any{"color": "green"}}, nil
	}
	type call struct {
		op   string
		args map[string]any
		key  string // idempotency key
		appr string // approval
		span bool   // under a (non-recording) span: traceparent, tracestate
		ask  connect.Asker
		// resume answers the questions of an earlier, parked send (capture
		// adds them to the first request).
		resume *connect.InputResume
	}
	tests := []struct {
		name    string
		version string // Options.ProtocolVersion: "" is 2026-07-28
		call    call
		sends   int // tools/call requests the call makes
		want    string
	}{
		{name: "modern/bare", call: call{op: "echo", args: map[string]any{"text": "hi"}}, sends: 1, want: "hi"},
		{name: "modern/no-args", call: call{op: "echo"}, sends: 1, want: "<nil>"},
		{name: "modern/key", call: call{op: "echo", args: map[string]any{"text": "hi"}, key: "ex_1:echo"}, sends: 1, want: "hi"},
		{name: "modern/all-meta", sends: 1, want: `a <b> & "c" é`, call: call{op: "echo", args: map[string]any{"text": `a <b> & "c" é`, "n": 1.5, "deep": map[string]any{"z": []any{1, "\u2028"}, "a": nil}},
			key: "ex_<1>&\"2\"\té", appr: "apr_1", span: true}},
		{name: "modern/input-required", sends: 2, want: "pick: accept map[color:green]",
			call: call{op: "pick", key: "ex_2:pick", span: true, ask: accept}},
		{name: "modern/resumed", sends: 1, want: "pick: accept map[color:red]", call: call{op: "pick", key: "ex_2:pick", resume: &connect.InputResume{
			RequestState: "round-1 <&>", Answers: map[string]connect.Answer{"q": {Action: connect.AnswerAccept, Content: map[string]any{"color": "red"}}}}}},
		{name: "legacy/bare", version: "2025-11-25", call: call{op: "echo", args: map[string]any{"text": "hi"}}, sends: 1, want: "hi"},
		{name: "legacy/no-args", version: "2025-11-25", call: call{op: "echo"}, sends: 1, want: "<nil>"},
		{name: "legacy/key", version: "2025-06-18", call: call{op: "echo", args: map[string]any{"text": "hi"}, key: "ex_1:echo"}, sends: 1, want: "hi"},
		{name: "legacy/all-meta", version: "2025-11-25", sends: 1, want: `a <b> & "c" é`, call: call{op: "echo", args: map[string]any{"text": `a <b> & "c" é`, "n": 1.5},
			key: "ex_<1>&\"2\"\té", appr: "apr_1", span: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := &provider{name: "wire", opts: Options{Logger: slog.New(slog.DiscardHandler), ClientVersion: "1.2.3", ProtocolVersion: tt.version}}
			ctx := t.Context()
			if tt.call.span {
				ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(traced))
			}

			// mcp-go's client, with the options and call patchbay gives it.
			in, out := pipePeer(t, wireServer())
			el := newElicitor()
			legacyOnly := tt.version != "" && !mcp.IsModernProtocol(tt.version)
			ref := client.NewClient(&capture{Interface: transport.NewIO(in, out, nil)}, p.clientOptions(legacyOnly, tt.version, el)...)
			t.Cleanup(func() { _ = ref.Close() })
			if err := ref.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := ref.Initialize(ctx, mcp.InitializeRequest{Params: mcp.InitializeParams{ClientInfo: clientInfo(p.opts.ClientVersion)}}); err != nil {
				t.Fatal(err)
			}
			var meta []metaField
			if tt.call.key != "" {
				meta = append(meta, metaField{MetaIdempotencyKey, tt.call.key})
			}
			if tt.call.appr != "" {
				meta = append(meta, metaField{MetaApproval, tt.call.appr})
			}
			meta = (&conn{kind: "stdio"}).traceCall(ctx, &session{client: ref}, tt.call.op, meta)
			rctx, s := withSlot(ctx)
			s.ask, s.callCtx, s.resumeWith = tt.call.ask, ctx, tt.call.resume
			res, err := ref.CallTool(rctx, callToolRequest(tt.call.op, tt.call.args, meta))
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := resultValue(res); fmt.Sprint(got) != tt.want {
				t.Fatalf("mcp-go's call = %v, want %s", got, tt.want)
			}
			want := out.calls()

			// The same call through the conn.
			var sent *tap
			c, err := p.dial(ctx, "stdio", func(c *conn) (transport.Interface, error) {
				var in io.Reader
				in, sent = pipePeer(t, wireServer())
				c.capture = &capture{Interface: transport.NewIO(in, sent, nil)}
				return c.capture, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			if c.own.direct == nil {
				t.Fatal("the stdio session has no direct call path")
			}
			if era := map[bool]string{true: EraLegacy, false: EraModern}[legacyOnly]; c.era != era {
				t.Fatalf("era = %s, want %s", c.era, era)
			}
			v, err := c.Call(ctx, connect.CallRequest{Op: tt.call.op, Args: tt.call.args, IdempotencyKey: tt.call.key, Approval: tt.call.appr, Ask: tt.call.ask, Resume: tt.call.resume})
			if err != nil || fmt.Sprint(v) != tt.want {
				t.Fatalf("Call = %v, %v; want %s", v, err, tt.want)
			}
			got := sent.calls()

			if len(got) != tt.sends || len(want) != tt.sends {
				t.Fatalf("sent %d tools/call, mcp-go %d; want %d", len(got), len(want), tt.sends)
			}
			for i := range got {
				g, w := withoutID(t, got[i]), withoutID(t, want[i])
				var gv, wv any
				if err := json.Unmarshal(g, &gv); err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(w, &wv); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(gv, wv) {
					t.Errorf("request %d differs as JSON:\n got %s\nwant %s", i+1, got[i], want[i])
				} else if !bytes.Equal(g, w) {
					t.Errorf("request %d: equal as JSON, but not byte for byte:\n got %s\nwant %s", i+1, got[i], want[i])
				}
				if id := idOf(t, got[i]); !strings.HasPrefix(fmt.Sprint(id), callIDPrefix) {
					t.Errorf("request %d has id %v, want %s…", i+1, id, callIDPrefix)
				}
			}
			if !legacyOnly {
				// The modern _meta is there, patchbay's fields beside it.
				var m struct {
					Params struct {
						Meta map[string]any `json:"_meta"`
					}
				}
				_ = json.Unmarshal(got[0], &m)
				if m.Params.Meta[mcp.MetaKeyProtocolVersion] != mcp.LATEST_PROTOCOL_VERSION || m.Params.Meta[mcp.MetaKeyClientInfo] == nil ||
					m.Params.Meta[mcp.MetaKeyClientCapabilities] == nil || (tt.call.key != "") != (m.Params.Meta[MetaIdempotencyKey] != nil) {
					t.Errorf("_meta = %v", m.Params.Meta)
				}
			}
		})
	}
}

// withoutID is a request line with its id member taken out.
func withoutID(t *testing.T, line []byte) []byte {
	t.Helper()
	const open = `{"jsonrpc":"2.0","id":`
	rest, ok := bytes.CutPrefix(line, []byte(open))
	if !ok {
		t.Fatalf("request %s does not start %s", line, open)
	}
	i := bytes.Index(rest, []byte(`,"method":`))
	if i < 0 {
		t.Fatalf("request %s has no method after its id", line)
	}
	return append([]byte(`{"jsonrpc":"2.0"`), rest[i:]...)
}

func idOf(t *testing.T, line []byte) any {
	t.Helper()
	var m struct{ ID any }
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatal(err)
	}
	return m.ID
}

// TestDecodeCallResult: one decode gives what mcp.ParseCallToolResult
// gives (StructuredContent aside, which resultValue reads raw), and fails
// where it fails.
func TestDecodeCallResult(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{
		`{"content":[{"type":"text","text":"hi"}]}`,
		`{"content":[{"type":"text","text":"hi","annotations":{"priority":1},"_meta":{"a":1}},{"type":"image","data":"AA==","mimeType":"image/png"}],"isError":true}`,
		`{"content":[{"type":"resource","resource":{"uri":"file:///a","text":"x"}}],"structuredContent":{"a":[1,2]},"_meta":{"progressToken":"p","x":1},"resultType":"complete"}`,
		`{"content":[],"resultType":"input_required","requestState":"s","inputRequests":{"q":{"method":"elicitation/create","params":{"message":"m","requestedSchema":{"type":"object"}}}}}`,
		`{"resultType":"input_required"}`,
		`{"content":null}`,
		`{"content":[]}`,
		`{}`,
		`null`,
		`{"content":[{"text":"no type"}]}`,
		`{"content":[{"type":7}]}`,
		`{"content":[null]}`,
		`{"content":[{"type":"video"}]}`,
		`{"content":{}}`,
		`{"content":[],"resultType":5}`,
		`{"content":[],"structuredContent":null}`,
	} {
		raw := json.RawMessage(raw)
		want, werr := mcp.ParseCallToolResult(&raw)
		got, gerr := decodeCallResult(raw)
		if (werr == nil) != (gerr == nil) {
			t.Errorf("%s: err = %v, mcp-go's %v", raw, gerr, werr)
			continue
		}
		if werr != nil {
			if !strings.HasPrefix(gerr.Error(), strings.SplitN(werr.Error(), ":", 2)[0]) {
				t.Errorf("%s: err = %v, mcp-go's %v", raw, gerr, werr)
			}
			continue
		}
		want.StructuredContent = nil
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %#v\nwant %#v", raw, got, want)
		}
	}
}

// TestDirectCallOnlyOverStdio: HTTP sessions keep mcp-go's path.
func TestDirectCallOnlyOverStdio(t *testing.T) {
	t.Parallel()
	srv := server.NewMCPServer("http", "1.0.0")
	srv.AddTool(mcp.NewTool("echo"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	})
	ts := httptest.NewServer(server.NewStreamableHTTPServer(srv))
	t.Cleanup(ts.Close)
	p := New("http", config.MCP{URL: ts.URL + "/mcp"}, &Options{Logger: slog.New(slog.DiscardHandler)}).(*provider)
	c, err := p.connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if c.own.direct != nil {
		t.Fatal("a Streamable HTTP session has the stdio call path")
	}
	if v, err := c.Call(t.Context(), connect.CallRequest{Op: "echo"}); err != nil || v != "ok" {
		t.Fatalf("Call = %v, %v", v, err)
	}
}
