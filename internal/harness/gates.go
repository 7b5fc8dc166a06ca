package harness

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/refs"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/sync/singleflight"
)

// verdict is what gates 1–4 decide about a call.
type verdict int

const (
	allow verdict = iota
	needsApproval
)

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

// gates runs gates 1 to 4 for a call with evaluated args (secrets still
// placeholders). It returns the arguments with every sealed ref opened to
// the raw id the server knows.
//
// Refs are opened before the schema check, since the schema describes the
// raw ids; when a ref is refused, the schema cannot be judged and the call
// is refused at gate 3.
//
// A guarded operation (a profile's mark) needs approval unless the policy
// allows it by name.
func (e *Executions) gates(ctx context.Context, conn *registry.Connection, op string, guarded bool, args map[string]any, thread string) (verdict, map[string]any, error) {
	operation, ok := conn.Manifest().Operation(op)
	if !ok {
		return 0, nil, fault.Deny(fault.GateDeclared, fmt.Sprintf("connection %s has no operation %q", conn.Name(), op))
	}
	rc := refs.RefContext{Thread: thread, Identity: conn.Identity(), Lease: registry.LeaseOf(conn)}
	opened, refErr := e.openRefs(ctx, args, "", rc, conn.Name())
	if refErr == nil {
		sch, err := e.schemas.get(ctx, conn.Name(), conn.Identity().Instance, operation)
		if err != nil {
			if ctx.Err() != nil {
				// Cancelled or out of time: not a refusal.
				return 0, nil, fmt.Errorf("gate %d: %w", fault.GateSchema, err)
			}
			return 0, nil, fault.Deny(fault.GateSchema, err.Error())
		}
		if sch != nil {
			if err := sch.Validate(document.JSONValue(opened)); err != nil {
				return 0, nil, fault.Deny(fault.GateSchema, "arguments do not match the schema of "+op+": "+err.Error())
			}
		}
		if m, ok := opened.(map[string]any); ok {
			// A value that leaves the operation's path would reach
			// another path than the one granted and judged below.
			if err := connect.CheckPathArgs(operation.HTTP, m); err != nil {
				return 0, nil, fault.Deny(fault.GateSchema, "arguments do not fit the path of "+op+": "+err.Error())
			}
		}
	} else {
		return 0, nil, fault.Deny(fault.GateRefs, refErr.Error())
	}
	args = opened.(map[string]any)
	pol := conn.Policy()
	if document.MatchOp(pol.Deny, op) {
		return 0, nil, fault.Deny(fault.GatePolicy, fmt.Sprintf("the policy of %s denies %s", conn.Name(), op))
	}
	if document.MatchOp(pol.Approve, op) || (guarded && !document.MatchOp(pol.Allow, op)) {
		return needsApproval, args, nil
	}
	return allow, args, nil
}

// openRefs is gate 3: it replaces each sealed ref in v with its raw id,
// refusing refs that are forged, from another thread, stale, or issued by
// a connection other than the one called. Secret placeholders are kept for
// gate 6.
func (e *Executions) openRefs(ctx context.Context, v any, path string, rc refs.RefContext, conn string) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		if token, ok := x["$ref"].(string); ok && (refs.IsSealedRef(token) || refs.RefOnlyKeys(x, "$ref", "kind")) {
			if !refs.IsSealedRef(token) {
				return nil, &refs.RefError{Err: refs.ErrRefForged, Path: refs.RefPathOrRoot(path)}
			}
			ref, err := e.sealer.Open(ctx, token, rc)
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
			opened, err := e.openRefs(ctx, item, path+"/"+fault.Escape(k), rc, conn)
			if err != nil {
				return nil, err
			}
			out[k] = opened
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			opened, err := e.openRefs(ctx, item, fmt.Sprintf("%s/%d", path, i), rc, conn)
			if err != nil {
				return nil, err
			}
			out[i] = opened
		}
		return out, nil
	}
	return v, nil
}

// present prepares a call's result to be stored and shown: refs sealed to
// this thread and connection, sensitive blobs withheld, secrets redacted.
func (e *Executions) present(ctx context.Context, out any, conn *registry.Connection, thread string) (any, error) {
	sealed, err := e.sealer.SealRefs(ctx, out, refs.RefContext{Thread: thread, Connection: conn.Name(), Identity: conn.Identity(), Lease: registry.LeaseOf(conn)})
	if err != nil {
		return nil, err
	}
	return e.redact(refs.WithholdSensitive(sealed)), nil
}

// fillSecrets is gate 6: it replaces every secret placeholder with its
// value and registers the value for redaction.
// callerHeaders resolves the principal's own credentials for connection,
// part of gate 6; every value is registered for redaction before it is
// used.
func (e *Executions) callerHeaders(ctx context.Context, conn *registry.Connection, principal string) (map[string]string, error) {
	if e.credentials == nil {
		return nil, nil
	}
	connection := conn.Name()
	h, ok, err := e.credentials.Headers(ctx, connection, principal)
	if err != nil {
		if errors.Is(err, connect.ErrNeedsSignIn) {
			if conn.Access().SignIn == registry.SignInShared {
				// Everyone's sign-in is gone, not one user's.
				conn.NeedSignIn(e.redactor.String(err.Error()))
			}
			return nil, fault.Deny(fault.GateSecrets, fmt.Sprintf("connection %s needs a sign-in for %q: %v", connection, principal, e.redactor.String(err.Error())))
		}
		return nil, fmt.Errorf("credentials for %s: %s", connection, e.redactor.String(err.Error()))
	}
	if !ok {
		return nil, nil
	}
	for _, v := range h {
		e.redactor.Add(v)
	}
	return h, nil
}

// refreshHeaders asks the credentials (when they can) to replace the
// ones a server rejected; ok is false when there is nothing new to send.
func (e *Executions) refreshHeaders(ctx context.Context, connection, principal string, rejected map[string]string) (map[string]string, bool) {
	cr, can := e.credentials.(connect.CredentialRefresher)
	if !can {
		return nil, false
	}
	h, err := cr.Refresh(ctx, connection, principal, rejected)
	if err != nil {
		e.logger.Warn("rejected credentials could not be replaced", "connection", connection, "principal", principal, "err", e.redactor.String(err.Error()))
		return nil, false
	}
	for _, v := range h {
		e.redactor.Add(v)
	}
	return h, true
}

func (e *Executions) fillSecrets(ctx context.Context, v any) (any, error) {
	switch x := v.(type) {
	case document.SecretArg:
		if e.secrets == nil {
			return nil, fault.Deny(fault.GateSecrets, fmt.Sprintf("secret %q: no secret store is configured", x.Name))
		}
		val, err := e.secrets.Resolve(ctx, x.Name)
		if err != nil {
			return nil, fault.Deny(fault.GateSecrets, fmt.Sprintf("secret %q could not be resolved", x.Name))
		}
		e.redactor.Add(val)
		return val, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, item := range x {
			filled, err := e.fillSecrets(ctx, item)
			if err != nil {
				return nil, err
			}
			out[k] = filled
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			filled, err := e.fillSecrets(ctx, item)
			if err != nil {
				return nil, err
			}
			out[i] = filled
		}
		return out, nil
	}
	return v, nil
}
