// Package sandbox compiles and runs expr-lang expressions under hard limits,
// so that an expression from a workflow document or a trigger cannot take
// the host down. It owns the limits and the one compile/run path every
// expression in patchbay goes through.
//
// expr-lang has no I/O, but several of its builtins allocate before they
// charge the VM's memory budget (repeat allocates the whole string first,
// string concatenation and join are not charged at all), and its VM has no
// step budget and cannot be interrupted. So, at compile time, a patch
// rewrites the tree:
//
//   - every builtin that builds a string or an array (repeat, join,
//     replace, upper, lower, split, splitAfter, toJSON, fromJSON, toBase64,
//     fromBase64, string, concat, flatten, reverse, sort, uniq, keys,
//     values, toPairs, fromPairs, take, median) becomes a call of a guard
//     that computes an upper bound of the result's size from its arguments,
//     charges it, and only then calls expr-lang's own implementation;
//   - a + b, unless both sides are numbers, charges len(a)+len(b) first;
//   - in, contains, startsWith, endsWith and matches charge steps for what
//     they scan (two elements of an array are a step, a KiB of a string
//     one; matches charges len(text)×len(pattern)/8), and a pattern that is not a constant may be
//     at most MaxPatternBytes long;
//   - the builtins that scan (indexOf, trim, max, mean…) charge the same;
//   - methods of Go values that take strings or other unmetered values
//     (time.Time's Format) are refused;
//   - the body of every predicate (map, filter, all, any, reduce, sortBy…)
//     charges one step per element before it runs.
//
// Every charge also checks the context, so a cancelled execution, or one
// past MaxDuration, stops between two steps. The VM's own element budget
// (array and map literals, ranges) is set to MaxElements.
//
// Charges are cumulative, never refunded: the bound on what an expression
// can hold is the bound on what it may ever have allocated. A refusal is a
// *LimitError naming the limit.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/parser/lexer"
	"github.com/expr-lang/expr/types"
	"github.com/expr-lang/expr/vm"
)

// The limits. They are far above what a workflow's arguments, filters and
// merges need (kilobytes, hundreds of elements) and far below what hurts a
// server with a few hundred MB to spare.
const (
	// MaxSourceBytes bounds an expression's text.
	MaxSourceBytes = 4096
	// MaxNodes bounds the size of its syntax tree.
	MaxNodes = 2000
	// MaxDepth bounds how deeply brackets nest: ( [ {.
	MaxDepth = 64
	// MaxSteps bounds the work of one evaluation: one step per predicate
	// call (an element of map, filter, all, reduce…) and per builtin call
	// that builds a value.
	MaxSteps = 1_000_000
	// MaxBytes bounds what one evaluation's strings and builtin-built arrays
	// may add up to, charged before anything is allocated.
	MaxBytes = 32 << 20
	// MaxElements is the VM's own budget: elements of array and map
	// literals and of ranges (1..n) one evaluation may build.
	MaxElements = 500_000
	// MaxDuration bounds one evaluation's wall-clock time.
	MaxDuration = time.Second
	// MaxPatternBytes bounds a regular expression built at run time.
	MaxPatternBytes = 256
)

// ErrLimit matches every *LimitError with errors.Is.
var ErrLimit = errors.New("expression limit exceeded")

// LimitError is an expression refused for exceeding a limit.
type LimitError struct {
	Limit string // "source size", "nodes", "nesting depth", "steps", "memory", "time", "pattern size"
	Bound string // the limit's figure, as a person reads it
	What  string // what exceeded it, when known
}

func (e *LimitError) Error() string {
	s := "expression exceeds the " + e.Limit + " limit (" + e.Bound + ")"
	if e.What != "" {
		s += ": " + e.What
	}
	return s
}

func (e *LimitError) Is(target error) bool { return target == ErrLimit }

var (
	errSteps    = &LimitError{Limit: "steps", Bound: fmt.Sprintf("%d steps", MaxSteps)}
	errTime     = &LimitError{Limit: "time", Bound: MaxDuration.String()}
	errElements = &LimitError{Limit: "memory", Bound: fmt.Sprintf("%d array/map elements", MaxElements)}
)

func errMemory(what string) *LimitError {
	return &LimitError{Limit: "memory", Bound: fmt.Sprintf("%d MiB", MaxBytes>>20), What: what}
}

// meterName is the hidden variable through which guards reach the
// evaluation's meter; "$$" names cannot be written by users (Compile
// refuses them), and a Meter exposes nothing to an expression.
const (
	meterName = "$$meter"
	tickName  = "$$tick"
	opName    = "$$op"
	guardPfx  = "$$"
)

// meter is one evaluation's budget. Its fields are unexported so that an
// expression that reaches it (through $env) can neither read nor call it.
type meter struct {
	steps    int64
	bytes    int64
	calls    int64
	done     <-chan struct{} // the context's; nil never ends
	deadline time.Time       // MaxDuration after the start
	err      error           // the first limit hit; later ones are consequences
}

