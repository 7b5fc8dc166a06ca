package harness

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/document"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
)

// testRegistry has a ready "mem" connection with add and echo, and a
// "down" connection that failed to start, and a "starting" one not yet
// connected.
func testRegistry(t testing.TB) (*registry.Registry, *connecttest.Memory) {
	t.Helper()
	mem := connecttest.NewMemory(
		connecttest.MemoryOp{Operation: connect.Operation{Name: "add"}, Fn: func(_ context.Context, a map[string]any) (any, error) {
			x, _ := a["a"].(float64)
			y, _ := a["b"].(float64)
			return map[string]any{"sum": x + y}, nil
		}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}},
		connecttest.MemoryOp{Operation: connect.Operation{Name: "fail"}, Fn: func(context.Context, map[string]any) (any, error) {
			return nil, &connect.CallError{Op: "fail", Message: "always fails"}
		}},
	)
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("mem", mem))
	must(t, reg.Add("down", failing{connectErr: errors.New("refused")}))
	_ = reg.Start(context.Background())
	// Added after Start, so it stays connecting.
	must(t, reg.Add("starting", connecttest.NewMemory()))
	return reg, mem
}

const ok = `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"main","steps":[
	{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":1,"b":{"$expr":"$input.n"}}},
	{"kind":"call","id":"b","connection":"mem","op":"echo","args":{"v":{"$expr":"$steps.a.sum * 2"},"raw":{"$literal":{"$expr":"kept"}}}}]}}`

