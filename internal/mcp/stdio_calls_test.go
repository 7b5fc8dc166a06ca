package mcp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// askingStdio is a 2026-07-28 stdio server (mcp-go's) whose tools ask
// their questions in their answers (input_required): pick asks one, two
// asks two at once, again asks every time, shed asks for nothing (retry
// later), sample asks for sampling; sends counts the tools/call each tool
// received; the resource note:// is there to be read between calls.
func askingStdio(in io.Reader, out io.Writer) int {
	s := server.NewMCPServer("asking", "1.0.0", server.WithToolCapabilities(false), server.WithResourceCapabilities(false, false))
	var mu sync.Mutex
	sends := map[string]int{}
	tool := func(name string, h func(req mcp.CallToolRequest) *mcp.CallToolResult) {
		s.AddTool(mcp.NewTool(name), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			mu.Lock()
			sends[name]++
			mu.Unlock()
			return h(req), nil
		})
	}
	form := mcp.ElicitationParams{Message: "Which color?", RequestedSchema: map[string]any{"type": "object",
		"properties": map[string]any{"color": map[string]any{"type": "string"}}}}
	tool("pick", func(req mcp.CallToolRequest) *mcp.CallToolResult {
		if res := server.ElicitationResponse(req.Params.InputResponses, "q"); res != nil {
			return mcp.NewToolResultText(fmt.Sprintf("pick: %s %v (state %s)", res.Action, res.Content, req.Params.RequestState))
		}
		return server.NewInputRequestBuilder("round-1").Elicit("q", form).ToolResult()
	})
	tool("two", func(req mcp.CallToolRequest) *mcp.CallToolResult {
		a, b := server.ElicitationResponse(req.Params.InputResponses, "a"), server.ElicitationResponse(req.Params.InputResponses, "b")
		if a != nil && b != nil {
			return mcp.NewToolResultText(fmt.Sprintf("two: %s %v, %s %v", a.Action, a.Content.(map[string]any)["color"], b.Action, b.Content.(map[string]any)["color"]))
		}
		return server.NewInputRequestBuilder("both").Elicit("a", form).Elicit("b", form).ToolResult()
	})
	tool("again", func(mcp.CallToolRequest) *mcp.CallToolResult {
		return server.NewInputRequestBuilder("again").Elicit("q", form).ToolResult()
	})
	tool("shed", func(mcp.CallToolRequest) *mcp.CallToolResult {
		return server.NewInputRequestBuilder("later").ToolResult()
	})
	tool("sample", func(mcp.CallToolRequest) *mcp.CallToolResult {
		return server.NewInputRequestBuilder("s").Sample("s", mcp.CreateMessageParams{MaxTokens: 10}).ToolResult()
	})
	s.AddTool(mcp.NewTool("sends"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		mu.Lock()
		defer mu.Unlock()
		return mcp.NewToolResultStructuredOnly(sends), nil
	})
	s.AddResource(mcp.NewResource("note://a", "a"), func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
		return []mcp.ResourceContents{mcp.TextResourceContents{URI: "note://a", Text: "note a"}}, nil
	})
	stdio := server.NewStdioServer(s)
	stdio.SetErrorLogger(log.New(io.Discard, "", 0))
	if err := stdio.Listen(context.Background(), in, out); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, context.Canceled) {
		return 1
	}
	return 0
}

func askingSpec() config.MCP {
	spec := fakeSpec("asking")
	spec.RequestTimeoutMs, spec.MaxResponseBytes = 10_000, 1<<20
	return spec
}

func answer(color string) connect.Asker {
	return func(_ context.Context, q connect.Question) (connect.Answer, error) {
		if q.Message != "Which color?" || q.RequestedSchema["type"] != "object" {
			return connect.Answer{}, fmt.Errorf("unexpected question %+v", q)
		}
		return connect.Answer{Action: connect.AnswerAccept, Content: map[string]any{"color": color}}, nil
	}
}

