package harness

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/refs"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// # Profile reads
//
// A read is a piece of state a profile names (browser.page.summary,
// ui.tree, screen.current): what a model is shown of a connection
// (looking, look.go) and what a verify node with a read name judges. A run
// takes one with run.takeRead; nothing else reaches a read.
//
// Where a read comes from:
//   - a connection bound to the profile (a binding in config): the bound
//     tool, called with the binding's arguments, or the bound resource,
//     then the binding's projection;
//   - a server that declares the profile itself: the tool named after the
//     read ("browser.page.summary"), called with no arguments. This is
//     patchbay's convention for declaring servers (docs/connections.md, "Profiles"): a
//     tool passes every gate and rides every session, lease and tenant a
//     call does; MCP resources (ResourceReader) ride the connection's own
//     session only.
//
// The gates, as for a call: (1) the read is in a profile the connection
// speaks and the allowlist grants its name on the connection (a grant's
// ops globs match operations and reads alike), and the tool that takes it
// exists; (2) the tool's arguments match its schema; (3) no refs are sent;
// (4) the policy: a deny glob matching the read or its tool refuses it,
// and so does an approve glob, since a read is read-only and nothing that
// looks can wait for a person; (6) the principal's credentials go with it.
//
// The answer is checked against the read's output schema (a server that
// answers otherwise contradicts its profile, an error), then presented as
// a call's result is (refs sealed to the run's thread, sensitive blobs
// withheld, secrets redacted), and the fields the read marks sensitive are
// replaced by "[sensitive blob withheld]" before it is rendered, stored or
// shown.

// Reading is one profile read taken for a run.
type Reading struct {
	Connection string `json:"connection"`
	Read       string `json:"read"`
	// Profile is the profile it was read by, "name@version".
	Profile string `json:"profile"`
	// Value is what the claims of a verify judge and what is stored:
	// checked against the read's output schema, refs sealed, sensitive
	// fields withheld, secrets redacted.
	Value any `json:"value"`
	// Text is Value rendered by the read's render expression: what a model
	// is shown. Redacted and bounded like a tool result.
	Text string `json:"text"`
	// Identity is the identity of the connection it was read from.
	Identity connect.Identity `json:"identity"`
}

// findRead is gate 1 of a read: the read is in a profile conn speaks and
// conn has a way to take it.
func findRead(conn *registry.Connection, name string) (document.ReadSource, error) {
	src, ok := document.ReadsOf(conn)[name]
	if !ok {
		var speaks []string
		for _, sp := range conn.Profiles() {
			speaks = append(speaks, sp.Name+"@"+sp.Version)
		}
		return src, fault.Deny(fault.GateDeclared, fmt.Sprintf("connection %s speaks no profile with read %q (it speaks: %s)", conn.Name(), name, document.OrNone(speaks)))
	}
	switch {
	case src.Binding != "" && src.Bound == nil:
		return src, fault.Deny(fault.GateDeclared, fmt.Sprintf("binding %s of connection %s does not bind read %s of %s", src.Binding, conn.Name(), name, src.Profile.ID()))
	case src.Binding == "":
		if _, ok := conn.Manifest().Operation(name); !ok {
			return src, fault.Deny(fault.GateDeclared, fmt.Sprintf("connection %s declares %s but has no tool %q to take that read", conn.Name(), src.Profile.ID(), name))
		}
	}
	return src, nil
}

