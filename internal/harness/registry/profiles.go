package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/Masterminds/semver/v3"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// BuiltinProfiles is the catalog of a registry the host gave none: the
// shipped profiles. It is read-only, so one is shared.
var BuiltinProfiles = sync.OnceValue(profiles.Builtin)

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
		return BuiltinProfiles()
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

// Binding is the binding that maps the connection onto a profile; nil
// when it has none.
func (c *Connection) Binding() *profiles.Binding {
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

// Speak gives conn — the connection's live Conn, or for a pool a lease's —
// the profiles the connection speaks: its catalog's, its binding's.
func (c *Connection) Speak(conn connect.Conn) (connect.Conn, []SpokenProfile, error) {
	c.mu.RLock()
	cat, b := c.catalog, c.binding
	c.mu.RUnlock()
	if cat == nil {
		cat = BuiltinProfiles()
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
	return &BoundConn{Conn: conn, b: b}, append(spoken, bound(b)), nil
}

// BoundConn is a Conn whose manifest also offers a binding's profile
// operations, each run as the server tool it is bound to.
type BoundConn struct {
	connect.Conn
	b *profiles.Binding
}

func (c *BoundConn) Manifest() connect.Manifest {
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

func (c *BoundConn) Call(ctx context.Context, req connect.CallRequest) (any, error) {
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
func (c *BoundConn) Done() <-chan struct{} {
	if lr, ok := c.Conn.(lossReporter); ok {
		return lr.Done()
	}
	return nil
}

func (c *BoundConn) Err() error {
	if lr, ok := c.Conn.(lossReporter); ok {
		return lr.Err()
	}
	return nil
}