// mcpgoCall calls tool on an asking server through mcp-go's own client,
// with the bound and the kind of handler patchbay gives it.
func mcpgoCall(t *testing.T, tool string) error {
	t.Helper()
	tr := transport.NewStdio(os.Args[0], []string{"PATCHBAY_FAKE_MCP=asking"})
	cl := client.NewClient(tr, client.WithMaxInputRoundTrips(3), client.WithElicitationHandler(accepter{}))
	t.Cleanup(func() { _ = cl.Close() })
	if err := cl.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Initialize(t.Context(), mcp.InitializeRequest{}); err != nil {
		t.Fatal(err)
	}
	_, err := cl.CallTool(t.Context(), mcp.CallToolRequest{Params: mcp.CallToolParams{Name: tool, Arguments: map[string]any{}}})
	return err
}

type accepter struct{}

func (accepter) Elicit(context.Context, mcp.ElicitationRequest) (*mcp.ElicitationResult, error) {
	return &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{Action: mcp.ElicitationResponseActionAccept, Content: map[string]any{"color": "blue"}}}, nil
}

// TestStdioQuestions: over stdio, the questions of an input_required
// result are answered through the call's Asker (all of one round at once),
// declined without one, and bounded as mcp-go's client bounds them, with
// its errors.
func TestStdioQuestions(t *testing.T) {
	t.Parallel()
	failing := func(context.Context, connect.Question) (connect.Answer, error) {
		return connect.Answer{}, errors.New("nobody answers")
	}
	tests := []struct {
		tool   string
		ask    connect.Asker
		want   string // the value
		err    error  // errors.Is target
		text   string // in the error
		sends  int    // tools/call the server received
		mcpgo  bool   // mcp-go's client fails alike
		parity string // mcp-go's error's tail to find in ours
	}{
		{tool: "pick", ask: answer("green"), want: "pick: accept map[color:green] (state round-1)", sends: 2},
		{tool: "pick", want: "pick: decline <nil> (state round-1)", sends: 2},
		{tool: "two", ask: answer("red"), want: "two: accept red, accept red", sends: 2},
		{tool: "pick", ask: failing, text: `multi round-trip: fulfilling input request "q": nobody answers`, sends: 1},
		{tool: "again", ask: answer("green"), err: client.ErrMaxInputRoundTripsExceeded, text: "(3)", sends: 3, mcpgo: true},
		{tool: "shed", err: client.ErrMaxInputRoundTripsExceeded, text: "asked to retry 3 times without requesting input", sends: 3, mcpgo: true},
		{tool: "sample", text: "no sampling handler configured", sends: 1, mcpgo: true},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			t.Parallel()
			conn := openConn(t, "asking", askingSpec(), nil)
			got, err := conn.Call(t.Context(), connect.CallRequest{Op: tt.tool, Ask: tt.ask})
			switch {
			case tt.want != "" && (err != nil || got != tt.want):
				t.Errorf("Call = %v, %v; want %q", got, err, tt.want)
			case tt.want == "" && err == nil:
				t.Errorf("Call = %v, want an error", got)
			case tt.want == "" && (tt.err != nil && !errors.Is(err, tt.err) || !strings.Contains(err.Error(), tt.text)):
				t.Errorf("err = %v, want %v saying %q", err, tt.err, tt.text)
			}
			if tt.mcpgo {
				if merr := mcpgoCall(t, tt.tool); merr == nil || !strings.HasSuffix(err.Error(), merr.Error()) {
					t.Errorf("err = %v; mcp-go's client's: %v", err, merr)
				}
			}
			if n := sends(t, conn)[tt.tool]; n != float64(tt.sends) {
				t.Errorf("the server received %v tools/call of %s, want %d", n, tt.tool, tt.sends)
			}
		})
	}
}

func sends(t *testing.T, conn connect.Conn) map[string]any {
	t.Helper()
	v, err := conn.Call(t.Context(), connect.CallRequest{Op: "sends"})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := v.(map[string]any)
	return m
}