var validationCases = []struct {
	name     string
	doc      string
	wantPath string
	wantCode fault.Code
}{
	{"valid", ok, "", ""},
	{"not json", `{`, "/workflow", fault.CodeValidationFailed},
	{"not an object", `[]`, "/workflow", fault.CodeValidationFailed},
	{"version missing", `{"root":{"kind":"call","id":"a","connection":"mem","op":"add"},"connections":{"mem":{}}}`, "/workflow/version", fault.CodeValidationFailed},
	{"version 2", `{"version":2,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/version", fault.CodeValidationFailed},
	{"unknown top field", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"},"extra":1}`, "/workflow/extra", fault.CodeValidationFailed},
	{"root missing", `{"version":1,"connections":{"mem":{}}}`, "/workflow/root", fault.CodeValidationFailed},
	{"unknown connection in manifest", `{"version":1,"connections":{"nope":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/nope", fault.CodeConnectionUnknown},
	{"bad connection name", `{"version":1,"connections":{"1x":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/1x", fault.CodeConnectionInvalid},
	{"unknown profile", `{"version":1,"connections":{"mem":{"profile":"browser@^1"}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/profile", fault.CodeValidationFailed},
	{"bad profile range", `{"version":1,"connections":{"mem":{"profile":"browser@^^1"}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/profile", fault.CodeValidationFailed},
	{"profile without range", `{"version":1,"connections":{"mem":{"profile":"browser"}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/profile", fault.CodeValidationFailed},
	{"unknown expose", `{"version":1,"connections":{"mem":{"expose":"lazy"}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/expose", fault.CodeValidationFailed},
	{"expose not a string", `{"version":1,"connections":{"mem":{"expose":["call"]}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/expose", fault.CodeValidationFailed},
	{"expose profile without a profile", `{"version":1,"connections":{"mem":{"expose":"profile"}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/expose", fault.CodeValidationFailed},
	{"expose call", `{"version":1,"connections":{"mem":{"expose":"call"}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "", ""},
	{"extension range", `{"version":1,"connections":{"mem":{"extensions":{"com.acme.x":"nope"}}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/extensions/com.acme.x", fault.CodeValidationFailed},
	{"pooled entry", `{"version":1,"connections":{"mem":{"from":"browsers","fresh":"path","setup":{"url":"x"}}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/from", fault.CodeConnectionUnknown},
	{"bad fresh", `{"version":1,"connections":{"mem":{"fresh":"always"}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem", fault.CodeValidationFailed},
	{"attached server key differs", `{"version":1,"connections":{"mem":{"mcp":{"name":"other","url":"http://x"}}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/mcp/name", fault.CodeValidationFailed},
	{"attached server plain header", `{"version":1,"connections":{"mem":{"mcp":{"name":"mem","url":"http://x","headers":{"Authorization":"Bearer x"}}}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/mcp/headers/Authorization", fault.CodeValidationFailed},
	{"attached server with setup", `{"version":1,"connections":{"mem":{"setup":{},"mcp":{"name":"mem","command":"x"}}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem", fault.CodeValidationFailed},
	{"unknown entry field", `{"version":1,"connections":{"mem":{"profil":"x"}},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/connections/mem/profil", fault.CodeValidationFailed},
	{"call to unknown connection", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"ghost","op":"add"}}`, "/workflow/root/connection", fault.CodeConnectionUnknown},
	{"call to undeclared connection", `{"version":1,"connections":{},"root":{"kind":"call","id":"a","connection":"mem","op":"add"}}`, "/workflow/root/connection", fault.CodeValidationFailed},
	{"unknown operation", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"sub"}}`, "/workflow/root/op", fault.CodeOperationUnknown},
	{"unavailable connection", `{"version":1,"connections":{"down":{}},"root":{"kind":"call","id":"a","connection":"down","op":"x"}}`, "/workflow/root/op", fault.CodeConnectionUnavailable},
	{"starting connection", `{"version":1,"connections":{"starting":{}},"root":{"kind":"call","id":"a","connection":"starting","op":"x"}}`, "/workflow/root/op", fault.CodeConnectionStarting},
	{"duplicate ids", `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"main","steps":[{"kind":"call","id":"a","connection":"mem","op":"add"},{"kind":"call","id":"a","connection":"mem","op":"add"}]}}`, "/workflow/root/steps/1/id", fault.CodeStepIDDuplicate},
	{"id missing", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","connection":"mem","op":"add"}}`, "/workflow/root/id", fault.CodeValidationFailed},
	{"unknown kind", `{"version":1,"connections":{"mem":{}},"root":{"kind":"loop","id":"a"}}`, "/workflow/root/kind", fault.CodeValidationFailed},
	{"model without model", `{"version":1,"connections":{"mem":{}},"root":{"kind":"model","id":"a"}}`, "/workflow/root/model", fault.CodeValidationFailed},
	{"model output schema does not compile", `{"version":1,"connections":{"mem":{}},"root":{"kind":"model","id":"a","model":"fake/m","output":{"schema":{"type":"object","properties":{"n":{"type":"numbr"}}}}}}`, "/workflow/root/output/schema/properties/n/type", fault.CodeValidationFailed},
	{"model output schema refers outside", `{"version":1,"connections":{"mem":{}},"root":{"kind":"model","id":"a","model":"fake/m","output":{"schema":{"$ref":"https://example.com/s.json"}}}}`, "/workflow/root/output/schema", fault.CodeValidationFailed},
	{"wait without event", `{"version":1,"connections":{"mem":{}},"root":{"kind":"wait","id":"a","connection":"mem"}}`, "/workflow/root/event", fault.CodeValidationFailed},
	{"unknown step field", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add","arg":{}}}`, "/workflow/root/arg", fault.CodeValidationFailed},
	{"empty sequence", `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"m","steps":[]}}`, "/workflow/root/steps", fault.CodeValidationFailed},
	{"args not object", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add","args":[1]}}`, "/workflow/root/args", fault.CodeValidationFailed},
	{"expression does not compile", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":{"$expr":"1 +"}}}}`, "/workflow/root/args/a/$expr", fault.CodeExpressionInvalid},
	{"expression unknown variable", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":{"$expr":"$env2"}}}}`, "/workflow/root/args/a/$expr", fault.CodeExpressionInvalid},
	{"expression names a later step", `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"m","steps":[{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":{"$expr":"$steps.b.sum"}}},{"kind":"call","id":"b","connection":"mem","op":"add"}]}}`, "/workflow/root/steps/0/args/a/$expr", fault.CodeExpressionInvalid},
	{"expression not a string", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":{"$expr":3}}}}`, "/workflow/root/args/a/$expr", fault.CodeExpressionInvalid},
	{"bad secret name", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a":{"$secret":"no spaces"}}}}`, "/workflow/root/args/a/$secret", fault.CodeValidationFailed},
	{"slash in key escaped", `{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"a","connection":"mem","op":"add","args":{"a/b":{"$expr":"("}}}}`, "/workflow/root/args/a~1b/$expr", fault.CodeExpressionInvalid},
}

func TestParseDocument(t *testing.T) {
	t.Parallel()
	reg, _ := testRegistry(t)
	for _, tt := range validationCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			doc, err := document.ParseDocument([]byte(tt.doc), reg, "/workflow")
			if tt.wantCode == "" {
				if err != nil || doc == nil {
					t.Fatalf("ParseDocument = %v", err)
				}
				return
			}
			var ve *fault.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("ParseDocument = %v, want a ValidationError", err)
			}
			for _, p := range ve.Problems {
				if p.Path == tt.wantPath && p.Code == tt.wantCode {
					return
				}
			}
			t.Fatalf("problems = %+v, want %s at %s", ve.Problems, tt.wantCode, tt.wantPath)
		})
	}
}

var update = flag.Bool("update", false, "rewrite golden files")

// TestValidationGolden keeps every problem of every validation case, with
// its message, in testdata/validation.golden: a change to any message shows
// in review. Run with -update to rewrite it.
func TestValidationGolden(t *testing.T) {
	t.Parallel()
	reg, _ := testRegistry(t)
	var b strings.Builder
	for _, tt := range validationCases {
		fmt.Fprintf(&b, "== %s\n", tt.name)
		_, err := document.ParseDocument([]byte(tt.doc), reg, "/workflow")
		var ve *fault.ValidationError
		if errors.As(err, &ve) {
			for _, p := range ve.Problems {
				fmt.Fprintf(&b, "%s %s: %s\n", p.Code, p.Path, p.Message)
			}
		}
	}
	golden := filepath.Join("testdata", "validation.golden")
	if *update {
		must(t, os.MkdirAll("testdata", 0o755))
		must(t, os.WriteFile(golden, []byte(b.String()), 0o644))
	}
	want, err := os.ReadFile(golden)
	must(t, err)
	if b.String() != string(want) {
		t.Fatalf("validation problems differ from %s (run go test -update to accept):\n%s", golden, b.String())
	}
}

func TestParseDocumentReportsEveryProblem(t *testing.T) {
	t.Parallel()
	reg, _ := testRegistry(t)
	_, err := document.ParseDocument([]byte(`{"version":3,"connections":{"mem":{}},"root":{"kind":"sequence","id":"m","steps":[
		{"kind":"call","id":"a","connection":"mem","op":"nope"},{"kind":"call","id":"a","connection":"mem","op":"add","args":{"x":{"$expr":"1 +"}}}]}}`), reg, "")
	var ve *fault.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 4 {
		t.Fatalf("got %v, want 4 problems", err)
	}
}
