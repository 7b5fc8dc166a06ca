package harness

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"

	"github.com/Masterminds/semver/v3"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// builtinProfiles is the catalog of a registry the host gave none: the
// shipped profiles. It is read-only, so one is shared.
var builtinProfiles = sync.OnceValue(profiles.Builtin)

// SpokenProfile is a profile a connection speaks: declared by its server
// (Binding empty) or given to it by a binding in config.
type SpokenProfile struct {
	Profile *profiles.Profile `json:"-"`
	Name    string            `json:"name"`
	// Version is what the server declared, or the bound profile's.
	Version string `json:"version"`
	Binding string `json:"binding,omitempty"`
}

// SetProfiles sets the catalog profile references resolve against; the
// built-in one until then. Call it before Start.
func (r *Registry) SetProfiles(cat *profiles.Catalog) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.catalog = cat
	for _, c := range r.conns {
		c.mu.Lock()
		c.catalog = cat
		c.mu.Unlock()
	}
}

// Catalog is the registry's profile catalog.
func (r *Registry) Catalog() *profiles.Catalog {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.catalog == nil {
		return builtinProfiles()
	}
	return r.catalog
}

// SetBinding maps the named connection onto a profile (from config); it
// takes effect when the connection next connects.
func (r *Registry) SetBinding(name string, b *profiles.Binding) error {
	c, err := r.Get(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.binding = b
	return nil
}

// Profiles lists the profiles the connection speaks: those of its binding
// at once, those its server declares once it has connected.
func (c *Connection) Profiles() []SpokenProfile {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.profilesLocked()
}

// bindingOf is the binding that maps the connection onto a profile; nil
// when it has none.
func (c *Connection) bindingOf() *profiles.Binding {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.binding
}

// profilesLocked is Profiles for callers holding c.mu.
func (c *Connection) profilesLocked() []SpokenProfile {
	if c.spoken == nil && c.binding != nil {
		return []SpokenProfile{bound(c.binding)}
	}
	return slices.Clone(c.spoken)
}

func bound(b *profiles.Binding) SpokenProfile {
	return SpokenProfile{Profile: b.Profile, Name: b.Profile.Name, Version: b.Profile.Version.String(), Binding: b.Name}
}

// speak gives conn — the connection's live Conn, or for a pool a lease's —
// the profiles the connection speaks: its catalog's, its binding's.
func (c *Connection) speak(conn connect.Conn) (connect.Conn, []SpokenProfile, error) {
	c.mu.RLock()
	cat, b := c.catalog, c.binding
	c.mu.RUnlock()
	if cat == nil {
		cat = builtinProfiles()
	}
	return speak(conn, cat, b)
}

// speak checks a fresh Conn against the profiles it claims to speak: each
// one its server declares that the catalog knows must not be contradicted
// by its tools, and each tool a binding uses must exist. A declared
// profile the catalog does not know is listed without a definition (a
// newer patchbay may know it). A bound Conn is wrapped so that the
// profile's operations are operations of its manifest.
func speak(conn connect.Conn, cat *profiles.Catalog, b *profiles.Binding) (connect.Conn, []SpokenProfile, error) {
	m := conn.Manifest()
	tools := make([]profiles.Tool, len(m.Operations))
	for i, op := range m.Operations {
		tools[i] = profiles.Tool{Name: op.Name, InputSchema: op.InputSchema}
	}
	spoken := []SpokenProfile{}
	for _, name := range slices.Sorted(maps.Keys(m.Profiles)) {
		declared := m.Profiles[name]
		v, err := semver.StrictNewVersion(declared)
		if err != nil {
			return nil, nil, fmt.Errorf("server declares profile %s at %q, not a semantic version", name, declared)
		}
		sp := SpokenProfile{Name: name, Version: v.String()}
		if p, ok := cat.ForVersion(name, v); ok {
			if err := profiles.Check(p, tools); err != nil {
				return nil, nil, err
			}
			sp.Profile = p
		}
		spoken = append(spoken, sp)
	}
	if b == nil {
		return conn, spoken, nil
	}
	for _, tool := range b.Tools() {
		if _, ok := m.Operation(tool); !ok {
			return nil, nil, fmt.Errorf("binding %s: the server has no tool %q", b.Name, tool)
		}
	}
	return &boundConn{Conn: conn, b: b}, append(spoken, bound(b)), nil
}

// boundConn is a Conn whose manifest also offers a binding's profile
// operations, each run as the server tool it is bound to.
type boundConn struct {
	connect.Conn
	b *profiles.Binding
}

func (c *boundConn) Manifest() connect.Manifest {
	m := c.Conn.Manifest()
	m.Operations = slices.Clone(m.Operations)
	p := c.b.Profile
	for _, name := range slices.Sorted(maps.Keys(c.b.Operations)) {
		op := p.Operations[name]
		readOnly, destructive := op.ReadOnly, op.Effects
		m.Operations = append(m.Operations, connect.Operation{
			Name: name, Description: op.Description, InputSchema: op.Input,
			Annotations: connect.Annotations{Title: name, ReadOnlyHint: &readOnly, DestructiveHint: &destructive},
		})
	}
	return m
}

func (c *boundConn) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	op, ok := c.b.Operations[req.Op]
	if !ok {
		return c.Conn.Call(ctx, req)
	}
	args, err := op.MapArgs(ctx, req.Args)
	if err != nil {
		return nil, err
	}
	profileOp := req.Op
	req.Op, req.Args = op.Tool, args
	out, err := c.Conn.Call(ctx, req)
	if err != nil {
		if ce := (*connect.CallError)(nil); errors.As(err, &ce) {
			ce.Op = profileOp + " (" + ce.Op + ")"
		}
		return nil, err
	}
	return op.MapResult(ctx, out)
}

