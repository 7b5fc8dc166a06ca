package openapi

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// methods are the HTTP methods an OpenAPI path item may hold, in the order
// operations are listed.
var methods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// bodyArg is the argument a JSON request body goes under when it cannot be
// merged into the top level (see operation.bodyMode).
const bodyArg = "body"

// Body modes: how an operation's JSON request body appears in its input.
const (
	bodyNone    = iota
	bodyMerged  // the body's properties sit beside the parameters
	bodyWrapped // the whole body is the "body" argument
)

// param is one parameter an operation sends.
type param struct {
	Name    string
	In      string // path, query or header
	Explode bool   // query arrays and objects: repeat the key (form, explode)
}

// operation is one path × method of the document, with what a call needs
// to turn arguments into a request.
type operation struct {
	Name     string
	Method   string // upper case
	Path     string // the template, "/pets/{petId}"
	Tags     []string
	Params   []param
	BodyMode int
	Spec     connect.Operation
}

// parseOperations lists the document's operations, those sel selects
// when it is not nil, each built within b (see buildWithin). unmatched are
// the include entries that selected nothing; reduced maps the operations
// whose refs were inlined less than maxRefDepth deep to the depth used.
func parseOperations(ctx context.Context, root map[string]any, sel *selector, b budget) (ops []operation, unmatched []string, reduced map[string]int, err error) {
	r := resolver{root: root}
	paths, ok := root["paths"].(map[string]any)
	if !ok && root["paths"] != nil {
		return nil, nil, nil, fmt.Errorf("paths is not an object")
	}
	taken := map[string]bool{}
	var manifest int64
	for _, path := range slices.Sorted(maps.Keys(paths)) {
		item, ok := r.deref(paths[path])
		if !ok {
			continue
		}
		for _, method := range methods {
			raw, ok := item[method].(map[string]any)
			if !ok {
				continue
			}
			id, _ := raw["operationId"].(string)
			tags := stringList(raw["tags"])
			if sel != nil {
				hit, err := sel.match(ctx, id, strings.ToUpper(method), path, tags)
				if err != nil {
					return nil, nil, nil, err
				}
				if !hit {
					continue
				}
			}
			if len(ops) == b.operations {
				return nil, nil, nil, &BudgetError{What: "more operations than that,", Setting: "maxOperations", Limit: int64(b.operations),
					Hint: "choose some with include"}
			}
			if err := ctx.Err(); err != nil {
				return nil, nil, nil, fmt.Errorf("building the operations (timeoutMs bounds the load): %w", err)
			}
			name := id
			if name == "" {
				name = builtName(method, path)
			}
			// Two operations with one name (a document that repeats an
			// operationId, or built names that meet) stay apart.
			base := name
			for n := 2; taken[name]; n++ {
				name = fmt.Sprintf("%s_%d", base, n)
			}
			taken[name] = true
			op, depth, err := buildWithin(b, r, name, strings.ToUpper(method), path, tags, item, raw)
			if err != nil {
				return nil, nil, nil, err
			}
			if depth < maxRefDepth {
				if reduced == nil {
					reduced = map[string]int{}
				}
				reduced[name] = depth
			}
			manifest += int64(len(op.Name) + len(op.Path) + len(op.Spec.Description) + len(op.Spec.Annotations.Title) + len(op.Spec.InputSchema))
			if manifest > b.manifestBytes {
				return nil, nil, nil, &BudgetError{Op: name, What: "the operations up to this one,", Setting: "maxManifestBytes", Limit: b.manifestBytes,
					Hint: "choose fewer with include, or raise the limit"}
			}
			ops = append(ops, op)
		}
	}
	return ops, sel.unmatched(), reduced, nil
}

