package harness_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/agent"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

const citySchema = `{"type":"object","properties":{"city":{"type":"string"},"population":{"type":"integer","minimum":0}},"required":["city","population"],"additionalProperties":false}`

func outputDoc(schema string) string {
	return `{"version":1,"connections":{"svc":{}},"root":{"kind":"sequence","id":"s","steps":[
		{"kind":"model","id":"turn","model":"fake/m","instructions":"Answer about cities.","output":{"schema":` + schema + `}},
		{"kind":"call","id":"echo","connection":"svc","op":"echo","args":{"city":{"$expr":"$steps.turn.city"}}}]}}`
}

func outputSetup(t *testing.T, models agent.Models) (*harness.Executions, *connecttest.Memory) {
	t.Helper()
	mem := connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}, Fn: func(_ context.Context, a map[string]any) (any, error) {
		return a, nil
	}})
	reg := registry.NewRegistry(nil)
	must(t, reg.Add("svc", mem))
	must(t, reg.Start(context.Background()))
	return startWorkers(t, storetest.New(t), reg, 1, "out", `{"connections":{"svc":{"ops":["*"]}}}`, harness.ExecutionsOptions{Models: models}), mem
}

func TestModelStructuredOutput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		answers []string
		// want: the node's output as JSON, or "" when the run fails
		want     string
		wantErr  string // in the failure's message
		requests int
	}{
		{"valid answer", []string{`{"city":"Oslo","population":709037}`}, `{"city":"Oslo","population":709037}`, "", 1},
		{"fenced answer", []string{"```json\n{\"city\":\"Oslo\",\"population\":1}\n```"}, `{"city":"Oslo","population":1}`, "", 1},
		{"corrected after one round", []string{`Oslo, about 700k people.`, `{"city":"Oslo","population":709037}`}, `{"city":"Oslo","population":709037}`, "", 2},
		{"invalid twice", []string{`{"city":"Oslo"}`, `{"city":"Oslo","population":"many"}`}, "", "at '/population'", 2},
		{"not JSON twice", []string{`Oslo`, `Still Oslo`}, "", "not a single JSON value", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			models := &scriptModels{}
			for _, a := range tt.answers {
				models.rounds = append(models.rounds, agent.ModelResponse{Text: a})
			}
			execs, mem := outputSetup(t, models)
			ex := runDocAs(t, execs, outputDoc(citySchema), "out")
			reqs := models.requests()
			if len(reqs) != tt.requests {
				t.Fatalf("%d rounds, want %d", len(reqs), tt.requests)
			}
			first := reqs[0]
			if !strings.HasPrefix(first.Instructions, "Answer about cities.\n\n") || !strings.Contains(first.Instructions, `"population"`) ||
				!json.Valid(first.OutputSchema) || !strings.Contains(string(first.OutputSchema), `"required":["city","population"]`) {
				t.Fatalf("request did not ask for the schema: instructions %q schema %s", first.Instructions, first.OutputSchema)
			}
			if tt.requests == 2 {
				fix := reqs[1].Messages[len(reqs[1].Messages)-1]
				if fix.Role != agent.RoleUser || !strings.Contains(fix.Text, "Answer again with only the JSON value") {
					t.Fatalf("corrective message = %+v", fix)
				}
			}
			if tt.want == "" {
				if ex.Status != harness.ExecFailed || ex.Error.Code != fault.OutputInvalid || !strings.Contains(ex.Error.Message, tt.wantErr) {
					t.Fatalf("execution %s %+v, want output_invalid naming %q", ex.Status, ex.Error, tt.wantErr)
				}
				t.Logf("failure: %s", ex.Error.Message)
				if n := len(mem.Calls()); n != 0 {
					t.Fatalf("the next step ran %d times after the failure", n)
				}
				return
			}
			if ex.Status != harness.ExecSucceeded {
				t.Fatalf("execution %s %+v", ex.Status, ex.Error)
			}
			got, _ := json.Marshal(step(ex, "turn").Output)
			if string(got) != tt.want {
				t.Fatalf("turn output = %s, want %s", got, tt.want)
			}
			if calls := mem.Calls(); len(calls) != 1 || calls[0].Args["city"] != "Oslo" {
				t.Fatalf("the next step did not read $steps.turn.city: %+v", calls)
			}
		})
	}
}

func TestModelOutputSchemaChecked(t *testing.T) {
	t.Parallel()
	execs, _ := outputSetup(t, &scriptModels{})
	root := func(output string) string {
		return `{"version":1,"connections":{"svc":{}},"root":{"kind":"model","id":"m","model":"fake/m","output":` + output + `}}`
	}
	tests := []struct{ name, doc, path, msg string }{
		{"not an object", root(`"json"`), "/workflow/root/output", "schema"},
		{"no schema", root(`{}`), "/workflow/root/output/schema", "required"},
		{"unknown field", root(`{"schema":{},"strict":true}`), "/workflow/root/output/strict", ""},
		{"schema of the wrong type", root(`{"schema":"object"}`), "/workflow/root/output/schema", "JSON Schema"},
		{"bad keyword value", root(`{"schema":{"type":"object","properties":{"n":{"type":"numbr"}}}}`), "/workflow/root/output/schema/properties/n/type", "not a valid JSON Schema"},
		{"ref to a file", root(`{"schema":{"$ref":"file:///etc/passwd"}}`), "/workflow/root/output/schema", "not a valid JSON Schema"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(tt.doc), Allowlist: "out"})
			var ve *fault.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("Submit = %v, want a validation error", err)
			}
			for _, p := range ve.Problems {
				if p.Path == tt.path && p.Code == fault.CodeValidationFailed && strings.Contains(p.Message, tt.msg) {
					return
				}
			}
			t.Fatalf("problems = %+v, want VALIDATION_FAILED at %s naming %q", ve.Problems, tt.path, tt.msg)
		})
	}
	// A schema that refers inside itself and a boolean schema are fine.
	for _, ok := range []string{`{"schema":{"$defs":{"c":{"type":"string"}},"type":"object","properties":{"city":{"$ref":"#/$defs/c"}}}}`, `{"schema":true}`,
		`{"schema":{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"array"}}`} {
		if _, err := execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(root(ok)), Allowlist: "out"}); err != nil {
			t.Errorf("output %s refused: %v", ok, err)
		}
	}
}
