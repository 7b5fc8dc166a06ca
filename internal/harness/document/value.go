package document

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/types"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// Expressions run in the sandbox package: expr-lang has no I/O, and every
// expression is compiled and run under its limits on size, nesting, steps,
// memory and time (see the package doc).
const maxExprLen = sandbox.MaxSourceBytes

// Scope is what an expression sees. Input is typed any so expressions
// may treat it as whatever the caller sent; type errors surface at run time.
type Scope struct {
	Input   any
	Steps   map[string]any
	Item    string // a fan-out's connection
	Results []any  // a parallel node's path outputs, for merge
	Subject any    // what a verify claim judges
	Event   any    // the event a wait's filter judges

	// Ctx stops an expression in flight when the execution (or its
	// parallel path) is cancelled; nil is context.Background.
	Ctx context.Context
}

// scopeTypes are the types of what an expression sees, for the checker.
var scopeTypes = types.Map{
	"$input":   types.Any,
	"$steps":   types.TypeOf(map[string]any{}),
	"$item":    types.TypeOf(""),
	"$results": types.TypeOf([]any{}),
	"$subject": types.Any,
	"$event":   types.Any,
}

func (s Scope) env() map[string]any {
	return map[string]any{
		"$input": s.Input, "$steps": s.Steps, "$item": s.Item,
		"$results": s.Results, "$subject": s.Subject, "$event": s.Event,
	}
}

func (s Scope) context() context.Context {
	if s.Ctx == nil {
		return context.Background()
	}
	return s.Ctx
}

// Value is an argument template: literals, objects and arrays of values,
// and compiled expressions, evaluated against a scope when the step runs.
type Value interface {
	Eval(s Scope) (any, error)
}

type Literal struct{ v any }

// NewLiteral is the value v, as it is.
func NewLiteral(v any) Literal { return Literal{v} }

func (l Literal) Eval(Scope) (any, error) { return l.v, nil }

type Object map[string]Value

func (o Object) Eval(s Scope) (any, error) {
	out := make(map[string]any, len(o))
	for _, k := range slices.Sorted(maps.Keys(o)) {
		v, err := o[k].Eval(s)
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

type array []Value

func (a array) Eval(s Scope) (any, error) {
	out := make([]any, len(a))
	for i, v := range a {
		x, err := v.Eval(s)
		if err != nil {
			return nil, err
		}
		out[i] = x
	}
	return out, nil
}

type expression struct {
	src  string
	path string
	prog *sandbox.Program
}

func (e *expression) Eval(s Scope) (any, error) {
	out, err := e.prog.Run(s.context(), s.env())
	if err != nil {
		return nil, &ExprError{path: e.path, err: err}
	}
	return out, nil
}

// ExprError is an expression that failed at run time.
type ExprError struct {
	path string
	err  error
}

func (e *ExprError) Error() string { return "expression at " + e.path + ": " + e.err.Error() }
func (e *ExprError) Unwrap() error { return e.err }

// value parses v into a template. An object whose only key is "$expr" is an
// expression; "$literal" passes its content through untouched.
func (p *parser) value(v any, path string) Value {
	switch x := v.(type) {
	case map[string]any:
		if src, ok := x["$expr"]; ok && len(x) == 1 {
			return p.expression(src, path+"/$expr")
		}
		if lit, ok := x["$literal"]; ok && len(x) == 1 {
			return Literal{lit}
		}
		if name, ok := x["$secret"]; ok && len(x) == 1 {
			return p.secret(name, path+"/$secret")
		}
		o := make(Object, len(x))
		field := p.field
		for k, item := range x {
			p.field = field + "." + k
			o[k] = p.value(item, path+"/"+fault.Escape(k))
		}
		p.field = field
		return o
	case []any:
		a := make(array, len(x))
		for i, item := range x {
			a[i] = p.value(item, fmt.Sprintf("%s/%d", path, i))
		}
		return a
	default:
		return Literal{v}
	}
}

func (p *parser) secret(v any, path string) Value {
	name, ok := v.(string)
	if !ok || !secrets.ValidSecretName(name) {
		p.fail(path, fault.CodeValidationFailed, "must be a secret name (letters, digits, '.', '_', '-')")
		return Literal{nil}
	}
	p.secrets = append(p.secrets, secretUse{Name: name, Field: p.field, Path: path})
	return SecretArg{Name: name}
}

// SecretArg stands where a secret goes in a call's arguments until gate 6
// fills it in; it is also how the arguments are shown before then.
type SecretArg struct{ Name string }

func (s SecretArg) Eval(Scope) (any, error) { return s, nil }

// MarshalJSON shows a secret's place, never its value.
func (s SecretArg) MarshalJSON() ([]byte, error) { return []byte(`"<redacted>"`), nil }

func (p *parser) expression(v any, path string) Value {
	src, ok := v.(string)
	switch {
	case !ok || src == "":
		p.fail(path, fault.CodeExpressionInvalid, "must be a non-empty string")
		return Literal{nil}
	case len(src) > maxExprLen:
		p.fail(path, fault.CodeExpressionInvalid, "is longer than %d characters", maxExprLen)
		return Literal{nil}
	}
	prog, err := compile(src)
	if limit := (*sandbox.LimitError)(nil); errors.As(err, &limit) {
		p.fail(path, fault.CodeExpressionInvalid, "%v", err)
		return Literal{nil}
	}
	if err != nil {
		p.fail(path, fault.CodeExpressionInvalid, "does not compile: %v", err)
		return Literal{nil}
	}
	node := prog.Node()
	check := &stepRefs{done: p.done}
	ast.Walk(&node, check)
	for _, id := range check.unknown {
		p.fail(path, fault.CodeExpressionInvalid, "$steps.%s is not the id of an earlier step", id)
	}
	return &expression{src: src, path: path, prog: prog}
}

// stepRefs finds $steps.<id> references to steps that have not run yet.
type stepRefs struct {
	done    map[string]bool
	unknown []string
}

func (r *stepRefs) Visit(n *ast.Node) {
	m, ok := (*n).(*ast.MemberNode)
	if !ok {
		return
	}
	id, ok := m.Node.(*ast.IdentifierNode)
	prop, isStr := m.Property.(*ast.StringNode)
	if ok && isStr && id.Value == "$steps" && !r.done[prop.Value] {
		r.unknown = append(r.unknown, prop.Value)
	}
}

// JSONValue turns evaluated arguments into what the schema validator reads:
// plain JSON values, with a secret's place standing as a string.
func JSONValue(v any) any {
	data, err := json.Marshal(v)
	if err != nil {
		return v
	}
	out, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return v
	}
	return out
}