// buildWithin builds one operation with its refs inlined maxRefDepth
// levels deep, or as many fewer as it takes for its input schema to fit
// b; it fails, naming the operation and the limit, when even an input
// schema with no ref inlined does not. Each attempt stops as soon as it
// passes the budget, so the work is at most maxRefDepth+1 budgets.
func buildWithin(b budget, r resolver, name, method, path string, tags []string, item, raw map[string]any) (operation, int, error) {
	var last size
	for depth := maxRefDepth; depth >= 0; depth-- {
		e := &expansion{r: r, maxDepth: depth, limit: b}
		op, schema := buildOperation(e, name, method, path, tags, item, raw)
		if e.over() {
			last = e.used
			continue
		}
		// The count while expanding is close; these are exact.
		nodes := measure(schema)
		data := mustJSON(schema)
		if nodes > b.nodes || int64(len(data)) > b.bytes {
			last = size{nodes: nodes, bytes: int64(len(data))}
			continue
		}
		op.Spec.InputSchema = data
		return op, depth, nil
	}
	err := &BudgetError{Op: name, What: "input schema with no $ref inlined,", Setting: "maxSchemaNodes", Limit: b.nodes,
		Hint: "leave the operation out with include, or raise the limit"}
	if last.nodes <= b.nodes {
		err.Setting, err.Limit = "maxSchemaBytes", b.bytes
	}
	return operation{}, 0, err
}

var nonWord = regexp.MustCompile(`[^A-Za-z0-9]+`)

// builtName names an operation without an operationId after its method
// and path: GET /pets/{petId} is get_pets_petId.
func builtName(method, path string) string {
	rest := strings.Trim(nonWord.ReplaceAllString(path, "_"), "_")
	if rest == "" {
		return method
	}
	return method + "_" + rest
}

