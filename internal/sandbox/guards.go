package sandbox

import (
	"fmt"
	"reflect"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/vm/runtime"
)

// elem is what one element of a built array is charged: an interface
// value (two words). Strings shared with their source are not charged.
const elem = 16

// estimate is an upper bound, in bytes, of what a builtin allocates for
// args. It must not allocate in proportion to its arguments itself.
type estimate func(args []any) int64

// guards are the builtins that build values, with the bound of each. The
// others (len, indexOf, trim, first, abs, now…) allocate a constant or
// nothing.
var guards = map[string]estimate{
	"repeat": func(a []any) int64 {
		n := int64(runtime.ToInt(arg(a, 1)))
		s := int64(strLen(arg(a, 0)))
		if n < 0 {
			return 0 // repeat's own error
		}
		if n > 0 && s > 0 && n > MaxBytes/s {
			return MaxBytes + 1 // the product would overflow; it is over anyway
		}
		return s * n
	},
	"join": func(a []any) int64 {
		sep := int64(strLen(arg(a, 1)))
		var n int64
		forEach(arg(a, 0), func(v any) bool {
			n += int64(strLen(v)) + sep + elem
			return n <= MaxBytes
		})
		return n
	},
	"replace": func(a []any) int64 {
		s, old, repl := int64(strLen(arg(a, 0))), int64(strLen(arg(a, 1))), int64(strLen(arg(a, 2)))
		// With an empty old, new goes between every byte.
		return s + (s/max(old, 1)+1)*repl
	},
	// Case mapping may turn one invalid byte into a 3-byte U+FFFD.
	"upper": func(a []any) int64 { return 3 * int64(strLen(arg(a, 0))) },
	"lower": func(a []any) int64 { return 3 * int64(strLen(arg(a, 0))) },
	// A part per byte at most; the parts share the string's bytes.
	"split":      func(a []any) int64 { return elem * int64(strLen(arg(a, 0))+1) },
	"splitAfter": func(a []any) int64 { return elem * int64(strLen(arg(a, 0))+1) },
	"toJSON":     func(a []any) int64 { return textBound(arg(a, 0), true) },
	"string":     func(a []any) int64 { return textBound(arg(a, 0), false) },
	// A decoded value costs more than its text: "[0,0,…]" is 2 bytes per
	// element of 16 (plus the boxed float) in Go.
	"fromJSON":   func(a []any) int64 { return 32 * int64(strLen(arg(a, 0))) },
	"toBase64":   func(a []any) int64 { return int64(strLen(arg(a, 0)))*4/3 + 4 },
	"fromBase64": func(a []any) int64 { return int64(strLen(arg(a, 0))) },
	"concat": func(a []any) int64 {
		var n int64
		for _, x := range a {
			n += elem * int64(length(x))
		}
		return n
	},
	"flatten": func(a []any) int64 {
		var n int64
		var walk func(v any) bool
		walk = func(v any) bool {
			if !isArray(v) {
				n += elem
				return n <= MaxBytes
			}
			ok := true
			forEach(v, func(x any) bool { ok = walk(x); return ok })
			return ok
		}
		walk(arg(a, 0))
		return n
	},
	"reverse": func(a []any) int64 { return elem * int64(length(arg(a, 0))) },
	"sort":    func(a []any) int64 { return elem * int64(length(arg(a, 0))) },
	"median":  func(a []any) int64 { return elem * int64(length(arg(a, 0))) },
	"uniq":    func(a []any) int64 { return 4 * elem * int64(length(arg(a, 0))) },
	"keys":    func(a []any) int64 { return elem * int64(length(arg(a, 0))) },
	"values":  func(a []any) int64 { return elem * int64(length(arg(a, 0))) },
	"toPairs": func(a []any) int64 { return 4 * elem * int64(length(arg(a, 0))) },
	"fromPairs": func(a []any) int64 {
		return 4 * elem * int64(length(arg(a, 0)))
	},
	// These allocate nothing much but scan their arguments; they are
	// guarded for the steps (see work).
	"trim":        none,
	"trimPrefix":  none,
	"trimSuffix":  none,
	"indexOf":     none,
	"lastIndexOf": none,
	"max":         none,
	"min":         none,
	"mean":        none,
	"take": func(a []any) int64 {
		return elem * int64(min(max(runtime.ToInt(arg(a, 1)), 0), length(arg(a, 0))))
	},
}

