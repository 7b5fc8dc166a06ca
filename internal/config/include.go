package config

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/types"
	"gopkg.in/yaml.v3"

	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// Include is one entry of an openapi entry's include: a plain string
// selects the operations with that operationId or tag; a mapping
// {$expr: "…"} selects those for which the expression is true. The
// expression sees operationId (the document's, "" when it has none),
// method (upper case), path (the template, /repos/{owner}/{repo}) and
// tags, and runs in the sandbox every expression of patchbay runs in:
//
//	include: ["pulls/get", {$expr: "method == 'GET' && 'issues' in tags"}]
type Include struct {
	// Name is an operationId or a tag; empty for an expression.
	Name string `yaml:"-"`
	// Expr is an expression over the operation; empty for a name.
	Expr string `yaml:"$expr"`

	mapping bool // written as a mapping, so Expr is required
}

// IncludeNames is the include of plain names (operationIds or tags).
func IncludeNames(names ...string) []Include {
	out := make([]Include, len(names))
	for i, n := range names {
		out[i] = Include{Name: n}
	}
	return out
}

// IncludeEnv is the type of what include expressions see.
func IncludeEnv() types.Map {
	return types.Map{
		"operationId": types.String, "method": types.String, "path": types.String,
		"tags": types.Array(types.String),
	}
}

// CompileInclude compiles an include expression; it must be a boolean.
func CompileInclude(src string) (*sandbox.Program, error) {
	return sandbox.Compile(src, IncludeEnv(), expr.AsBool())
}

// String is the entry as written: its name, or $expr: and the expression.
func (i Include) String() string {
	if i.Expr != "" {
		return "$expr: " + i.Expr
	}
	return i.Name
}

// MarshalJSON shows the entry as it is written: a string or {"$expr": …}.
func (i Include) MarshalJSON() ([]byte, error) {
	if i.Expr != "" {
		return json.Marshal(map[string]string{"$expr": i.Expr})
	}
	return json.Marshal(i.Name)
}

// UnmarshalYAML reads both forms.
func (i *Include) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*i = Include{Name: n.Value}
		return nil
	}
	type plain Include // without this method
	var p plain
	err := n.Decode(&p)
	*i = Include(p)
	i.mapping = true
	return err
}

// acceptsScalar tells the shape check that a plain name may stand in for
// the mapping.
func (*Include) acceptsScalar() {}

// validateInclude checks every entry: a name that is not empty, or an
// expression that compiles to a boolean.
func validateInclude(ps *problems, path string, include []Include) {
	for i, in := range include {
		p := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case in.mapping && strings.TrimSpace(in.Expr) == "":
			ps.add(p+".$expr", "is required in a mapping entry: an expression over operationId, method, path and tags")
		case in.Expr != "":
			if _, err := CompileInclude(in.Expr); err != nil {
				ps.add(p+".$expr", "is not a valid include expression over operationId, method, path and tags: %v", err)
			}
		case strings.TrimSpace(in.Name) == "":
			ps.add(p, "must be an operationId, a tag or {$expr: …}, not empty")
		}
	}
}

// IncludeExpr is an include entry selecting by expression, as the file's
// {$expr: src} reads.
func IncludeExpr(src string) Include { return Include{Expr: src, mapping: true} }