func (m *meter) fail(err error) error {
	if m.err == nil {
		m.err = err
	}
	return m.err
}

// step charges n steps and checks the context (a channel poll, every
// call) and the clock (every 64th call, and on every call charged for a
// scan, which may have been long).
func (m *meter) step(n int64) error {
	select {
	case <-m.done:
		return m.fail(errStopped)
	default:
	}
	m.calls++
	if (n > 1 || m.calls&63 == 0) && time.Now().After(m.deadline) {
		return m.fail(errTime)
	}
	m.steps += n
	if m.steps > MaxSteps {
		return m.fail(errSteps)
	}
	return nil
}

// charge charges n bytes, before they are allocated.
func (m *meter) charge(n int64, what string) error {
	if n < 0 || n > MaxBytes || m.bytes+n > MaxBytes {
		return m.fail(errMemory(what))
	}
	m.bytes += n
	return nil
}

// errStopped stands for "the context ended"; Run replaces it with the
// context's cause.
var errStopped = errors.New("expression stopped")

var meterType = reflect.TypeOf((*meter)(nil))

func meterOf(args []any) (*meter, []any, error) {
	if len(args) > 0 {
		if m, ok := args[0].(*meter); ok && m != nil {
			return m, args[1:], nil
		}
	}
	return nil, nil, errors.New("internal function called without its budget")
}

// Program is a compiled expression; it is safe for concurrent Runs.
type Program struct {
	prog *vm.Program
}

// Node is the expression's tree after the patch (for callers that inspect
// which variables it reads).
func (p *Program) Node() ast.Node { return p.prog.Node() }

// Compile compiles src for env, the types of the variables expressions
// see. opts add functions.
func Compile(src string, env types.Map, opts ...expr.Option) (*Program, error) {
	if len(src) > MaxSourceBytes {
		return nil, &LimitError{Limit: "source size", Bound: fmt.Sprintf("%d bytes", MaxSourceBytes), What: fmt.Sprintf("%d bytes", len(src))}
	}
	if d := depth(src); d > MaxDepth {
		return nil, &LimitError{Limit: "nesting depth", Bound: fmt.Sprintf("%d", MaxDepth), What: fmt.Sprintf("brackets nest %d deep", d)}
	}
	cenv := make(types.Map, len(env)+1)
	for k, v := range env {
		cenv[k] = v
	}
	cenv[meterName] = types.TypeOf((*meter)(nil))
	p := &patch{}
	all := []expr.Option{expr.Env(cenv), expr.MaxNodes(MaxNodes), expr.Patch(p)}
	all = append(all, guardOptions...)
	all = append(all, opts...)
	prog, err := expr.Compile(src, all...)
	if p.err != nil {
		return nil, p.err
	}
	if err != nil {
		if strings.Contains(err.Error(), "exceeds maximum allowed nodes") {
			return nil, &LimitError{Limit: "nodes", Bound: fmt.Sprintf("%d nodes", MaxNodes)}
		}
		// Guards carry the builtin's name after "$$"; say the builtin's.
		return nil, errors.New(strings.ReplaceAll(err.Error(), guardPfx, ""))
	}
	return &Program{prog: prog}, nil
}

// depth is how deeply brackets nest in src. Counted on tokens so that
// brackets inside strings do not count; a lexing error is left to Compile.
func depth(src string) int {
	toks, err := lexer.Lex(file.NewSource(src))
	if err != nil {
		return 0
	}
	d, max := 0, 0
	for _, t := range toks {
		if t.Kind != lexer.Bracket {
			continue
		}
		switch t.Value {
		case "(", "[", "{":
			d++
			if d > max {
				max = d
			}
		default:
			d--
		}
	}
	return max
}

// Run evaluates the program against env under the limits. It returns when
// ctx ends or MaxDuration passes, within a step.
func (p *Program) Run(ctx context.Context, env map[string]any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("expression not run: %w", err)
	}
	// No timer per run: the meter reads the clock as it charges steps,
	// which every loop does.
	m := &meter{done: ctx.Done(), deadline: time.Now().Add(MaxDuration)}

	renv := make(map[string]any, len(env)+1)
	for k, v := range env {
		renv[k] = v
	}
	renv[meterName] = m
	machine := vm.VM{MemoryBudget: MaxElements}
	out, err := machine.Run(p.prog, renv)
	switch {
	case m.err == errStopped:
		return nil, fmt.Errorf("expression interrupted: %w", context.Cause(ctx))
	case m.err != nil:
		return nil, m.err
	case err != nil && strings.Contains(err.Error(), "memory budget exceeded"):
		// The VM panics with this text when its element budget runs out;
		// expr-lang's repeat returns it as an error past 1,000,000 copies.
		if fe := (*file.Error)(nil); errors.As(err, &fe) && fe.Prev != nil {
			return nil, &LimitError{Limit: "memory", Bound: "1000000 copies", What: "repeat()"}
		}
		return nil, errElements
	case err != nil:
		return nil, err
	}
	return out, nil
}

