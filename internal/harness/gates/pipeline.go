// Package gates owns what stands between a call and a connection: the six
// gates as one Pipeline (declared, schema with its bounded and shared
// compiles, refs, policy, approver, secrets and the caller's credentials),
// the allowlists that say what a principal's executions may use, and the
// approval queue where guarded calls wait for a person. The engine runs
// every call and every read through one Pipeline; the API and the admin UI
// read and decide approvals and manage allowlists here.
package gates

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/sync/singleflight"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/refs"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
)

// Verdict is what gates 1–4 decide about a call.
type Verdict int

// Verdicts.
const (
	Allow         Verdict = iota // send it (after gate 6)
	NeedsApproval                // a person decides first (gate 5)
)

// Pipeline is the six gates every call passes, in the order docs/workflows.md
// gives: 1 declared (Declared), 2 schema (Schema), 3 refs (Refs), 4 policy
// (Policy), 5 approver (the engine parks the run on the approval queue
// when Policy says NeedsApproval), 6 secrets (FillSecrets and the caller's
// credentials, CallerHeaders). Check runs 1 to 4; refs are opened before
// the schema is judged, since the schema describes the raw ids. Present
// prepares a result on the way back. One Pipeline serves every call of an
// engine; it is safe for concurrent use.
type Pipeline struct {
	schemas     schemas
	sealer      *refs.Sealer
	secrets     secrets.SecretStore
	credentials connect.Credentials
	redactor    secrets.Redactor
	logger      *slog.Logger
}

// Options configure a Pipeline. A nil Secrets refuses every secret, a nil
// Credentials sends every call with its connection's own credentials.
type Options struct {
	Sealer      *refs.Sealer
	Secrets     secrets.SecretStore
	Credentials connect.Credentials
	Redactor    secrets.Redactor
	Logger      *slog.Logger
	// SchemaMaxNodes and SchemaCompileTimeout bound gate 2's compile
	// (DefaultSchemaMaxNodes, DefaultSchemaCompileTimeout when zero).
	SchemaMaxNodes       int
	SchemaCompileTimeout time.Duration
	// Compile stands in for gate 2's JSON Schema compile; nil is the
	// compile itself. Tests stand in a slow one.
	Compile func(conn string, op connect.Operation) (*jsonschema.Schema, error)
}