func stringList(v any) []string {
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// buildOperation builds the input schema of one operation: its path, query
// and header parameters (path-level ones included, the operation's own
// winning) and a JSON request body. An object body's properties are merged
// beside the parameters so callers (and models) write {"name": …} rather
// than {"body": {"name": …}}; a body that is not a plain object, or whose
// properties share a name with a parameter, goes whole under "body".
// The input schema is returned unmarshalled, for the caller to measure.
func buildOperation(e *expansion, name, method, path string, tags []string, item, raw map[string]any) (operation, map[string]any) {
	r := e.r
	op := operation{Name: name, Method: method, Path: path, Tags: tags}
	props := map[string]any{}
	var required []string

	byKey := map[string]map[string]any{}
	var order []string
	for _, list := range []any{item["parameters"], raw["parameters"]} {
		entries, _ := list.([]any)
		for _, e := range entries {
			p, ok := r.deref(e)
			if !ok {
				continue // unresolvable: left out
			}
			pname, _ := p["name"].(string)
			in, _ := p["in"].(string)
			if pname == "" || (in != "path" && in != "query" && in != "header") {
				continue // cookie parameters are left out
			}
			if in == "header" && isReservedHeader(pname) {
				continue // sent by patchbay itself
			}
			key := in + "\x00" + pname
			if _, ok := byKey[key]; !ok {
				order = append(order, key)
			}
			byKey[key] = p
		}
	}
	for _, key := range order {
		p := byKey[key]
		pname, _ := p["name"].(string)
		in, _ := p["in"].(string)
		if _, dup := props[pname]; dup {
			continue // a query and a header of one name: the first wins
		}
		explode := true
		if e, ok := p["explode"].(bool); ok {
			explode = e
		}
		op.Params = append(op.Params, param{Name: pname, In: in, Explode: explode})
		var s any = map[string]any{}
		if sch, ok := p["schema"]; ok {
			s = e.schema(sch, 0, nil)
		} else if content, ok := p["content"].(map[string]any); ok {
			for _, mt := range slices.Sorted(maps.Keys(content)) {
				if m, ok := content[mt].(map[string]any); ok {
					s = e.schema(m["schema"], 0, nil)
					break
				}
			}
		}
		if d, ok := p["description"].(string); ok {
			if m, ok := s.(map[string]any); ok {
				if _, has := m["description"]; !has {
					m = cloneMap(m)
					m["description"] = d
					e.add(1, int64(len(d))+17)
					s = m
				}
			}
		}
		e.add(0, int64(len(pname))+4)
		props[pname] = s
		if p["required"] == true || in == "path" {
			required = append(required, pname)
		}
	}

	schema := map[string]any{"type": "object"}
	additional := any(false)
	if body, ok := r.deref(raw["requestBody"]); ok {
		if bs, ok := jsonBodySchema(body); ok {
			bodySchema := e.schema(bs, 0, nil)
			bodyRequired := body["required"] == true
			if m, ok := mergeable(bodySchema, props); ok {
				op.BodyMode = bodyMerged
				bprops, _ := m["properties"].(map[string]any)
				for k, v := range bprops {
					props[k] = v
				}
				if bodyRequired {
					required = append(required, stringList(m["required"])...)
				}
				additional = true
				if a, ok := m["additionalProperties"]; ok {
					additional = a
				}
			} else if _, taken := props[bodyArg]; !taken {
				op.BodyMode = bodyWrapped
				props[bodyArg] = bodySchema
				if bodyRequired {
					required = append(required, bodyArg)
				}
			}
		}
	}
	schema["properties"] = props
	if len(required) > 0 {
		slices.Sort(required)
		schema["required"] = slices.Compact(required)
	}
	schema["additionalProperties"] = additional

	desc, _ := raw["summary"].(string)
	if d, ok := raw["description"].(string); ok && d != "" {
		if desc != "" && desc != d {
			desc += "\n\n" + d
		} else {
			desc = d
		}
	}
	op.Spec = connect.Operation{
		Name:        name,
		Description: cut(fmt.Sprintf("%s %s", method, path)+prefixed(desc), maxDescriptionBytes),
		Annotations: annotations(method, raw),
		HTTP:        &connect.HTTPRoute{Method: method, Path: path},
	}
	return op, schema
}

func prefixed(desc string) string {
	if desc == "" {
		return ""
	}
	return ": " + desc
}

// jsonBodySchema picks the schema of a JSON media type of a request body:
// application/json, or any +json type. A body with only other media types
// (forms, uploads) is not offered.
func jsonBodySchema(body map[string]any) (any, bool) {
	content, _ := body["content"].(map[string]any)
	for _, mt := range slices.Sorted(maps.Keys(content)) {
		base := strings.ToLower(strings.TrimSpace(strings.Split(mt, ";")[0]))
		if base == "application/json" || strings.HasSuffix(base, "+json") {
			m, _ := content[mt].(map[string]any)
			s, ok := m["schema"]
			if !ok {
				return map[string]any{}, true
			}
			return s, true
		}
	}
	return nil, false
}

// mergeable says whether a body schema is a plain object whose properties
// can sit beside the parameters: type object (or none) with properties, no
// combinators, and no property named like a parameter.
func mergeable(s any, params map[string]any) (map[string]any, bool) {
	m, ok := s.(map[string]any)
	if !ok {
		return nil, false
	}
	if t, ok := m["type"]; ok && t != "object" {
		return nil, false
	}
	props, ok := m["properties"].(map[string]any)
	if !ok {
		return nil, false
	}
	for _, k := range []string{"allOf", "anyOf", "oneOf", "not", "if", "patternProperties", "unevaluatedProperties"} {
		if _, has := m[k]; has {
			return nil, false
		}
	}
	for k := range props {
		if _, clash := params[k]; clash {
			return nil, false
		}
	}
	return m, true
}

// annotations derive MCP-style hints from the method's HTTP semantics, so
// policies and models treat a GET as a read and a DELETE as destructive.
func annotations(method string, raw map[string]any) connect.Annotations {
	yes, no := true, false
	a := connect.Annotations{}
	if s, ok := raw["summary"].(string); ok {
		a.Title = cut(s, maxTitleBytes)
	}
	switch method {
	case "GET", "HEAD", "OPTIONS":
		a.ReadOnlyHint = &yes
		a.IdempotentHint = &yes
	case "PUT":
		a.ReadOnlyHint, a.IdempotentHint = &no, &yes
	case "DELETE":
		a.ReadOnlyHint, a.DestructiveHint, a.IdempotentHint = &no, &yes, &yes
	default:
		a.ReadOnlyHint = &no
	}
	return a
}

// isReservedHeader names headers a parameter may not set: patchbay sends
// them itself (the body's type, the idempotency key) or they belong to
// the connection's credentials.
func isReservedHeader(name string) bool {
	switch strings.ToLower(name) {
	case "content-type", "accept", "authorization", "idempotency-key", "content-length", "host":
		return true
	}
	return false
}