// patch rewrites the tree as the package doc says. ast.Walk visits
// children before their parent, so the nodes it inserts are not visited
// again.
type patch struct {
	err error
	n   int // names the variables of rewritten additions apart
}

func (p *patch) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.IdentifierNode:
		if strings.HasPrefix(n.Value, guardPfx) && p.err == nil {
			p.err = fmt.Errorf("names starting with %q are reserved", guardPfx)
		}
	case *ast.CallNode:
		// A callee whose type is not known at compile time may be a method
		// of a Go value fetched at run time ([now()][0].Format), which the
		// rule below could not see; such calls are refused.
		if t := n.Callee.Type(); (t == nil || t.Kind() != reflect.Func) && p.err == nil {
			p.err = fmt.Errorf("only functions and methods known at compile time can be called")
		}
	case *ast.MemberNode:
		// Methods of Go values (time.Time from now() or date()) are not
		// metered; those that take only numbers and durations (Year, Add,
		// Hours) return small values, but Format and the like build a string
		// from a string argument, uncharged. So methods with such
		// parameters are refused.
		if t := n.Type(); t != nil && t.Kind() == reflect.Func && p.err == nil {
			for i := range t.NumIn() {
				switch t.In(i).Kind() {
				case reflect.String, reflect.Slice, reflect.Array, reflect.Map, reflect.Interface, reflect.Pointer, reflect.Func:
					p.err = fmt.Errorf("method %v is not available in expressions", n.Property)
				}
			}
		}
	case *ast.BuiltinNode:
		if builtinPredicates[n.Name] {
			for _, a := range n.Arguments {
				if pred, ok := a.(*ast.PredicateNode); ok {
					pred.Node = &ast.SequenceNode{Nodes: []ast.Node{
						call(tickName),
						pred.Node,
					}}
				}
			}
			return
		}
		if _, ok := guards[n.Name]; ok {
			c := call(guardPfx+n.Name, n.Arguments...)
			ast.Patch(node, c)
		}
	case *ast.BinaryNode:
		if !p.charged(n) {
			return
		}
		// let $$lN = a; let $$rN = b; $$op(meter, "op", $$lN, $$rN); $$lN op $$rN
		// — the operation keeps its operands' types, so type checks and
		// constant patterns stay as they were.
		p.n++
		l := fmt.Sprintf("$$l%d", p.n)
		r, right := "", n.Right
		if _, constant := n.Right.(*ast.StringNode); !constant || n.Operator != "matches" {
			r = fmt.Sprintf("$$r%d", p.n)
			right = &ast.IdentifierNode{Value: r}
		}
		var out ast.Node = &ast.SequenceNode{Nodes: []ast.Node{
			call(opName, &ast.StringNode{Value: n.Operator}, &ast.IdentifierNode{Value: l}, right),
			&ast.BinaryNode{Operator: n.Operator, Left: &ast.IdentifierNode{Value: l}, Right: right},
		}}
		if r != "" {
			out = &ast.VariableDeclaratorNode{Name: r, Value: n.Right, Expr: out}
		}
		ast.Patch(node, &ast.VariableDeclaratorNode{Name: l, Value: n.Left, Expr: out})
	}
}

// charged reports whether a binary operation may cost more than a
// constant: concatenating strings allocates; in, contains, startsWith,
// endsWith and matches scan their operands.
func (p *patch) charged(n *ast.BinaryNode) bool {
	switch n.Operator {
	case "+":
		return !isNumber(n.Left.Type()) || !isNumber(n.Right.Type())
	case "in":
		if _, literal := n.Right.(*ast.ArrayNode); literal {
			return false // as long as the source, and made a set at compile time
		}
		t := n.Right.Type()
		return t == nil || t.Kind() != reflect.Map && t.Kind() != reflect.Struct
	case "contains", "startsWith", "endsWith", "matches":
		return true
	}
	return false
}

func call(name string, args ...ast.Node) *ast.CallNode {
	return &ast.CallNode{
		Callee:    &ast.IdentifierNode{Value: name},
		Arguments: append([]ast.Node{&ast.IdentifierNode{Value: meterName}}, args...),
	}
}

func isNumber(t reflect.Type) bool {
	if t == nil {
		return false
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return true
	}
	return false
}

var builtinPredicates = map[string]bool{}

func init() {
	for _, b := range builtin.Builtins {
		if b.Predicate {
			builtinPredicates[b.Name] = true
		}
	}
}