// New returns the gates configured by o; a nil Redactor is a fresh one and
// a nil Logger discards.
func New(o Options) *Pipeline {
	if o.Redactor == nil {
		o.Redactor = secrets.NewSecretRedactor()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pipeline{
		schemas: schemas{maxNodes: o.SchemaMaxNodes, timeout: o.SchemaCompileTimeout},
		sealer:  o.Sealer, secrets: o.Secrets, credentials: o.Credentials, redactor: o.Redactor, logger: o.Logger,
	}
	if o.Compile != nil {
		p.schemas.build = func(conn string, op connect.Operation) compiled {
			sch, err := o.Compile(conn, op)
			return compiled{sch: sch, err: err}
		}
	}
	return p
}

// Call is one call as the gates see it: its arguments evaluated, secrets
// still placeholders.
type Call struct {
	Conn *registry.Connection
	Op   string
	// Guarded: a profile marks the operation guarded, so it needs
	// approval unless the policy allows it by name.
	Guarded bool
	Args    map[string]any
	// Thread is what sealed refs are bound to (the execution's id).
	Thread string
}

// Defaults of the gate-2 compile's bounds (ExecutionsOptions).
const (
	// DefaultSchemaMaxNodes bounds an operation schema gate 2 compiles,
	// in JSON values once its repeated subschemas are shared (see
	// shareSubschemas): the compile's cost grows with their square, and
	// 20,000 distinct ones take about a second.
	DefaultSchemaMaxNodes = 20_000
	// DefaultSchemaCompileTimeout bounds how long a call waits for its
	// operation's schema to compile.
	DefaultSchemaCompileTimeout = 10 * time.Second
)

// schemas caches compiled operation schemas by connection, identity
// instance and operation, so a replaced server's new schema is compiled
// anew. A schema is compiled once, outside the lock, by one goroutine
// whatever the number of calls waiting for it; a call waits at most
// timeout, and no longer than its context, while the compile (bounded by
// maxNodes) runs on and is kept for the next call. A schema that fails
// (too large, not JSON, not a schema) is kept as its error.
type schemas struct {
	maxNodes int
	timeout  time.Duration
	// build compiles one schema; nil is compile. Tests stand in a slow one.
	build func(conn string, op connect.Operation) compiled

	mu    sync.Mutex
	cache map[string]compiled
	group singleflight.Group
}

// compiled is one operation's schema, nil when it has none, or why not.
type compiled struct {
	sch *jsonschema.Schema
	err error
}

// errSchemaTimeout is a compile that did not finish in time.
var errSchemaTimeout = errors.New("schema compile timed out")

func (s *schemas) get(ctx context.Context, conn string, inst string, op connect.Operation) (*jsonschema.Schema, error) {
	key := conn + "\x00" + inst + "\x00" + op.Name
	s.mu.Lock()
	c, ok := s.cache[key]
	s.mu.Unlock()
	if ok {
		return c.sch, c.err
	}
	build := s.build
	if build == nil {
		build = s.compile
	}
	done := s.group.DoChan(key, func() (any, error) {
		c := build(conn, op)
		s.mu.Lock()
		if s.cache == nil {
			s.cache = map[string]compiled{}
		}
		s.cache[key] = c
		s.mu.Unlock()
		return c, nil
	})
	timeout := cmp.Or(s.timeout, DefaultSchemaCompileTimeout)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case r := <-done:
		c := r.Val.(compiled)
		return c.sch, c.err
	case <-timer.C:
		return nil, fmt.Errorf("schema of %s did not compile within %s (PATCHBAY_SCHEMA_COMPILE_TIMEOUT): %w", op.Name, timeout, errSchemaTimeout)
	case <-ctx.Done():
		if cause := context.Cause(ctx); cause != ctx.Err() {
			return nil, fmt.Errorf("schema of %s: %w: %w", op.Name, ctx.Err(), cause)
		}
		return nil, fmt.Errorf("schema of %s: %w", op.Name, ctx.Err())
	}
}

// compile compiles one operation's schema, its repeated subschemas
// shared when it is large.
func (s *schemas) compile(conn string, op connect.Operation) (c compiled) {
	if len(op.InputSchema) == 0 {
		return compiled{}
	}
	defer func() {
		// A schema must never take the process down.
		if p := recover(); p != nil {
			c = compiled{err: fmt.Errorf("schema of %s does not compile: %v", op.Name, p)}
		}
	}()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(op.InputSchema))
	if err != nil {
		return compiled{err: fmt.Errorf("schema of %s is not JSON: %w", op.Name, err)}
	}
	nodes := countValues(doc)
	if nodes > shareAbove {
		if shared, n, ok := shareSubschemas(doc); ok {
			doc, nodes = shared, n
		}
	}
	maxNodes := cmp.Or(s.maxNodes, DefaultSchemaMaxNodes)
	if nodes > maxNodes {
		return compiled{err: fmt.Errorf("schema of %s is too large to check: %d JSON values, more than %d (PATCHBAY_SCHEMA_MAX_NODES)", op.Name, nodes, maxNodes)}
	}
	comp := jsonschema.NewCompiler()
	url := "mem://" + conn + "/" + op.Name
	if err := comp.AddResource(url, doc); err != nil {
		return compiled{err: err}
	}
	sch, err := comp.Compile(url)
	if err != nil {
		return compiled{err: fmt.Errorf("schema of %s does not compile: %w", op.Name, err)}
	}
	return compiled{sch: sch}
}

