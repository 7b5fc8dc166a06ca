package gates

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// The JSON Schema compiler gate 2 uses looks up every subschema it queues
// in a list of those queued so far, so compiling a schema costs the
// square of its subschemas. A schema whose $refs were inlined (an OpenAPI
// operation's, a tool's from a server that inlines) repeats the same
// subschemas over and over: three levels of 20 properties that $ref the
// same thing are 8,000 subschemas and took 1.4 s, 40 took a minute. Shared
// (each distinct subschema once under $defs, $ref'd where it occurred),
// they are a few dozen, compiled in milliseconds.

// shareAbove is how many JSON values a schema must have before its
// repeated subschemas are shared: smaller ones compile fast as given, and
// keep the locations their validation errors name.
const shareAbove = 1000

// sharedPrefix names the $defs entries sharing adds.
const sharedPrefix = "pb.shared."

// Keywords whose values are subschemas (JSON Schema 2020-12 and 2019-09,
// and draft 7's forms): one schema, a map of names to schemas, a list.
var (
	subschemaKeys     = []string{"items", "additionalItems", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contentSchema"}
	subschemaMapKeys  = []string{"properties", "patternProperties", "dependentSchemas", "$defs", "definitions"}
	subschemaListKeys = []string{"allOf", "anyOf", "oneOf", "prefixItems", "items"}
	// locationKeys change what a ref in the schema means, or are refs: a
	// schema with any of them is compiled as given, since moving its
	// subschemas could change what they resolve to.
	locationKeys = []string{"$ref", "$dynamicRef", "$recursiveRef", "$id", "$anchor", "$dynamicAnchor", "$recursiveAnchor", "$schema"}
)

// countValues is how many JSON values v holds (objects, arrays and
// scalars, itself included).
func countValues(v any) int {
	n := 1
	switch v := v.(type) {
	case map[string]any:
		for _, x := range v {
			n += countValues(x)
		}
	case []any:
		for _, x := range v {
			n += countValues(x)
		}
	}
	return n
}

// shareSubschemas returns schema with every object subschema of three or
// more values that occurs more than once moved to $defs and $ref'd where
// it was, and the values the result holds. ok is false (and schema is to
// be compiled as given) when it is not an object, declares a $schema
// other than 2020-12 or 2019-09 (older drafts ignore a $ref's siblings and
// know no $defs), or holds refs or identifiers anywhere below its root.
func shareSubschemas(schema any) (out any, values int, ok bool) {
	root, isMap := schema.(map[string]any)
	if !isMap || !shareable(root) {
		return schema, 0, false
	}
	s := &sharer{ids: map[string]int{}, of: map[uintptr]int{}}
	rootID := s.intern(root)
	used := map[int]bool{}
	for id, n := range s.count {
		if n > 1 && s.size[id] >= 3 && id != rootID {
			used[id] = true
		}
	}
	if len(used) == 0 {
		return schema, 0, false
	}
	s.shared = used
	s.defs = map[string]any{}
	top := s.rebuild(root, true).(map[string]any)
	defs, _ := top["$defs"].(map[string]any)
	merged := make(map[string]any, len(defs)+len(s.defs))
	for k, v := range defs {
		merged[k] = v
	}
	for k, v := range s.defs {
		merged[k] = v
	}
	top["$defs"] = merged
	return top, countValues(top), true
}

// shareable reports whether root may have its subschemas moved: see
// shareSubschemas.
func shareable(root map[string]any) bool {
	if v, ok := root["$schema"]; ok {
		uri, _ := v.(string)
		uri = strings.TrimSuffix(uri, "#")
		if uri != "https://json-schema.org/draft/2020-12/schema" && uri != "https://json-schema.org/draft/2019-09/schema" {
			return false
		}
	}
	if d, ok := root["$defs"]; ok {
		defs, isMap := d.(map[string]any)
		if !isMap {
			return false
		}
		for k := range defs {
			if strings.HasPrefix(k, sharedPrefix) {
				return false
			}
		}
	}
	for k, v := range root {
		if k != "$schema" && slices.Contains(locationKeys, k) {
			return false
		}
		if !noLocations(v) {
			return false
		}
	}
	return true
}

// noLocations reports whether no object in v has a location keyword (a
// property named "$ref" counts too: being cautious costs only speed).
func noLocations(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if slices.Contains(locationKeys, k) || !noLocations(x) {
				return false
			}
		}
	case []any:
		for _, x := range v {
			if !noLocations(x) {
				return false
			}
		}
	}
	return true
}

