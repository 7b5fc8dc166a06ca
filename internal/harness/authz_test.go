package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestDecideNeedsASecondPerson: who may decide an approval of svc.send that
// alice's execution asked for, when svc's policy names its approvers.
func TestDecideNeedsASecondPerson(t *testing.T) {
	t.Parallel()
	g := setupGates(t, storetest.New(t))
	ctx := context.Background()
	ex, err := g.execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(callDoc("send", `{"to":"ops"}`)), Principal: "alice", Allowlist: "ops"})
	must(t, err)
	ap := waitApproval(t, g.execs, ex.ID)

	approver := func(name string, roles ...authz.Role) authz.Principal {
		return authz.Principal{Name: name, Roles: roles}
	}
	cases := []struct {
		name string
		p    authz.Principal
		want error
	}{
		{"the requester, even holding approve", approver("alice", authz.Approve), gates.ErrSelfApproval},
		{"the requester, as admin", approver("alice", authz.Admin), gates.ErrSelfApproval},
		{"a run key", approver("bob"), gates.ErrNotApprover},
		{"read only", approver("carol", authz.Read), gates.ErrNotApprover},
		{"approve outside its globs", authz.Principal{Name: "dave", Roles: []authz.Role{authz.Approve}, Approve: []string{"billing.*"}}, gates.ErrNotApprover},
		{"approve within its globs", authz.Principal{Name: "erin", Roles: []authz.Role{authz.Approve}, Approve: []string{"svc.se*"}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ok := g.execs.Approvals().MayDecide(ap, c.p)
			if ok != (c.want == nil) {
				t.Fatalf("MayDecide = %v, want %v", ok, c.want == nil)
			}
			if c.want == nil {
				return
			}
			if _, err := g.execs.Approvals().DecideAs(ctx, ap.ID, gates.ApprovalApproved, c.p, ""); !errors.Is(err, c.want) {
				t.Fatalf("DecideAs = %v, want %v", err, c.want)
			}
		})
	}
	// Even the engine's own Decide refuses the requester's name.
	if _, err := g.execs.Approvals().Decide(ctx, ap.ID, gates.ApprovalApproved, "alice", ""); !errors.Is(err, gates.ErrSelfApproval) {
		t.Fatalf("Decide by the requester = %v", err)
	}
	got, err := g.execs.Approvals().Get(ctx, ap.ID)
	must(t, err)
	if got.State != gates.ApprovalPending {
		t.Fatalf("a refused decider changed the approval: %s", got.State)
	}
	decided, err := g.execs.Approvals().DecideAs(ctx, ap.ID, gates.ApprovalApproved, approver("erin", authz.Approve), "ok")
	must(t, err)
	if decided.DecidedBy != "erin" {
		t.Fatalf("decider recorded as %q", decided.DecidedBy)
	}
}

// TestPolicyApprovers: a connection whose policy names its approvers is
// decided by those only, by name or by role, not by any approve key.
func TestPolicyApprovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "deploy"}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("prod", mem))
	must(t, reg.SetPolicy("prod", registry.Policy{Approve: []string{"deploy"}, Approvers: []string{"sam", "role:oncall"}}))
	must(t, reg.Start(ctx))
	execs := startWorkers(t, storetest.New(t), reg, 1, "ops", `{"connections":{"prod":{"ops":["*"]}}}`, harness.ExecutionsOptions{})
	ex, err := execs.Submit(ctx, harness.Request{Workflow: json.RawMessage(`{"version":1,"connections":{"prod":{}},"root":{"kind":"call","id":"d","connection":"prod","op":"deploy"}}`), Principal: "alice", Allowlist: "ops"})
	must(t, err)
	ap := waitApproval(t, execs, ex.ID)
	for _, c := range []struct {
		p    authz.Principal
		want bool
	}{
		{authz.Principal{Name: "pat", Roles: []authz.Role{authz.Approve}}, false},
		{authz.Principal{Name: "root", Roles: []authz.Role{authz.Admin}}, false},
		{authz.Principal{Name: "sam", Roles: []authz.Role{authz.Approve}}, true},
		{authz.Principal{Name: "sam"}, false}, // named, but without the approve role
		{authz.Principal{Name: "kim", Roles: []authz.Role{authz.Approve, "oncall"}}, true},
	} {
		if got := execs.Approvals().MayDecide(ap, c.p); got != c.want {
			t.Errorf("MayDecide(%s %v) = %v, want %v", c.p.Name, c.p.Roles, got, c.want)
		}
	}
	if _, err := execs.Approvals().DecideAs(ctx, ap.ID, gates.ApprovalApproved, authz.Principal{Name: "pat", Roles: []authz.Role{authz.Approve}}, ""); !errors.Is(err, gates.ErrNotApprover) {
		t.Fatalf("DecideAs by an approver the policy does not name = %v", err)
	}
}