// Check runs gates 1 to 4 for c. It returns the arguments with every
// sealed ref opened to the raw id the server knows.
//
// Refs are opened before the schema check, since the schema describes the
// raw ids; when a ref is refused, the schema cannot be judged and the call
// is refused at gate 3.
func (p *Pipeline) Check(ctx context.Context, c Call) (Verdict, map[string]any, error) {
	op, err := p.Declared(c)
	if err != nil {
		return 0, nil, err
	}
	opened, err := p.Refs(ctx, c)
	if err != nil {
		return 0, nil, err
	}
	if err := p.Schema(ctx, c, op, opened); err != nil {
		return 0, nil, err
	}
	v, err := p.Policy(c)
	return v, opened, err
}

// Declared is gate 1: the connection has the operation.
func (p *Pipeline) Declared(c Call) (connect.Operation, error) {
	op, ok := c.Conn.Manifest().Operation(c.Op)
	if !ok {
		return op, fault.Deny(fault.GateDeclared, fmt.Sprintf("connection %s has no operation %q", c.Conn.Name(), c.Op))
	}
	return op, nil
}

// Refs is gate 3: every sealed ref in the arguments opened to its raw id,
// or the call refused.
func (p *Pipeline) Refs(ctx context.Context, c Call) (map[string]any, error) {
	rc := refs.RefContext{Thread: c.Thread, Identity: c.Conn.Identity(), Lease: registry.LeaseOf(c.Conn)}
	opened, err := p.openRefs(ctx, c.Args, "", rc, c.Conn.Name())
	if err != nil {
		return nil, fault.Deny(fault.GateRefs, err.Error())
	}
	return opened.(map[string]any), nil
}

// Schema is gate 2: the opened arguments match the operation's input
// schema, and path arguments stay on the operation's path.
func (p *Pipeline) Schema(ctx context.Context, c Call, op connect.Operation, opened map[string]any) error {
	sch, err := p.schemas.get(ctx, c.Conn.Name(), c.Conn.Identity().Instance, op)
	if err != nil {
		if ctx.Err() != nil {
			// Cancelled or out of time: not a refusal.
			return fmt.Errorf("gate %d: %w", fault.GateSchema, err)
		}
		return fault.Deny(fault.GateSchema, err.Error())
	}
	if sch != nil {
		if err := sch.Validate(document.JSONValue(opened)); err != nil {
			return fault.Deny(fault.GateSchema, "arguments do not match the schema of "+c.Op+": "+err.Error())
		}
	}
	// A value that leaves the operation's path would reach another path
	// than the one granted and judged below.
	if err := connect.CheckPathArgs(op.HTTP, opened); err != nil {
		return fault.Deny(fault.GateSchema, "arguments do not fit the path of "+c.Op+": "+err.Error())
	}
	return nil
}

// Policy is gate 4: the connection's policy denies the operation, sends
// it to a person, or lets it through. A guarded operation needs approval unless the policy
// allows it by name.
func (p *Pipeline) Policy(c Call) (Verdict, error) {
	pol := c.Conn.Policy()
	if document.MatchOp(pol.Deny, c.Op) {
		return 0, fault.Deny(fault.GatePolicy, fmt.Sprintf("the policy of %s denies %s", c.Conn.Name(), c.Op))
	}
	if document.MatchOp(pol.Approve, c.Op) || (c.Guarded && !document.MatchOp(pol.Allow, c.Op)) {
		return NeedsApproval, nil
	}
	return Allow, nil
}

// openRefs is gate 3: it replaces each sealed ref in v with its raw id,
// refusing refs that are forged, from another thread, stale, or issued by
// a connection other than the one called. Secret placeholders are kept for
// gate 6.
func (p *Pipeline) openRefs(ctx context.Context, v any, path string, rc refs.RefContext, conn string) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		if token, ok := x["$ref"].(string); ok && (refs.IsSealedRef(token) || refs.RefOnlyKeys(x, "$ref", "kind")) {
			if !refs.IsSealedRef(token) {
				return nil, &refs.RefError{Err: refs.ErrRefForged, Path: refs.RefPathOrRoot(path)}
			}
			ref, err := p.sealer.Open(ctx, token, rc)
			if err != nil {
				return nil, fmt.Errorf("ref at %s: %w", refs.RefPathOrRoot(path), err)
			}
			if ref.Connection != conn {
				return nil, fmt.Errorf("ref at %s was issued by %s, not %s: %w", refs.RefPathOrRoot(path), ref.Connection, conn, refs.ErrRefRoute)
			}
			return ref.Raw, nil
		}
		out := make(map[string]any, len(x))
		for k, item := range x {
			opened, err := p.openRefs(ctx, item, path+"/"+fault.Escape(k), rc, conn)
			if err != nil {
				return nil, err
			}
			out[k] = opened
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			opened, err := p.openRefs(ctx, item, fmt.Sprintf("%s/%d", path, i), rc, conn)
			if err != nil {
				return nil, err
			}
			out[i] = opened
		}
		return out, nil
	}
	return v, nil
}

