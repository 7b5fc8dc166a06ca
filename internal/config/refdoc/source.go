package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// pkg is the config package as its source declares it: what the reference
// is generated from, so that it says what the code says.
type pkg struct {
	fset    *token.FileSet
	types   map[string]*typeDecl
	methods map[string][]string // receiver type name → its method names
}

// typeDecl is one declared type with its doc comment (on the spec, or on
// the declaration when the spec stands alone).
type typeDecl struct {
	spec *ast.TypeSpec
	doc  string
}

// field is one struct field as the reference needs it.
type field struct {
	name   string   // the Go name
	typ    ast.Expr // as written
	doc    string   // the doc comment above it, "" when none
	line   string   // the comment after it on its line, "" when none
	key    string   // the yaml key: the tag's name, else the name lowercased
	skip   bool     // yaml:"-"
	inline bool     // yaml:",inline"
	first  int      // the lines it spans, to tell a group of fields that
	last   int      // one comment documents from unrelated ones
}

// loadPkg parses the non-test Go files of dir, in name order so that the
// output does not depend on the directory's order.
func loadPkg(dir string) (*pkg, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, fmt.Errorf("refdoc: list %s: %w", dir, err)
	}
	slices.Sort(files)
	p := &pkg{fset: token.NewFileSet(), types: map[string]*typeDecl{}, methods: map[string][]string{}}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(p.fset, name, nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("refdoc: parse: %w", err)
		}
		p.add(f)
	}
	if len(p.types) == 0 {
		return nil, fmt.Errorf("refdoc: no type declarations in %s", dir)
	}
	return p, nil
}

func (p *pkg) add(f *ast.File) {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.GenDecl:
			for _, s := range d.Specs {
				ts, ok := s.(*ast.TypeSpec)
				if !ok {
					continue
				}
				doc := ts.Doc
				if doc == nil && len(d.Specs) == 1 {
					doc = d.Doc
				}
				p.types[ts.Name.Name] = &typeDecl{spec: ts, doc: doc.Text()}
			}
		case *ast.FuncDecl:
			if recv := receiverName(d); recv != "" {
				p.methods[recv] = append(p.methods[recv], d.Name.Name)
			}
		}
	}
}

// receiverName is the base type name of a method's receiver, "" for a
// function.
func receiverName(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return ""
	}
	t := d.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// hasMethod reports whether the package declares method m on type name.
func (p *pkg) hasMethod(name, m string) bool {
	return slices.Contains(p.methods[name], m)
}

// structType returns the named struct type's declaration and fields.
func (p *pkg) structType(name string) (*typeDecl, *ast.StructType, error) {
	d, ok := p.types[name]
	if !ok {
		return nil, nil, fmt.Errorf("refdoc: no type %s", name)
	}
	st, ok := d.spec.Type.(*ast.StructType)
	if !ok {
		return nil, nil, fmt.Errorf("refdoc: %s is not a struct", name)
	}
	return d, st, nil
}

// fields lists a struct's exported fields in source order. A field that
// shares its line with others (A, B int) gets one entry per name.
func (p *pkg) fields(st *ast.StructType) ([]field, error) {
	var out []field
	for _, f := range st.Fields.List {
		if len(f.Names) == 0 {
			return nil, fmt.Errorf("refdoc: %s: embedded fields are not supported", p.fset.Position(f.Pos()))
		}
		key, skip, inline, err := yamlTag(f.Tag)
		if err != nil {
			return nil, fmt.Errorf("refdoc: %s: %w", p.fset.Position(f.Pos()), err)
		}
		for _, n := range f.Names {
			if !n.IsExported() {
				continue
			}
			k := key
			if k == "" {
				k = strings.ToLower(n.Name) // as yaml.v3 names an untagged field
			}
			out = append(out, field{
				name: n.Name, typ: f.Type, doc: f.Doc.Text(), line: f.Comment.Text(),
				key: k, skip: skip, inline: inline,
				first: p.fset.Position(f.Pos()).Line, last: p.fset.Position(f.End()).Line,
			})
		}
	}
	return out, nil
}

// yamlTag reads a field's yaml tag: its key and whether it is left out
// (-) or inlined.
func yamlTag(lit *ast.BasicLit) (key string, skip, inline bool, err error) {
	if lit == nil {
		return "", false, false, nil
	}
	raw, err := strconv.Unquote(lit.Value)
	if err != nil {
		return "", false, false, fmt.Errorf("tag %s: %w", lit.Value, err)
	}
	tag, ok := reflect.StructTag(raw).Lookup("yaml")
	if !ok {
		return "", false, false, nil
	}
	if tag == "-" {
		return "", true, false, nil
	}
	name, opts, _ := strings.Cut(tag, ",")
	return name, false, slices.Contains(strings.Split(opts, ","), "inline"), nil
}

// oneLine joins a comment's lines into one, for a table cell.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
