package openapi

import (
	"context"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

func loadShapes(t *testing.T, include []config.Include) ([]operation, []string) {
	t.Helper()
	data, err := os.ReadFile("testdata/shapes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	root, version, err := parseDocument(data)
	if err != nil {
		t.Fatal(err)
	}
	if version != "3.1.0" {
		t.Fatalf("version = %q", version)
	}
	sel, err := newSelector(include)
	if err != nil {
		t.Fatal(err)
	}
	ops, unmatched, _, err := parseOperations(context.Background(), root, sel, newBudget(config.OpenAPI{}))
	if err != nil {
		t.Fatal(err)
	}
	return ops, unmatched
}

func TestOperationNamesAndToolIDs(t *testing.T) {
	t.Parallel()
	ops, _ := loadShapes(t, nil)
	var names []string
	for _, op := range ops {
		names = append(names, op.Name)
	}
	want := []string{"remote.thing", "issues/list-for-repo", "issues/create", "put_trees_id"}
	if !slices.Equal(names, want) {
		t.Fatalf("names = %q, want %q", names, want)
	}
	ids := connect.ToolIDs("github", names)
	for name, id := range map[string]string{
		"issues/list-for-repo": "github_issues_list-for-repo",
		"issues/create":        "github_issues_create",
		"remote.thing":         "github_remote_thing",
		"put_trees_id":         "github_put_trees_id",
	} {
		if ids[name] != id {
			t.Errorf("tool id of %s = %q, want %q", name, ids[name], id)
		}
	}
}

func TestInclude(t *testing.T) {
	t.Parallel()
	names := config.IncludeNames
	ex := config.IncludeExpr
	tests := []struct {
		name      string
		include   []config.Include
		want      []string
		unmatched []string
	}{
		{"tag", names("issues"), []string{"issues/list-for-repo", "issues/create"}, nil},
		{"id and tag", names("issues/create", "trees"), []string{"issues/create", "put_trees_id"}, nil},
		{"unmatched name", names("remote.thing", "nope"), []string{"remote.thing"}, []string{"nope"}},
		{"method and tag", []config.Include{ex(`method == 'GET' && 'issues' in tags`)}, []string{"issues/list-for-repo"}, nil},
		{"path", []config.Include{ex(`path startsWith '/repos/'`)}, []string{"issues/list-for-repo", "issues/create"}, nil},
		{"no operationId", []config.Include{ex(`operationId == ''`)}, []string{"put_trees_id"}, nil},
		{"id pattern", []config.Include{ex(`operationId matches '^issues/'`), ex(`method == 'PATCH'`)}, []string{"issues/list-for-repo", "issues/create"}, []string{"$expr: method == 'PATCH'"}},
		{"name beside expression", []config.Include{{Name: "remote.thing"}, ex(`method == 'PUT'`)}, []string{"remote.thing", "put_trees_id"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ops, unmatched := loadShapes(t, tt.include)
			var names []string
			for _, op := range ops {
				names = append(names, op.Name)
			}
			if !slices.Equal(names, tt.want) || !slices.Equal(unmatched, tt.unmatched) {
				t.Fatalf("names = %q unmatched = %q, want %q and %q", names, unmatched, tt.want, tt.unmatched)
			}
		})
	}
}

func TestInputSchemas(t *testing.T) {
	t.Parallel()
	ops, _ := loadShapes(t, nil)
	byName := map[string]operation{}
	for _, op := range ops {
		byName[op.Name] = op
	}
	tests := []struct {
		op   string
		want string
		mode int
	}{
		{
			// Path-level parameters (one by $ref) come first; the cookie
			// and the unresolvable parameter are left out.
			op:   "issues/list-for-repo",
			mode: bodyNone,
			want: `{"additionalProperties":false,"properties":{"X-Trace":{"type":"string"},"labels":{"items":{"type":"string"},"type":"array"},
				"owner":{"type":"string"},"repo":{"type":"string"},"state":{"enum":["open","closed"],"type":"string"}},
				"required":["owner","repo"],"type":"object"}`,
		},
		{
			// The body's properties merge beside the parameters; 3.1's
			// type list passes through; refs are inlined three levels
			// deep (User, Org, then Deep becomes open).
			op:   "issues/create",
			mode: bodyMerged,
			want: `{"additionalProperties":true,"properties":{"owner":{"type":"string"},"repo":{"type":"string"},
				"title":{"type":"string"},"body":{"type":["string","null"]},
				"assignee":{"type":"object","properties":{"login":{"type":"string"},"org":{"type":"object","properties":{"name":{"type":"string"},"parent":{}}}}}},
				"required":["owner","repo","title"],"type":"object"}`,
		},
		{
			// A cyclic ref becomes an open schema.
			op:   "put_trees_id",
			mode: bodyMerged,
			want: `{"additionalProperties":true,"properties":{"id":{"type":"integer"},"label":{"type":"string"},
				"children":{"type":"array","items":{}}},"required":["id"],"type":"object"}`,
		},
		{
			// A non-object body goes under "body"; a remote ref is open.
			op:   "remote.thing",
			mode: bodyWrapped,
			want: `{"additionalProperties":false,"properties":{"body":{"type":"array","items":{}}},"type":"object"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.op, func(t *testing.T) {
			t.Parallel()
			op := byName[tt.op]
			var got, want any
			if err := json.Unmarshal(op.Spec.InputSchema, &got); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("schema =\n%s\nwant\n%s", op.Spec.InputSchema, tt.want)
			}
			if op.BodyMode != tt.mode {
				t.Errorf("body mode = %d, want %d", op.BodyMode, tt.mode)
			}
		})
	}
}

func TestOpenAPI30Dialect(t *testing.T) {
	t.Parallel()
	r := &expansion{r: resolver{root: map[string]any{}}, maxDepth: maxRefDepth, limit: newBudget(config.OpenAPI{})}
	got := r.schema(map[string]any{
		"type": "integer", "nullable": true, "minimum": 1.0, "exclusiveMinimum": true,
		"maximum": 9.0, "exclusiveMaximum": false, "example": 3.0,
	}, 0, nil)
	want := map[string]any{"type": []any{"integer", "null"}, "exclusiveMinimum": 1.0, "maximum": 9.0}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("schema = %v, want %v", got, want)
	}
	// GitHub's issues/create milestone: no type of its own, so null is
	// added beside the branches (a "type": null here failed to compile).
	branches := []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
	got = r.schema(map[string]any{"oneOf": branches, "nullable": true}, 0, nil)
	want = map[string]any{"anyOf": []any{map[string]any{"oneOf": branches}, map[string]any{"type": "null"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("schema = %v, want %v", got, want)
	}
	if got := r.schema(map[string]any{"nullable": true, "description": "anything"}, 0, nil); !reflect.DeepEqual(got, map[string]any{"description": "anything"}) {
		t.Fatalf("open schema = %v", got)
	}
}