// TestStdioParkedQuestion: over stdio, a call that parks its questions
// fails with them (and the server's state) without asking anyone, and the
// call sent again with the answers reaches the server once, with its
// state.
func TestStdioParkedQuestion(t *testing.T) {
	t.Parallel()
	conn := openConn(t, "asking", askingSpec(), nil)
	asked := false
	ask := func(context.Context, connect.Question) (connect.Answer, error) {
		asked = true
		return connect.Answer{Action: connect.AnswerDecline}, nil
	}
	_, err := conn.Call(t.Context(), connect.CallRequest{Op: "pick", Ask: ask, Park: true})
	var ir *connect.InputRequired
	if !errors.As(err, &ir) || ir.RequestState != "round-1" || ir.Questions["q"].Message != "Which color?" || asked {
		t.Fatalf("err = %v (%+v), asked %v; want the parked question", err, ir, asked)
	}
	got, err := conn.Call(t.Context(), connect.CallRequest{Op: "pick", Ask: ask, Park: true, Resume: &connect.InputResume{
		RequestState: ir.RequestState, Answers: map[string]connect.Answer{"q": {Action: connect.AnswerAccept, Content: map[string]any{"color": "red"}}},
	}})
	if err != nil || got != "pick: accept map[color:red] (state round-1)" || asked {
		t.Fatalf("resumed Call = %v, %v (asked %v)", got, err, asked)
	}
	if n := sends(t, conn)["pick"]; n != float64(2) {
		t.Errorf("the server received %v calls of pick, want the parked one and the answered one", n)
	}
}

// TestStdioCallsInterleaved: calls in flight at once over one stdio
// connection, between mcp-go's own requests on the same pipe, each get
// their own answer.
func TestStdioCallsInterleaved(t *testing.T) {
	t.Parallel()
	conn := openConn(t, "asking", askingSpec(), nil)
	demo := openConn(t, "demo", config.MCP{Command: demoBin}, nil)
	reader := conn.(interface {
		ReadResource(ctx context.Context, uri string, headers map[string]string) (any, error)
	})
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 40 {
		wg.Go(func() {
			text := fmt.Sprintf("call %d", i)
			got, err := demo.Call(t.Context(), connect.CallRequest{Op: "echo", Args: map[string]any{"text": text}, IdempotencyKey: text})
			if err != nil || !strings.Contains(fmt.Sprint(got), text) {
				errs <- fmt.Errorf("echo %q = %v, %v", text, got, err)
			}
		})
		wg.Go(func() {
			got, err := conn.Call(t.Context(), connect.CallRequest{Op: "pick", Ask: answer(fmt.Sprint(i))})
			if want := fmt.Sprintf("pick: accept map[color:%d] (state round-1)", i); err != nil || got != want {
				// With several calls in flight over stdio a question cannot
				// be tied to one call (elicit.go), except through the
				// call's own context, which the stdio path keeps.
				errs <- fmt.Errorf("pick %d = %v, %v", i, got, err)
			}
		})
		wg.Go(func() {
			if _, err := reader.ReadResource(t.Context(), "note://a", nil); err != nil {
				errs <- fmt.Errorf("read: %w", err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestStdioCancelledCallNotified: over stdio, a call whose caller gives up
// or that times out is followed by notifications/cancelled with its
// request id, which is patchbay's.
func TestStdioCancelledCallNotified(t *testing.T) {
	t.Parallel()
	spec := fakeSpec("events")
	spec.RequestTimeoutMs = 300
	conn := openConn(t, "fake", spec, nil)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := conn.Call(ctx, connect.CallRequest{Op: "hang"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: err = %v", err)
	}
	if _, err := conn.Call(t.Context(), connect.CallRequest{Op: "hang"}); err == nil || !strings.Contains(err.Error(), "requestTimeoutMs") {
		t.Fatalf("timed out call: err = %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := conn.Call(t.Context(), connect.CallRequest{Op: "cancelled"})
		if err != nil {
			t.Fatal(err)
		}
		ids := strings.Split(fmt.Sprint(res), ",")
		if len(ids) == 2 && !slices.ContainsFunc(ids, func(id string) bool { return !strings.HasPrefix(id, `"pb-call-`) }) && ids[0] != ids[1] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server was told of cancelled requests %v, want the two calls'", res)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