// Done and Err pass the wrapped Conn's loss on, so a bound connection
// still reconnects.
func (c *boundConn) Done() <-chan struct{} {
	if lr, ok := c.Conn.(lossReporter); ok {
		return lr.Done()
	}
	return nil
}

func (c *boundConn) Err() error {
	if lr, ok := c.Conn.(lossReporter); ok {
		return lr.Err()
	}
	return nil
}

// profileOf resolves a manifest entry's "name@range" against what the
// connection speaks — for a handle, what its pool speaks, which every
// lease's server is bound to or checked against — or, for a server the
// document brings, against the catalog (what it speaks is known only once
// it is attached). It returns the profile the entry's steps are typed by.
func (p *parser) profileOf(name string, e map[string]any, s string, at string) *profiles.Profile {
	pname, cons, err := profiles.ParseRef(s)
	if err != nil {
		p.fail(at, fault.CodeValidationFailed, "%v", err)
		return nil
	}
	cat := p.reg.Catalog()
	if !cat.Known(pname) {
		p.fail(at, fault.CodeValidationFailed, "unknown profile %q (known: %s)", pname, strings.Join(cat.Names(), ", "))
		return nil
	}
	_, attaches := e["mcp"]
	if pool, ok := e["from"].(string); ok {
		name = pool
	}
	conn, err := p.reg.Get(name)
	if attaches || err != nil {
		prof, ok := cat.Match(pname, cons)
		if !ok {
			p.fail(at, fault.CodeValidationFailed, "no version of profile %s is within %s (known: %s)", pname, rangeOf(s), strings.Join(cat.Names(), ", "))
		}
		return prof
	}
	spoken := conn.Profiles()
	if len(spoken) == 0 {
		if st := conn.Status(); st.State != connect.StateReady {
			p.fail(at, notReadyCode(st.State), "connection %q is %s, so its profiles cannot be checked", name, st.State)
			return nil
		}
	}
	var speaks []string
	for _, sp := range spoken {
		speaks = append(speaks, sp.Name+"@"+sp.Version)
		if sp.Name != pname {
			continue
		}
		if v, err := semver.NewVersion(sp.Version); err != nil || !cons.Check(v) {
			p.fail(at, fault.CodeValidationFailed, "connection %q speaks %s@%s, outside %s", name, sp.Name, sp.Version, rangeOf(s))
			return nil
		}
		if sp.Profile == nil {
			p.fail(at, fault.CodeValidationFailed, "connection %q declares %s@%s, which this server has no definition of", name, sp.Name, sp.Version)
		}
		return sp.Profile
	}
	p.fail(at, fault.CodeValidationFailed, "connection %q does not speak profile %q (it speaks: %s)", name, pname, orNone(speaks))
	return nil
}

func rangeOf(ref string) string {
	_, r, _ := strings.Cut(ref, "@")
	return r
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, ", ")
}

// typeCall types a call by the profile of its connection's entry: an
// operation of the profile gets its arguments checked now when they are
// all literal (else when the step runs) and its result after each call.
func (p *parser) typeCall(n *Node) {
	prof := p.entryProfiles[n.Connection]
	if prof == nil {
		return
	}
	if op, ok := prof.Operations[n.Op]; ok {
		n.Profile, n.ProfileOp = prof, op
	}
}

// checkLiteralArgs validates a typed call's arguments at submit when none
// is computed.
func (p *parser) checkLiteralArgs(n *Node, path string) {
	if n.ProfileOp == nil {
		return
	}
	args := map[string]any{}
	for k, v := range n.Args {
		l, ok := v.(literal)
		if !ok || len(n.Secrets) > 0 {
			return
		}
		args[k] = l.v
	}
	if err := n.ProfileOp.CheckInput(args); err != nil {
		p.fail(path+"/args", fault.CodeValidationFailed, "arguments do not match %s operation %s: %s", n.Profile.ID(), n.Op, oneLine(err))
	}
}

// checkProfileArgs is the run-time check of a typed call's arguments
// (after gates, refs opened, secrets still placeholders).
func checkProfileArgs(n *Node, args map[string]any) error {
	if n.ProfileOp == nil {
		return nil
	}
	if err := n.ProfileOp.CheckInput(jsonValue(args)); err != nil {
		return fault.Deny(fault.GateSchema, fmt.Sprintf("arguments do not match %s operation %s: %s", n.Profile.ID(), n.Op, oneLine(err)))
	}
	return nil
}

// checkProfileResult checks a typed call's result against the profile: a
// server that answers otherwise contradicts what it speaks.
func checkProfileResult(n *Node, conn string, out any) error {
	if n.ProfileOp == nil {
		return nil
	}
	if err := n.ProfileOp.CheckOutput(jsonValue(out)); err != nil {
		return fmt.Errorf("the result of %s on %s contradicts %s: %s", n.Op, conn, n.Profile.ID(), oneLine(err))
	}
	return nil
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