// Present prepares a call's result to be stored and shown: refs sealed to
// this thread and connection, sensitive blobs withheld, secrets redacted.
func (p *Pipeline) Present(ctx context.Context, out any, conn *registry.Connection, thread string) (any, error) {
	sealed, err := p.sealer.SealRefs(ctx, out, refs.RefContext{Thread: thread, Connection: conn.Name(), Identity: conn.Identity(), Lease: registry.LeaseOf(conn)})
	if err != nil {
		return nil, err
	}
	return p.redactor.Value(refs.WithholdSensitive(sealed)), nil
}

// CallerHeaders resolves the principal's own credentials for connection,
// part of gate 6; every value is registered for redaction before it is
// used.
func (p *Pipeline) CallerHeaders(ctx context.Context, conn *registry.Connection, principal string) (map[string]string, error) {
	if p.credentials == nil {
		return nil, nil
	}
	connection := conn.Name()
	h, ok, err := p.credentials.Headers(ctx, connection, principal)
	if err != nil {
		if errors.Is(err, connect.ErrNeedsSignIn) {
			if conn.Access().SignIn == registry.SignInShared {
				// Everyone's sign-in is gone, not one user's.
				conn.NeedSignIn(p.redactor.String(err.Error()))
			}
			return nil, fault.Deny(fault.GateSecrets, fmt.Sprintf("connection %s needs a sign-in for %q: %v", connection, principal, p.redactor.String(err.Error())))
		}
		return nil, fmt.Errorf("credentials for %s: %s", connection, p.redactor.String(err.Error()))
	}
	if !ok {
		return nil, nil
	}
	for _, v := range h {
		p.redactor.Add(v)
	}
	return h, nil
}

// RefreshHeaders asks the credentials (when they can) to replace the
// ones a server rejected; ok is false when there is nothing new to send.
func (p *Pipeline) RefreshHeaders(ctx context.Context, connection, principal string, rejected map[string]string) (map[string]string, bool) {
	cr, can := p.credentials.(connect.CredentialRefresher)
	if !can {
		return nil, false
	}
	h, err := cr.Refresh(ctx, connection, principal, rejected)
	if err != nil {
		p.logger.Warn("rejected credentials could not be replaced", "connection", connection, "principal", principal, "err", p.redactor.String(err.Error()))
		return nil, false
	}
	for _, v := range h {
		p.redactor.Add(v)
	}
	return h, true
}

// FillSecrets is gate 6: it replaces every secret placeholder with its
// value and registers the value for redaction.
func (p *Pipeline) FillSecrets(ctx context.Context, v any) (any, error) {
	switch x := v.(type) {
	case document.SecretArg:
		if p.secrets == nil {
			return nil, fault.Deny(fault.GateSecrets, fmt.Sprintf("secret %q: no secret store is configured", x.Name))
		}
		val, err := p.secrets.Resolve(ctx, x.Name)
		if err != nil {
			return nil, fault.Deny(fault.GateSecrets, fmt.Sprintf("secret %q could not be resolved", x.Name))
		}
		p.redactor.Add(val)
		return val, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, item := range x {
			filled, err := p.FillSecrets(ctx, item)
			if err != nil {
				return nil, err
			}
			out[k] = filled
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			filled, err := p.FillSecrets(ctx, item)
			if err != nil {
				return nil, err
			}
			out[i] = filled
		}
		return out, nil
	}
	return v, nil
}
