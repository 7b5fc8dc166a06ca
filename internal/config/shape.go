package config

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

var fileType = reflect.TypeFor[File]()

// scalarForm is implemented by types that also take a plain word in place
// of their mapping (auth: oauth).
type scalarForm interface{ acceptsScalar() }

var scalarFormType = reflect.TypeFor[scalarForm]()

// maxCheckNodes bounds the shape check, which follows aliases: a file of
// nested aliases ("billion laughs") must not make it run for ever. The
// decoder has its own guard and reports such a file itself.
const maxCheckNodes = 100_000

// checker walks a YAML node tree alongside the Go type it will decode into
// and reports, with paths, what the decoder would refuse: unknown fields,
// duplicate keys and values of the wrong kind.
type checker struct {
	ps     *problems
	budget int
}

func (k *checker) walk(n *yaml.Node, t reflect.Type, path string) {
	if k.budget--; k.budget < 0 {
		return
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) > 0 {
			k.walk(n.Content[0], t, path)
		}
		return
	case yaml.AliasNode:
		if n.Alias != nil {
			k.walk(n.Alias, t, path)
		}
		return
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return // null decodes to the zero value of anything
		}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.ScalarNode && reflect.PointerTo(t).Implements(scalarFormType) {
		return // a word in place of the mapping; Validate checks which
	}
	switch t.Kind() {
	case reflect.Interface:
		return // any: anything goes
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			k.wrongKind(n, t, path)
			return
		}
		fields := yamlFields(t)
		k.pairs(n, t, path, func(key, val *yaml.Node, p string) {
			ft, ok := fields[key.Value]
			if !ok {
				k.ps.add(p, "unknown field (line %d); expected one of: %s", key.Line, strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
				return
			}
			k.walk(val, ft, p)
		})
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			k.wrongKind(n, t, path)
			return
		}
		k.pairs(n, t, path, func(_, val *yaml.Node, p string) { k.walk(val, t.Elem(), p) })
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			k.wrongKind(n, t, path)
			return
		}
		for i, c := range n.Content {
			k.walk(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	default:
		if n.Kind != yaml.ScalarNode || n.Decode(reflect.New(t).Interface()) != nil {
			k.wrongKind(n, t, path)
		}
	}
}

// pairs calls each for every key of mapping n, after handling merge keys
// (<<: *anchor, checked as part of the same mapping) and duplicate keys.
func (k *checker) pairs(n *yaml.Node, t reflect.Type, path string, each func(key, val *yaml.Node, p string)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if isMergeKey(key) {
			if val.Kind == yaml.SequenceNode {
				for _, m := range val.Content {
					k.walk(m, t, path)
				}
			} else {
				k.walk(val, t, path)
			}
			continue
		}
		if key.Kind != yaml.ScalarNode {
			k.ps.add(path, "keys must be plain strings (line %d)", key.Line)
			continue
		}
		p := key.Value
		if path != "" {
			p = path + "." + key.Value
		}
		if first, dup := seen[key.Value]; dup {
			k.ps.add(p, "is given twice (lines %d and %d)", first, key.Line)
			continue
		}
		seen[key.Value] = key.Line
		each(key, val, p)
	}
}

func isMergeKey(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Value == "<<" && (n.Tag == "" || n.Tag == "!" || n.ShortTag() == "!!merge")
}

func (k *checker) wrongKind(n *yaml.Node, t reflect.Type, path string) {
	var want string
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		want = "a mapping"
	case reflect.Slice, reflect.Array:
		want = "a list"
	case reflect.Bool:
		want = "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "a whole number"
	case reflect.Float32, reflect.Float64:
		want = "a number"
	case reflect.String:
		want = "a string"
	default:
		want = "a " + t.String()
	}
	// The value itself is not quoted: it may be a credential.
	k.ps.add(path, "must be %s, not %s (line %d)", want, describeNode(n), n.Line)
}

func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.ShortTag() {
	case "!!int":
		return "a whole number"
	case "!!float":
		return "a number"
	case "!!bool":
		return "true or false"
	case "!!str":
		return "a string"
	}
	return "a " + strings.TrimPrefix(n.ShortTag(), "!!")
}

// yamlFields maps the yaml names of t's fields, as yaml.v3 derives them,
// to their types. Inline structs contribute their fields.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if slices.Contains(strings.Split(opts, ","), "inline") && f.Type.Kind() == reflect.Struct {
			for n, ft := range yamlFields(f.Type) {
				out[n] = ft
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}