func none([]any) int64 { return 0 }

// work is the steps a builtin call is charged beyond its first: what it
// scans, as the operators charge (a KiB of a string or 8 elements of an
// array per step). Nested arrays count at their top level only.
func work(args []any) int64 {
	var n int64
	for _, a := range args {
		switch {
		case isArray(a) || a != nil && reflect.TypeOf(a).Kind() == reflect.Map:
			n += int64(length(a)) / 8
		default:
			n += int64(strLen(a)) / 1024
		}
	}
	return n
}

// guardOptions register, for each guarded builtin, the function the patch
// calls in its place: "$$name"(meter, args…). Where expr-lang declares the
// builtin's signatures, the guard declares the same with the meter first,
// so type errors are still found at compile time.
var guardOptions []expr.Option

func init() {
	for name, est := range guards {
		b := builtin.Builtins[builtin.Index[name]]
		impl := implementation(b)
		if f, ok := faster[name]; ok {
			impl = fallback(f, impl)
		}
		types := make([]any, 0, len(b.Types))
		for _, t := range b.Types {
			in := []reflect.Type{meterType}
			for i := range t.NumIn() {
				in = append(in, t.In(i))
			}
			out := make([]reflect.Type, t.NumOut())
			for i := range out {
				out[i] = t.Out(i)
			}
			types = append(types, reflect.New(reflect.FuncOf(in, out, t.IsVariadic())).Interface())
		}
		guardOptions = append(guardOptions, expr.Function(guardPfx+name, func(args ...any) (any, error) {
			m, rest, err := meterOf(args)
			if err != nil {
				return nil, err
			}
			if err := m.step(1 + work(rest)); err != nil {
				return nil, err
			}
			if err := m.charge(est(rest), name+"()"); err != nil {
				return nil, err
			}
			return impl(rest...)
		}, types...))
	}

	guardOptions = append(guardOptions,
		expr.Function(tickName, func(args ...any) (any, error) {
			m, _, err := meterOf(args)
			if err != nil {
				return nil, err
			}
			return nil, m.step(1)
		}),
		expr.Function(opName, func(args ...any) (any, error) {
			m, rest, err := meterOf(args)
			if err != nil {
				return nil, err
			}
			op, _ := arg(rest, 0).(string)
			l, r := arg(rest, 1), arg(rest, 2)
			switch op {
			case "+":
				if err := m.step(1); err != nil {
					return nil, err
				}
				return nil, m.charge(int64(strLen(l)+strLen(r)), "string concatenation")
			case "in":
				steps := int64(1)
				if isArray(r) {
					steps += int64(length(r)) / 2
				}
				return nil, m.step(steps)
			case "matches":
				if p, ok := r.(string); ok && len(p) > MaxPatternBytes {
					return nil, m.fail(&LimitError{Limit: "pattern size", Bound: fmt.Sprintf("%d bytes", MaxPatternBytes), What: fmt.Sprintf("a %d-byte pattern", len(p))})
				}
				// Matching is linear in the text times the pattern.
				return nil, m.step(1 + int64(strLen(l))*int64(max(strLen(r), 1))/8)
			default: // contains, startsWith, endsWith
				return nil, m.step(1 + int64(strLen(l))/1024)
			}
		}),
	)
}

// faster are implementations of builtins for the common shapes of their
// arguments, where expr-lang's walks every element through reflection:
// concat of two 1M-element arrays took 150 ms that way (700 ms under the
// race detector), in one step the meter cannot interrupt. ok false means
// "not this shape": expr-lang's implementation runs.
var faster = map[string]func(args []any) (out any, ok bool){
	"concat": func(args []any) (any, bool) {
		n := 0
		for _, a := range args {
			x, ok := a.([]any)
			if !ok {
				return nil, false
			}
			n += len(x)
		}
		out := make([]any, 0, n)
		for _, a := range args {
			out = append(out, a.([]any)...)
		}
		return out, true
	},
}

