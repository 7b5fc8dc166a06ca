package mcp_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// guardingServer refuses publish as guarded (a tool error with
// structuredContent {"code": "guarded"}) unless the call carries an
// approval under _meta, and keeps the _meta of every call it was sent.
type guardingServer struct {
	mu    sync.Mutex
	metas []map[string]any
}

func (g *guardingServer) publish(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	meta := map[string]any{}
	if req.Params.Meta != nil {
		meta = req.Params.Meta.AdditionalFields
	}
	g.mu.Lock()
	g.metas = append(g.metas, meta)
	g.mu.Unlock()
	if id, _ := meta[pbmcp.MetaApproval].(string); id == "" {
		res := mcp.NewToolResultStructured(map[string]any{"code": connect.CodeGuarded}, "publishing needs an approval")
		res.IsError = true
		return res, nil
	}
	return mcp.NewToolResultStructured(map[string]any{"published": true}, "published"), nil
}

// approvals is the approval id each call carried, "" for none.
func (g *guardingServer) approvals() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, len(g.metas))
	for i, m := range g.metas {
		out[i], _ = m[pbmcp.MetaApproval].(string)
	}
	return out
}

// TestServerGuardedCallIsSentAgainOnceWithTheApproval: over the wire, a
// call the server refuses as guarded reaches it twice in all — refused,
// then, once approved, with the approval's id under
// _meta["io.patchbay/approval"] — and the step succeeds.
func TestServerGuardedCallIsSentAgainOnceWithTheApproval(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	g := &guardingServer{}
	s := server.NewMCPServer("guarding", "1.0.0")
	s.AddTool(mcp.NewTool("publish", mcp.WithString("text")), g.publish)
	url := serve(t, s)

	reg := registry.NewRegistry(slog.New(slog.DiscardHandler))
	if err := reg.Add("news", pbmcp.New("news", config.MCP{URL: url}, nil)); err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	st := storetest.New(t)
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("test", []byte(`{"connections":{"news":{"ops":["*"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := als.Put(ctx, al, "setup"); err != nil {
		t.Fatal(err)
	}
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: als})
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(runCtx, 1); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	doc := `{"version":1,"connections":{"news":{}},"root":{"kind":"call","id":"p","connection":"news","op":"publish","args":{"text":"hi"}}}`
	ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(doc), Principal: "writer", Allowlist: "test"})
	if err != nil {
		t.Fatal(err)
	}
	var pending *gates.Approval
	waitFor(t, "an approval asked for", func() bool {
		aps, err := execs.Approvals().List(ctx, gates.ApprovalPending, 10)
		if err != nil || len(aps) == 0 {
			return false
		}
		pending = aps[0]
		return true
	})
	if got := g.approvals(); !slices.Equal(got, []string{""}) {
		t.Fatalf("before the approval the server was sent %q, want one call without an approval", got)
	}
	if _, err := execs.Approvals().Decide(ctx, pending.ID, gates.ApprovalApproved, "oncall", ""); err != nil {
		t.Fatal(err)
	}
	var end *harness.Execution
	waitFor(t, "the execution to end", func() bool {
		end, err = execs.Get(ctx, ex.ID)
		return err == nil && end.Status.Terminal()
	})
	if end.Status != harness.ExecSucceeded {
		t.Fatalf("%s: %+v", end.Status, end.Error)
	}
	if got := g.approvals(); !slices.Equal(got, []string{"", pending.ID}) {
		t.Fatalf("the server was sent approvals %q, want the refused call and then one carrying %s", got, pending.ID)
	}
}
