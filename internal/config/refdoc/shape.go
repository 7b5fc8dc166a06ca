package main

import (
	"fmt"
	"go/ast"
	"strings"
)

// kind is what a value is in the file: the YAML shape a Go type decodes.
type kind int

const (
	scalarKind kind = iota
	structKind
	listKind
	mapKind
	anyKind
)

// shape is a field's type resolved through pointers and the package's
// named types.
type shape struct {
	kind   kind
	scalar string // scalarKind: string, integer, number, boolean, duration, JSON
	name   string // structKind: the struct type's name
	word   bool   // structKind: the type also takes a plain word for the mapping
	elem   *shape // listKind, mapKind
}

// scalars names the Go types a YAML or environment value is read as.
var scalars = map[string]string{
	"string": "string", "bool": "boolean",
	"int": "integer", "int8": "integer", "int16": "integer", "int32": "integer", "int64": "integer",
	"uint": "integer", "uint8": "integer", "uint16": "integer", "uint32": "integer", "uint64": "integer",
	"float32": "number", "float64": "number",
	"time.Duration":   "duration",
	"json.RawMessage": "JSON",
	"netip.Prefix":    "CIDR",
	"netip.Addr":      "IP address",
}

// wordMethod marks a struct type that also takes a plain word in place of
// its mapping (the file's auth: oauth); the shape check in package config
// keys on the same method.
const wordMethod = "acceptsScalar"

// resolve turns a field's type expression into its shape.
func (p *pkg) resolve(e ast.Expr) (*shape, error) {
	switch t := e.(type) {
	case *ast.StarExpr:
		return p.resolve(t.X)
	case *ast.ArrayType:
		el, err := p.resolve(t.Elt)
		if err != nil {
			return nil, err
		}
		return &shape{kind: listKind, elem: el}, nil
	case *ast.MapType:
		el, err := p.resolve(t.Value)
		if err != nil {
			return nil, err
		}
		return &shape{kind: mapKind, elem: el}, nil
	case *ast.InterfaceType:
		return &shape{kind: anyKind}, nil
	case *ast.StructType:
		return nil, fmt.Errorf("refdoc: %s: an anonymous struct has no name or doc comment for the reference; declare it as a type", p.fset.Position(e.Pos()))
	case *ast.SelectorExpr:
		if x, ok := t.X.(*ast.Ident); ok {
			if s, ok := scalars[x.Name+"."+t.Sel.Name]; ok {
				return &shape{kind: scalarKind, scalar: s}, nil
			}
		}
	case *ast.Ident:
		return p.resolveName(t.Name)
	}
	return nil, fmt.Errorf("refdoc: %s: type %s has no place in the reference; add it to refdoc's scalars", p.fset.Position(e.Pos()), exprString(e))
}

func (p *pkg) resolveName(name string) (*shape, error) {
	if name == "any" {
		return &shape{kind: anyKind}, nil
	}
	if s, ok := scalars[name]; ok {
		return &shape{kind: scalarKind, scalar: s}, nil
	}
	d, ok := p.types[name]
	if !ok {
		return nil, fmt.Errorf("refdoc: unknown type %s", name)
	}
	if _, ok := d.spec.Type.(*ast.StructType); ok {
		return &shape{kind: structKind, name: name, word: p.hasMethod(name, wordMethod)}, nil
	}
	return p.resolve(d.spec.Type) // a named map or scalar: its underlying type
}

// inner is the struct a shape holds, through lists and maps; nil when it
// holds none.
func (s *shape) inner() *shape {
	for s != nil && (s.kind == listKind || s.kind == mapKind) {
		s = s.elem
	}
	if s == nil || s.kind != structKind {
		return nil
	}
	return s
}

// suffix is what a key path adds to reach the struct inside: <name> for
// each map, [] for each list.
func (s *shape) suffix() string {
	var b strings.Builder
	for ; s != nil; s = s.elem {
		switch s.kind {
		case mapKind:
			b.WriteString(".<name>")
		case listKind:
			b.WriteString("[]")
		}
	}
	return b.String()
}

// fileType names the shape as a config file's reader thinks of it.
func (s *shape) fileType() string {
	switch s.kind {
	case structKind:
		if s.word {
			return "string or mapping"
		}
		return "mapping"
	case listKind:
		return "list of " + group(s.elem.fileType())
	case mapKind:
		return "map of " + group(s.elem.fileType())
	case anyKind:
		return "any"
	}
	return s.scalar
}

// envType names the shape as an environment value is written.
func (s *shape) envType() string {
	switch s.kind {
	case listKind:
		return "comma-separated list"
	case scalarKind:
		return s.scalar
	}
	return "string"
}

// group parenthesizes an alternative inside a longer type name.
func group(s string) string {
	if strings.Contains(s, " or ") {
		return "(" + s + ")"
	}
	return s
}

func exprString(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.SelectorExpr:
		return exprString(t.X) + "." + t.Sel.Name
	case *ast.StarExpr:
		return "*" + exprString(t.X)
	case *ast.ArrayType:
		return "[]" + exprString(t.Elt)
	case *ast.MapType:
		return "map[" + exprString(t.Key) + "]" + exprString(t.Value)
	}
	return fmt.Sprintf("%T", e)
}