// sharer numbers the distinct object subschemas of one schema.
type sharer struct {
	ids    map[string]int  // canonical form → id
	of     map[uintptr]int // each object subschema (its map) → its id
	count  []int           // id → occurrences
	size   []int           // id → values in the subschema
	shared map[int]bool    // ids moved to $defs
	defs   map[string]any  // what rebuild put in $defs
}

// intern numbers an object subschema by its canonical form: its keys in
// order, each with the id of a subschema value or the JSON of any other.
// Equal subschemas get one id, so the work is linear in the schema.
func (s *sharer) intern(m map[string]any) int {
	var b strings.Builder
	size := 1
	for _, k := range slices.Sorted(maps.Keys(m)) {
		b.WriteString(strconv.Quote(k))
		b.WriteByte(':')
		size += s.canon(&b, k, m[k])
		b.WriteByte(',')
	}
	key := b.String()
	id, ok := s.ids[key]
	if !ok {
		id = len(s.count)
		s.ids[key] = id
		s.count = append(s.count, 0)
		s.size = append(s.size, size)
	}
	s.count[id]++
	s.of[reflect.ValueOf(m).Pointer()] = id
	return id
}

// canon writes the canonical form of keyword k's value and returns how
// many values it holds.
func (s *sharer) canon(b *strings.Builder, k string, v any) int {
	sub := func(x any) int {
		if m, ok := x.(map[string]any); ok {
			id := s.intern(m)
			b.WriteString("#" + strconv.Itoa(id))
			return s.size[id]
		}
		data, _ := json.Marshal(x)
		b.Write(data)
		return countValues(x)
	}
	switch {
	case slices.Contains(subschemaMapKeys, k):
		if m, ok := v.(map[string]any); ok {
			b.WriteByte('{')
			n := 1
			for _, name := range slices.Sorted(maps.Keys(m)) {
				b.WriteString(strconv.Quote(name) + ":")
				n += sub(m[name])
				b.WriteByte(',')
			}
			b.WriteByte('}')
			return n
		}
	case slices.Contains(subschemaListKeys, k):
		if list, ok := v.([]any); ok {
			b.WriteByte('[')
			n := 1
			for _, x := range list {
				n += sub(x)
				b.WriteByte(',')
			}
			b.WriteByte(']')
			return n
		}
	}
	if slices.Contains(subschemaKeys, k) {
		return sub(v)
	}
	data, _ := json.Marshal(v)
	b.Write(data)
	return countValues(v)
}

// rebuild copies a subschema with its shared subschemas replaced by refs
// (and put in s.defs once each).
func (s *sharer) rebuild(v any, root bool) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	if id, found := s.of[reflect.ValueOf(m).Pointer()]; found && !root && s.shared[id] {
		name := sharedPrefix + strconv.Itoa(id)
		if _, done := s.defs[name]; !done {
			s.defs[name] = s.copyWith(m)
		}
		return map[string]any{"$ref": "#/$defs/" + name}
	}
	return s.copyWith(m)
}

// copyWith copies m, rebuilding the subschemas of its keywords.
func (s *sharer) copyWith(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, x := range m {
		switch {
		case slices.Contains(subschemaMapKeys, k):
			if sub, ok := x.(map[string]any); ok {
				cp := make(map[string]any, len(sub))
				for name, y := range sub {
					cp[name] = s.rebuild(y, false)
				}
				out[k] = cp
				continue
			}
		case slices.Contains(subschemaListKeys, k):
			if list, ok := x.([]any); ok {
				cp := make([]any, len(list))
				for i, y := range list {
					cp[i] = s.rebuild(y, false)
				}
				out[k] = cp
				continue
			}
		}
		if slices.Contains(subschemaKeys, k) {
			out[k] = s.rebuild(x, false)
			continue
		}
		out[k] = x
	}
	return out
}
