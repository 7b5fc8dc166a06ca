package openapi

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// maxRefDepth is how many $refs deep a schema is inlined; a ref deeper
// than that becomes an open schema, as a cyclic or remote one does. Three
// levels carry the shapes callers fill in (an object, its parts, their
// parts); an operation whose schema would pass its budget at three levels
// is inlined fewer (see buildWithin).
const maxRefDepth = 3

// resolver inlines local refs of one document, parsed as generic JSON.
type resolver struct {
	root any
}

// pointer returns the value at a local ref ("#/components/schemas/Pet")
// and whether there is one. Remote refs (anything not starting with "#/")
// are not followed.
func (r resolver) pointer(ref string) (any, bool) {
	if ref == "#" {
		return r.root, true
	}
	if !strings.HasPrefix(ref, "#/") {
		return nil, false
	}
	frag, err := url.PathUnescape(ref[2:])
	if err != nil {
		return nil, false
	}
	cur := r.root
	for _, tok := range strings.Split(frag, "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return nil, false
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(v) {
				return nil, false
			}
			cur = v[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

// deref follows the $ref of a non-schema object (a parameter, a request
// body), through chains of refs. ok is false when a ref does not resolve
// or loops.
func (r resolver) deref(v any) (map[string]any, bool) {
	seen := map[string]bool{}
	for {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		ref, isRef := m["$ref"].(string)
		if !isRef {
			return m, true
		}
		if seen[ref] {
			return nil, false
		}
		seen[ref] = true
		if v, ok = r.pointer(ref); !ok {
			return nil, false
		}
	}
}

// schemaKeys name the keywords whose value is one schema; schemaMapKeys
// those whose value maps names to schemas; schemaListKeys those whose value
// is a list of schemas.
var (
	schemaKeys     = []string{"items", "additionalProperties", "not", "contains", "if", "then", "else", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "additionalItems"}
	schemaMapKeys  = []string{"properties", "patternProperties", "dependentSchemas"}
	schemaListKeys = []string{"allOf", "anyOf", "oneOf", "prefixItems"}
	// droppedKeys are OpenAPI annotations that mean nothing to a JSON
	// Schema validator, or identifiers that would change how the inlined
	// schema's refs resolve.
	droppedKeys = []string{"example", "xml", "discriminator", "externalDocs", "nullable", "$id", "$schema", "$anchor", "$dynamicAnchor", "$dynamicRef", "$defs", "definitions", "$comment"}
)

// schema turns an OpenAPI schema into a self-contained JSON Schema (draft
// 2020-12, what gate 2 validates with): local refs are inlined up to
// e.maxDepth levels, cyclic, remote, unresolvable or deeper refs become
// the open schema {}, and the OpenAPI 3.0 dialect (nullable, boolean
// exclusiveMinimum/exclusiveMaximum) is rewritten in 2020-12 terms. OpenAPI
// 3.1 schemas (type lists with "null", const, …) pass as they are.
//
// Everything it produces is counted against e's budget; once over, it
// returns open schemas without looking further.
func (e *expansion) schema(v any, depth int, stack []string) any {
	if e.over() {
		return map[string]any{}
	}
	switch s := v.(type) {
	case bool:
		e.add(1, 5)
		return s
	case map[string]any:
		if ref, ok := s["$ref"].(string); ok {
			return e.ref(s, ref, depth, stack)
		}
		e.add(1, 2)
		out := make(map[string]any, len(s))
		for k, val := range s {
			if slices.Contains(droppedKeys, k) {
				continue
			}
			e.add(0, int64(len(k))+4)
			if !e.sub(out, k, val, depth, stack) {
				out[k] = val
				e.count(val)
			}
		}
		for _, pair := range [][2]string{{"exclusiveMinimum", "minimum"}, {"exclusiveMaximum", "maximum"}} {
			excl, bound := pair[0], pair[1]
			if b, ok := out[excl].(bool); ok {
				// 3.0: a boolean that makes the bound exclusive.
				delete(out, excl)
				if lim, ok := out[bound]; ok && b {
					out[excl] = lim
					delete(out, bound)
				}
			}
		}
		if s["nullable"] == true {
			e.add(3, 24)
			return orNull(out)
		}
		return out
	default:
		e.add(1, 2)
		return map[string]any{}
	}
}

// ref inlines the target of a $ref at depth, or leaves it open.
func (e *expansion) ref(s map[string]any, ref string, depth int, stack []string) any {
	if depth >= e.maxDepth || slices.Contains(stack, ref) {
		e.add(1, 2)
		return map[string]any{}
	}
	target, ok := e.r.pointer(ref)
	if !ok {
		e.add(1, 2)
		return map[string]any{}
	}
	out := e.schema(target, depth+1, append(stack, ref))
	// A description beside the ref (allowed in 3.1) says more about this
	// use than the target's does.
	if d, ok := s["description"].(string); ok {
		if m, ok := out.(map[string]any); ok {
			m = cloneMap(m)
			m["description"] = d
			e.add(1, int64(len(d))+17)
			return m
		}
	}
	return out
}

// sub converts the value of keyword k when it holds schemas, into out; it
// reports false for any other keyword (or a schema keyword of the wrong
// shape), which the caller copies as it is.
func (e *expansion) sub(out map[string]any, k string, val any, depth int, stack []string) bool {
	switch {
	case slices.Contains(schemaKeys, k):
		if list, ok := val.([]any); ok && k == "items" { // 3.0-era tuple form
			out[k] = e.schemaList(list, depth, stack)
			return true
		}
		out[k] = e.schema(val, depth, stack)
		return true
	case slices.Contains(schemaMapKeys, k):
		m, ok := val.(map[string]any)
		if !ok {
			return false
		}
		e.add(1, 2)
		sub := make(map[string]any, len(m))
		for name, x := range m {
			e.add(0, int64(len(name))+4)
			sub[name] = e.schema(x, depth, stack)
		}
		out[k] = sub
		return true
	case slices.Contains(schemaListKeys, k):
		list, ok := val.([]any)
		if !ok {
			return false
		}
		out[k] = e.schemaList(list, depth, stack)
		return true
	}
	return false
}

func (e *expansion) schemaList(list []any, depth int, stack []string) []any {
	e.add(1, 2)
	out := make([]any, len(list))
	for i, sub := range list {
		e.add(0, 1)
		out[i] = e.schema(sub, depth, stack)
	}
	return out
}

// orNull makes a schema admit null (3.0's nullable: true): its type gains
// "null"; one without a type but with oneOf/anyOf/allOf (GitHub's
// milestone: string or integer) becomes {anyOf: [it, {type: null}]}, since
// its branches would refuse null; any other already admits it.
func orNull(s map[string]any) map[string]any {
	if t, ok := s["type"]; ok {
		s["type"] = withNull(t)
		return s
	}
	for _, k := range []string{"oneOf", "anyOf", "allOf"} {
		if _, ok := s[k]; ok {
			return map[string]any{"anyOf": []any{s, map[string]any{"type": "null"}}}
		}
	}
	return s
}

// withNull adds "null" to a type keyword.
func withNull(t any) any {
	switch t := t.(type) {
	case string:
		if t == "null" {
			return t
		}
		return []any{t, "null"}
	case []any:
		if slices.Contains(t, any("null")) {
			return t
		}
		return append(slices.Clone(t), "null")
	default:
		return t
	}
}

func cloneMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