// TestCommandGrantsComeFromTheConfigFile: a grant of a server that runs a
// command is trusted from Seed (the config file) only.
func TestCommandGrantsComeFromTheConfigFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := storetest.New(t)
	als := gates.NewAllowlists(st)
	parse := func(name, body string) *gates.Allowlist {
		al, err := gates.ParseAllowlist(name, []byte(body))
		must(t, err)
		return al
	}
	const tool = `{"name":"tool","command":"./bin/tool","args":["--safe"],"ops":["*"]}`
	const url = `{"name":"remote","url":"https://mcp.example.test/mcp","ops":["*"]}`
	_, err := als.Seed(ctx, parse("team", `{"connections":{},"mcp":[`+tool+`]}`))
	must(t, err)

	// The seeded command grant is there, though Redis does not hold it.
	al, err := als.Get(ctx, "team")
	must(t, err)
	if len(al.MCP) != 1 || al.MCP[0].Command != "./bin/tool" {
		t.Fatalf("seeded grants = %+v", al.MCP)
	}
	raw, err := st.Client.Get(ctx, st.Key("allowlist", "team")).Result()
	must(t, err)
	if strings.Contains(raw, "./bin/tool") {
		t.Fatalf("the command grant was stored in Redis: %s", raw)
	}

	// A PUT that keeps the config file's grant, and adds a URL, is fine.
	_, err = als.Put(ctx, parse("team", `{"connections":{},"mcp":[`+tool+`,`+url+`]}`), "admin")
	must(t, err)
	al, err = als.Get(ctx, "team")
	must(t, err)
	if len(al.MCP) != 2 {
		t.Fatalf("after PUT: %+v", al.MCP)
	}

	// Any other command line is refused, naming the field.
	for _, body := range []string{
		`{"connections":{},"mcp":[{"name":"sh","command":"/bin/sh","args":["-c","id"]}]}`,
		`{"connections":{},"mcp":[{"name":"tool","command":"./bin/tool","args":["--unsafe"],"ops":["*"]}]}`,
	} {
		_, err := als.Put(ctx, parse("team", body), "admin")
		var ve *fault.ValidationError
		if !errors.As(err, &ve) || ve.Code() != gates.CodeHostGrant || ve.Problems[0].Path != "/mcp/0/command" {
			t.Fatalf("PUT %s = %v", body, err)
		}
	}
	// Nor can another allowlist borrow team's grant.
	if _, err := als.Put(ctx, parse("other", `{"connections":{},"mcp":[`+tool+`]}`), "admin"); err == nil {
		t.Fatal("another allowlist took the config file's command grant")
	}

	// A command grant written into Redis by other means is ignored.
	forged := `{"name":"team","connections":{},"mcp":[{"name":"sh","command":"/bin/sh","args":["-c","id"]}]}`
	must(t, st.Client.Set(ctx, st.Key("allowlist", "team"), forged, 0).Err())
	al, err = als.Get(ctx, "team")
	must(t, err)
	for _, g := range al.MCP {
		if g.Command == "/bin/sh" {
			t.Fatalf("a command grant found in Redis was honoured: %+v", al.MCP)
		}
	}
}