// takeRead takes read of the connection the run knows as name (a handle
// is leased on first use, as for a call; step names the step asking, for
// a lease that times out) through the gates, and presents it. It writes
// no ledger entry: callers that must replay what they saw record the
// Reading themselves.
func (r *run) takeRead(ctx context.Context, f *frame, step, name, read string) (*Reading, error) {
	if err := r.readGranted(ctx, name, read); err != nil {
		return nil, err
	}
	conn, err := r.connFor(ctx, f, step, name)
	if err != nil {
		return nil, err
	}
	if conn.Access().ActsAsUser() && forNoOne(r.rec.Principal) {
		return nil, fault.Deny(fault.GateDeclared, fmt.Sprintf("connection %s acts as a user and this execution runs for no principal", conn.Name()))
	}
	if st := conn.State(); st != connect.StateReady {
		return nil, fmt.Errorf("connection %s is %s: %w", conn.Name(), st, connect.ErrUnavailable)
	}
	src, err := findRead(conn, read)
	if err != nil {
		return nil, err
	}
	if err := readPolicy(conn, read); err != nil {
		return nil, err
	}
	id := conn.Identity()
	var out any
	if src.Bound != nil && src.Bound.Resource != "" {
		out, err = r.readResource(ctx, conn, src.Bound.Resource)
	} else {
		out, err = r.readTool(ctx, conn, src, read)
	}
	if err != nil {
		return nil, err
	}
	if src.Bound != nil {
		if out, err = src.Bound.Value(ctx, out); err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", read, conn.Name(), err)
		}
	}
	return r.reading(ctx, conn, src, read, id, out)
}

// readTool takes a read through a tool: the bound one, or the one named
// after the read. Gates 1–4 run on the tool as on any call.
func (r *run) readTool(ctx context.Context, conn *registry.Connection, src document.ReadSource, read string) (any, error) {
	op, args := read, map[string]any{}
	if src.Bound != nil {
		var err error
		op = src.Bound.Tool
		if args, err = src.Bound.MapArgs(ctx); err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", read, conn.Name(), err)
		}
	}
	verdict, args, err := r.e.pipeline.Check(ctx, gates.Call{Conn: conn, Op: op, Args: args, Thread: r.refScope()})
	traceGates(ctx, verdict, err)
	if err != nil {
		return nil, err
	}
	if verdict == gates.NeedsApproval {
		return nil, fault.Deny(fault.GateApprover, fmt.Sprintf("a read cannot wait for approval; the policy of %s guards %s (read %s)", conn.Name(), op, read))
	}
	return r.deliver(ctx, conn, connect.CallRequest{Op: op, Args: args, Principal: r.rec.Principal})
}

// readResource takes a bound read from a resource, when the connection's
// provider can read resources.
func (r *run) readResource(ctx context.Context, conn *registry.Connection, uri string) (any, error) {
	rr, ok := resourceReader(conn)
	if !ok {
		return nil, fault.Deny(fault.GateDeclared, fmt.Sprintf("connection %s cannot read resources (its binding reads %s)", conn.Name(), uri))
	}
	headers, err := r.e.pipeline.CallerHeaders(ctx, conn, r.rec.Principal)
	if err != nil {
		return nil, err
	}
	return rr.ReadResource(ctx, uri, headers)
}

// resourceReader finds a ResourceReader under the wrappers the harness
// puts around a provider's Conn.
func resourceReader(c *registry.Connection) (connect.ResourceReader, bool) {
	conn := c.Live()
	for conn != nil {
		if rr, ok := conn.(connect.ResourceReader); ok {
			return rr, true
		}
		switch w := conn.(type) {
		case *registry.BoundConn:
			conn = w.Conn
		case *registry.LeasedConn:
			conn = w.Conn
		default:
			return nil, false
		}
	}
	return nil, false
}

// readPolicy is gate 4 for the read's own name (its tool's name passes
// the gates as a call's): a deny refuses, and so does an approve, since
// nothing that looks can wait for a person.
func readPolicy(conn *registry.Connection, read string) error {
	pol := conn.Policy()
	switch {
	case document.MatchOp(pol.Deny, read):
		return fault.Deny(fault.GatePolicy, fmt.Sprintf("the policy of %s denies %s", conn.Name(), read))
	case document.MatchOp(pol.Approve, read):
		return fault.Deny(fault.GateApprover, fmt.Sprintf("a read cannot wait for approval; the policy of %s guards %s", conn.Name(), read))
	}
	return nil
}

