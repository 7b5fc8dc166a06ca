package document

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/expr-lang/expr/ast"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// Handle is a manifest entry that takes a connection of its own from a
// pool: {"from": "<pool>", "fresh": "execution"|"path", "setup": {…}}.
type Handle struct {
	// Name is the entry's key, the name steps call.
	Name string
	// Pool names the pool connection (from; default Name).
	Pool string
	// Fresh is the lease's scope: FreshExecution or FreshPath.
	Fresh string
	// Setup are the document's setup values: literal JSON, or for a
	// top-level field {"$expr": …} over $input alone, resolved when the
	// execution is submitted (see resolveSetups).
	Setup map[string]any
	// exprs are the setup fields given as expressions.
	exprs map[string]*expression
}

// Lease scopes of a handle.
const (
	FreshExecution = "execution" // one lease for the whole run
	FreshPath      = "path"      // one lease per parallel path
)

// handle validates an entry that is not a server the document brings: it
// is a handle when it names a pool (from, or its own name) or has fresh
// or setup.
func (p *parser) handle(name string, e map[string]any, at string) {
	from, hasFrom := e["from"]
	_, hasFresh := e["fresh"]
	setupV, hasSetup := e["setup"]
	pool := name
	if hasFrom {
		s, ok := from.(string)
		if !ok || !registry.ValidName(s) {
			p.fail(at+"/from", fault.CodeValidationFailed, "must name a pool connection")
			return
		}
		pool = s
	}
	conn, err := p.reg.Get(pool)
	switch {
	case err == nil && conn.IsPool():
	case !hasFrom && !hasFresh && !hasSetup:
		return // a plain connection
	case err != nil:
		p.fail(at+"/from", fault.CodeConnectionUnknown, "no connection named %q", pool)
		return
	default:
		p.fail(at, fault.CodeValidationFailed, "connection %q is not a pool, so the entry takes no from, fresh or setup", pool)
		return
	}
	if name != pool {
		if _, err := p.reg.Get(name); err == nil {
			p.fail(at, fault.CodeConnectionNameTaken, "the host already has a connection named %q; give the handle another name", name)
		}
	}
	h := Handle{Name: name, Pool: pool, Fresh: FreshExecution, Setup: map[string]any{}}
	if hasFresh {
		switch f := e["fresh"]; f {
		case FreshExecution, FreshPath:
			h.Fresh = f.(string)
		default:
			p.fail(at+"/fresh", fault.CodeValidationFailed, "must be \"path\" or \"execution\"")
		}
	}
	if hasSetup {
		setup, ok := setupV.(map[string]any)
		if !ok {
			p.fail(at+"/setup", fault.CodeValidationFailed, "must be an object of setup values")
			return
		}
		for _, k := range SortedKeys(setup) {
			fp := at + "/setup/" + fault.Escape(k)
			if src, ok := inputExpr(setup[k]); ok {
				if e := p.inputExpression(src, fp+"/$expr"); e != nil {
					if h.exprs == nil {
						h.exprs = map[string]*expression{}
					}
					h.exprs[k] = e
				}
				continue
			}
			if computed(setup[k]) {
				p.fail(fp, fault.CodeValidationFailed, "setup values are literal JSON or {\"$expr\": …} over $input ($secret and $ref are not taken here)")
			}
		}
		h.Setup = setup
	}
	if l, ok := conn.Leaser(); ok && len(h.exprs) == 0 {
		// With expressions the values are known, and checked, at submit.
		if err := l.CheckSetup(h.Setup); err != nil {
			p.fail(at+"/setup", fault.CodeValidationFailed, "%v", err)
		}
	}
	if p.handles == nil {
		p.handles = map[string]Handle{}
	}
	p.handles[name] = h
}

// inputExpr reports whether v is {"$expr": src} and returns src.
func inputExpr(v any) (string, bool) {
	m, ok := v.(map[string]any)
	if !ok || len(m) != 1 {
		return "", false
	}
	src, ok := m["$expr"].(string)
	return src, ok
}