func fallback(f func([]any) (any, bool), impl func(...any) (any, error)) func(...any) (any, error) {
	return func(args ...any) (any, error) {
		if out, ok := f(args); ok {
			return out, nil
		}
		return impl(args...)
	}
}

func implementation(b *builtin.Function) func(args ...any) (any, error) {
	switch {
	case b.Func != nil:
		return b.Func
	case b.Safe != nil:
		return func(args ...any) (any, error) {
			out, _, err := b.Safe(args...)
			return out, err
		}
	case b.Fast != nil:
		return func(args ...any) (any, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("invalid number of arguments for %s (expected 1, got %d)", b.Name, len(args))
			}
			return b.Fast(args[0]), nil
		}
	}
	panic("sandbox: builtin " + b.Name + " has no implementation")
}

func arg(a []any, i int) any {
	if i < len(a) {
		return a[i]
	}
	return nil
}

func strLen(v any) int {
	s, _ := v.(string)
	return len(s)
}

func isArray(v any) bool {
	if v == nil {
		return false
	}
	k := reflect.TypeOf(v).Kind()
	return k == reflect.Slice || k == reflect.Array
}

// length is the number of elements of an array or map, or bytes of a string.
func length(v any) int {
	switch x := v.(type) {
	case nil:
		return 0
	case string:
		return len(x)
	case []any:
		return len(x)
	case map[string]any:
		return len(x)
	}
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Slice, reflect.Array, reflect.Map, reflect.String:
		return r.Len()
	}
	return 0
}

// forEach calls f on each element of an array until f returns false.
func forEach(v any, f func(any) bool) {
	switch x := v.(type) {
	case []any:
		for _, e := range x {
			if !f(e) {
				return
			}
		}
		return
	case []string:
		for _, e := range x {
			if !f(e) {
				return
			}
		}
		return
	}
	if !isArray(v) {
		return
	}
	r := reflect.ValueOf(v)
	for i := range r.Len() {
		if !f(r.Index(i).Interface()) {
			return
		}
	}
}

// textBound is an upper bound of the bytes of v printed as JSON indented
// by two spaces (toJSON) or with %v (string()). A value may hold the same
// large string many times ([s, s, s]), so the size is that of the output,
// not of what v holds; the walk stops once it passes MaxBytes, so it costs
// at most MaxBytes/8 visits.
func textBound(v any, json bool) int64 {
	var n int64
	var walk func(r reflect.Value, depth int64) bool
	walk = func(r reflect.Value, depth int64) bool {
		// Per value: separators, a newline and the indentation before it.
		n += 8
		if json {
			n += 2 * depth
		}
		if n > MaxBytes {
			return false
		}
		if !r.IsValid() {
			return true
		}
		switch r.Kind() {
		case reflect.String:
			if json {
				n += 6 * int64(r.Len()) // \u00XX for each control byte
			} else {
				n += int64(r.Len())
			}
		case reflect.Slice, reflect.Array:
			if r.Type().Elem().Kind() == reflect.Uint8 {
				n += 2 * int64(r.Len()) // []byte: base64 in JSON, numbers with %v ≤ 4/byte
				n += 2 * int64(r.Len())
				break
			}
			for i := range r.Len() {
				if !walk(r.Index(i), depth+1) {
					return false
				}
			}
		case reflect.Map:
			it := r.MapRange()
			for it.Next() {
				if !walk(it.Key(), depth+1) || !walk(it.Value(), depth+1) {
					return false
				}
			}
		case reflect.Interface, reflect.Pointer:
			if !r.IsNil() {
				return walk(r.Elem(), depth)
			}
		case reflect.Struct:
			if r.Type() == reflect.TypeOf(time.Time{}) {
				n += 64
				break
			}
			for i := range r.NumField() {
				n += int64(len(r.Type().Field(i).Name))
				if !walk(r.Field(i), depth+1) {
					return false
				}
			}
		default:
			n += 32 // numbers, bools, nil: "-1.2345678901234567e-308"
		}
		return n <= MaxBytes
	}
	walk(reflect.ValueOf(v), 0)
	return n
}