// readGranted checks the execution's allowlist grants read on the
// connection the run knows as name (a handle: its pool's grant; a server
// the document brings: its server grant). Host documents are trusted.
func (r *run) readGranted(ctx context.Context, name, read string) error {
	al, trusted, err := r.grants(ctx)
	if err != nil || trusted {
		return err
	}
	grant, spec := name, (*document.AttachSpec)(nil)
	if r.doc != nil {
		if h, ok := r.doc.Handles[name]; ok {
			grant = h.Pool
		}
		spec = attachSpecOf(r.doc, name)
	}
	if len(agent.GrantedOps(al, false, grant, spec, []connect.Operation{{Name: read}})) == 0 {
		return fault.Deny(fault.GateDeclared, fmt.Sprintf("the allowlist does not grant read %s of connection %s", read, name))
	}
	return nil
}

// attachSpecOf is the server a document, or one of its model nodes,
// brings under name (every node that attaches a name attaches the same
// server); nil for none.
func attachSpecOf(doc *document.Document, name string) *document.AttachSpec {
	if s, ok := doc.Attached[name]; ok {
		return &s
	}
	var spec *document.AttachSpec
	doc.Walk(func(n *document.Node) {
		if n.Model == nil || spec != nil {
			return
		}
		for _, p := range n.Model.Picks {
			if p.Attach != nil && p.Connection == name {
				spec = p.Attach
				return
			}
		}
	})
	return spec
}

// reading checks a read's value against the profile and presents it.
func (r *run) reading(ctx context.Context, conn *registry.Connection, src document.ReadSource, read string, id connect.Identity, out any) (*Reading, error) {
	if err := src.Read.CheckOutput(document.JSONValue(out)); err != nil {
		return nil, fmt.Errorf("read %s of %s contradicts %s: %s", read, conn.Name(), src.Profile.ID(), document.OneLine(err))
	}
	shown, err := r.e.pipeline.Present(ctx, out, conn, r.refScope())
	if err != nil {
		return nil, err
	}
	shown = withholdFields(shown, src.Read.Sensitive)
	text, err := src.Read.Text(ctx, shown)
	if err != nil {
		return nil, fmt.Errorf("read %s of %s: %w", read, conn.Name(), err)
	}
	text = agent.BoundForModel(r.e.redactor.String(text))
	return &Reading{Connection: conn.Name(), Read: read, Profile: src.Profile.ID(), Value: shown, Text: text, Identity: id}, nil
}

// withholdReadTool withholds the sensitive fields of a call's result
// when the call is a declaring server's tool for a read (screen.current
// called as a tool by a step or a model): the read's marks hold however
// it is taken.
func withholdReadTool(conn *registry.Connection, op string, out any) any {
	if src, ok := document.ReadsOf(conn)[op]; ok && src.Binding == "" {
		return withholdFields(out, src.Read.Sensitive)
	}
	return out
}

// withholdFields replaces the top-level fields of v that ptrs name (JSON
// Pointers, checked to be top-level when the profile was loaded) by the
// withheld marker.
func withholdFields(v any, ptrs []string) any {
	m, ok := v.(map[string]any)
	if !ok || len(ptrs) == 0 {
		return v
	}
	out := make(map[string]any, len(m))
	for k, x := range m {
		out[k] = x
	}
	for _, p := range ptrs {
		field := strings.NewReplacer("~1", "/", "~0", "~").Replace(strings.TrimPrefix(p, "/"))
		if _, ok := out[field]; ok {
			out[field] = refs.SensitiveBlob
		}
	}
	return out
}

// readFailure is the text a model is shown in place of a read that could
// not be taken; interruptions are not failures and stop the turn.
func readFailure(err error) string {
	var d *fault.Denied
	if errors.As(err, &d) {
		return "steering_denied: " + d.Reason
	}
	return err.Error()
}