// inputExpression compiles a setup expression, which may read $input
// only: a lease is taken before any step has run.
func (p *parser) inputExpression(src, path string) *expression {
	before := len(p.problems)
	v := p.expression(src, path)
	e, ok := v.(*expression)
	if !ok || len(p.problems) > before {
		return nil
	}
	node := e.prog.Node()
	only := &inputOnly{}
	ast.Walk(&node, only)
	if only.other != "" {
		p.fail(path, fault.CodeExpressionInvalid, "a setup expression may read $input only, not %s", only.other)
		return nil
	}
	return e
}

// inputOnly finds the first variable other than $input an expression reads.
type inputOnly struct{ other string }

func (v *inputOnly) Visit(n *ast.Node) {
	if id, ok := (*n).(*ast.IdentifierNode); ok && v.other == "" && strings.HasPrefix(id.Value, "$") && id.Value != "$input" {
		v.other = id.Value
	}
}

// ResolveSetups evaluates the setup expressions of doc's handles against
// input, in place, and checks the values against each pool's setup schema.
// It runs at submit (so the allowlist judges the values a run will use)
// and again in each run (the same input gives the same values).
func ResolveSetups(doc *Document, reg *registry.Registry, input any, base string) []fault.FieldError {
	var problems []fault.FieldError
	for _, name := range SortedKeys(doc.Handles) {
		h := doc.Handles[name]
		if len(h.exprs) == 0 {
			continue
		}
		at := base + "/connections/" + fault.Escape(name) + "/setup"
		setup := maps.Clone(h.Setup)
		for _, k := range SortedKeys(h.exprs) {
			v, err := h.exprs[k].Eval(Scope{Input: input})
			if err != nil {
				problems = append(problems, fault.FieldError{Path: at + "/" + fault.Escape(k), Code: fault.CodeExpressionInvalid, Message: err.Error()})
				continue
			}
			setup[k] = v
		}
		if conn, err := reg.Get(h.Pool); err == nil {
			if l, ok := conn.Leaser(); ok {
				if err := l.CheckSetup(setup); err != nil {
					problems = append(problems, fault.FieldError{Path: at, Code: fault.CodeValidationFailed, Message: err.Error()})
				}
			}
		}
		h.Setup, h.exprs = setup, nil
		doc.Handles[name] = h
	}
	return problems
}

// computed reports whether v holds an object with a "$" key (an
// expression, a secret or a ref).
func computed(v any) bool {
	switch x := v.(type) {
	case map[string]any:
		for k, item := range x {
			if strings.HasPrefix(k, "$") || computed(item) {
				return true
			}
		}
	case []any:
		return slices.ContainsFunc(x, computed)
	}
	return false
}

// handleTarget checks a call on a handle against its pool's manifest; it
// reports false when n's connection is not a handle.
func (p *parser) handleTarget(n *Node, path string) bool {
	h, ok := p.handles[n.Connection]
	if !ok {
		return false
	}
	if n.Op == "" {
		p.fail(path+"/op", fault.CodeValidationFailed, "is required and must be an operation name")
		return true
	}
	conn, err := p.reg.Get(h.Pool)
	if err != nil {
		return true // reported on the entry
	}
	if st := conn.State(); st != connect.StateReady {
		p.fail(path+"/op", registry.NotReadyCode(st), "pool %q is %s, so operation %q cannot be checked", h.Pool, st, n.Op)
		return true
	}
	if _, ok := conn.Manifest().Operation(n.Op); !ok {
		p.fail(path+"/op", fault.CodeOperationUnknown, "pool %q has no operation %q", h.Pool, n.Op)
	}
	return true
}

// SetupText is a setup value as patterns see it.
func SetupText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	data, _ := json.Marshal(v)
	return string(data)
}
