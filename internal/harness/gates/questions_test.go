package gates_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// recorder is the engine's side of the queue in these tests: it keeps
// what the hooks were told.
type recorder struct {
	mu        sync.Mutex
	events    []event
	resumed   []string
	observed  []gates.QuestionState
	answerers map[string][]string
}

type event struct {
	exec, typ string
	data      map[string]any
}

func (r *recorder) hooks() gates.QuestionHooks {
	return gates.QuestionHooks{
		Resume: func(_ context.Context, exec string) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.resumed = append(r.resumed, exec)
			return nil
		},
		Emit: func(_ context.Context, exec, typ string, data map[string]any) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.events = append(r.events, event{exec, typ, data})
		},
		Answerers: func(connection string) []string { return r.answerers[connection] },
		Redact: func(v any) any {
			// Stands in secrets.Redactor: one known secret value.
			data, _ := json.Marshal(v)
			var out any
			_ = json.Unmarshal([]byte(strings.ReplaceAll(string(data), "hunter2-value", "<redacted>")), &out)
			return out
		},
		Observe: func(s gates.QuestionState) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.observed = append(r.observed, s)
		},
	}
}

func (r *recorder) types() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, e.typ)
	}
	return out
}

type bundle struct {
	q   *gates.Questions
	rec *recorder
}

func setup(t *testing.T) bundle {
	t.Helper()
	rec := &recorder{answerers: map[string][]string{}}
	return bundle{q: gates.NewQuestions(storetest.New(t), rec.hooks()), rec: rec}
}

func schemaOf(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("schema %s: %v", s, err)
	}
	return m
}

// profile is a form with a field of every kind.
const profile = `{"type":"object","properties":{
	"name":{"type":"string","title":"Name","minLength":2,"maxLength":10},
	"email":{"type":"string","format":"email"},
	"site":{"type":"string","format":"uri"},
	"born":{"type":"string","format":"date"},
	"at":{"type":"string","format":"date-time"},
	"size":{"type":"string","enum":["s","m","l"]},
	"tier":{"type":"string","oneOf":[{"const":"free","title":"Free"},{"const":"pro","title":"Pro"}]},
	"age":{"type":"integer","minimum":0,"maximum":150},
	"score":{"type":"number","minimum":0.5,"maximum":9.5},
	"ok":{"type":"boolean","default":false},
	"colors":{"type":"array","minItems":1,"maxItems":2,"items":{"type":"string","enum":["red","green","blue"]}},
	"tags":{"type":"array","items":{"anyOf":[{"const":"a","title":"A"},{"const":"b","title":"B"}]}}},
	"required":["name","email"]}`

func (b bundle) ask(t *testing.T, id, by string, mutate ...func(*gates.Question)) *gates.Question {
	t.Helper()
	qu := &gates.Question{ID: id, Execution: "ex_" + id, Step: "s", Connection: "mem", Mode: gates.ModeForm,
		Message: "who are you?", RequestedSchema: schemaOf(t, profile), RequestedBy: by}
	for _, m := range mutate {
		m(qu)
	}
	got, err := b.q.Ask(t.Context(), qu)
	if err != nil {
		t.Fatalf("Ask %s: %v", id, err)
	}
	return got
}

var (
	alice    = authz.Principal{Name: "alice"}
	approver = authz.Principal{Name: "approver", Roles: []authz.Role{authz.Approve}}
)

func TestAskIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := gates.QuestionID("ex_1", "ex_1:s:elicit:1")
	if id != gates.QuestionID("ex_1", "ex_1:s:elicit:1") || id == gates.QuestionID("ex_1", "ex_1:s:elicit:2") || !strings.HasPrefix(id, "qs_") {
		t.Fatalf("QuestionID is not deterministic per (execution, key): %s", id)
	}
	first := b.ask(t, id, "alice")
	if first.State != gates.QuestionPending || first.CreatedAt.IsZero() || !first.ExpiresAt.Equal(first.CreatedAt.Add(gates.DefaultQuestionTTL)) {
		t.Fatalf("asked = %+v", first)
	}
	again := b.ask(t, id, "alice", func(q *gates.Question) { q.Message = "asked again, differently" })
	if again.Message != "who are you?" || again.State != gates.QuestionPending {
		t.Fatalf("a repeated Ask replaced the record: %+v", again)
	}
	if got := b.rec.types(); !slices.Equal(got, []string{gates.EventQuestionAsked}) {
		t.Fatalf("events = %v, want one question.asked", got)
	}
	ev := b.rec.events[0]
	if ev.exec != "ex_"+id || ev.data["question"] != id || ev.data["step"] != "s" || ev.data["connection"] != "mem" || ev.data["mode"] != "form" {
		t.Fatalf("asked event = %+v", ev)
	}
	if !slices.Equal(b.rec.observed, []gates.QuestionState{gates.QuestionPending}) {
		t.Fatalf("observed = %v", b.rec.observed)
	}
	list, err := b.q.List(t.Context(), "", 10)
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %v, %v; want the one question", list, err)
	}
	if n, err := b.q.PendingQuestions(t.Context()); err != nil || n != 1 {
		t.Fatalf("PendingQuestions = %d, %v", n, err)
	}
	if _, err := b.q.Get(t.Context(), "qs_nope"); !errors.Is(err, gates.ErrQuestionNotFound) {
		t.Fatalf("Get missing = %v", err)
	}
}

func TestAskRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name string
		q    gates.Question
		want error
	}{
		{"no id", gates.Question{Execution: "ex", Mode: "url", URL: "https://x.test", ElicitationID: "e"}, gates.ErrQuestionInvalid},
		{"unknown mode", gates.Question{ID: "q1", Execution: "ex", Mode: "chat"}, gates.ErrQuestionInvalid},
		{"javascript url", gates.Question{ID: "q2", Execution: "ex", Mode: "url", URL: "javascript:alert(1)", ElicitationID: "e"}, gates.ErrQuestionInvalid},
		{"relative url", gates.Question{ID: "q3", Execution: "ex", Mode: "url", URL: "/pay", ElicitationID: "e"}, gates.ErrQuestionInvalid},
		{"url without elicitation id", gates.Question{ID: "q4", Execution: "ex", Mode: "url", URL: "https://x.test/pay"}, gates.ErrQuestionInvalid},
		{"form asking a password", gates.Question{ID: "q5", Execution: "ex", Mode: "form",
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"password": map[string]any{"type": "string"}}}}, gates.ErrFormRefused},
		{"form without schema", gates.Question{ID: "q6", Execution: "ex", Mode: "form"}, gates.ErrFormRefused},
		{"too large", gates.Question{ID: "q7", Execution: "ex", Mode: "url", URL: "https://x.test/" + strings.Repeat("a", gates.MaxQuestionBytes), ElicitationID: "e"}, gates.ErrQuestionInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := b.q.Ask(t.Context(), &tc.q); !errors.Is(err, tc.want) {
				t.Fatalf("Ask = %v, want %v", err, tc.want)
			}
		})
	}
	if got := b.rec.types(); len(got) != 0 {
		t.Fatalf("refused asks emitted %v", got)
	}
}

func TestCheckForm(t *testing.T) {
	t.Parallel()
	accepted := []struct{ name, schema string }{
		// The examples of MCP's elicitation page (2025-11-25).
		{"simple text", `{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`},
		{"structured", `{"type":"object","properties":{"name":{"type":"string"},"email":{"type":"string","format":"email"},
			"age":{"type":"number","minimum":18}},"required":["name","email"]}`},
		{"github username", `{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object","properties":{"name":{"type":"string","description":"Your GitHub username"}},"required":["name"]}`},
		{"string with everything", `{"type":"object","properties":{"d":{"type":"string","title":"Display Name","description":"Description text","minLength":3,"maxLength":50,"format":"email","default":"user@example.com"}}}`},
		{"number", `{"type":"object","properties":{"n":{"type":"number","title":"Display Name","description":"Description text","minimum":0,"maximum":100,"default":50}}}`},
		{"boolean", `{"type":"object","properties":{"b":{"type":"boolean","title":"Display Name","description":"Description text","default":false}}}`},
		{"untitled single select", `{"type":"object","properties":{"c":{"type":"string","title":"Color Selection","description":"Choose your favorite color","enum":["Red","Green","Blue"],"default":"Red"}}}`},
		{"titled single select", `{"type":"object","properties":{"c":{"type":"string","title":"Color Selection","oneOf":[{"const":"#FF0000","title":"Red"},{"const":"#00FF00","title":"Green"}],"default":"#FF0000"}}}`},
		{"untitled multi select", `{"type":"object","properties":{"c":{"type":"array","title":"Color Selection","minItems":1,"maxItems":2,"items":{"type":"string","enum":["Red","Green","Blue"]},"default":["Red","Green"]}}}`},
		{"titled multi select", `{"type":"object","properties":{"c":{"type":"array","items":{"anyOf":[{"const":"#FF0000","title":"Red"},{"const":"#00FF00","title":"Green"}]},"default":["#FF0000"]}}}`},
		{"legacy enumNames", `{"type":"object","properties":{"c":{"type":"string","enum":["#FF0000","#00FF00"],"enumNames":["Red","Green"]}}}`},
		{"closed", `{"type":"object","additionalProperties":false,"properties":{"x":{"type":"integer"}}}`},
		{"no fields", `{"type":"object","properties":{}}`},
		{"words that only look like pin", `{"type":"object","properties":{"shipping":{"type":"string","title":"Shipping address","description":"Your opinion on spinning tops"}}}`},
		{"every kind", profile},
	}
	for _, tc := range accepted {
		t.Run("accepts "+tc.name, func(t *testing.T) {
			t.Parallel()
			if err := gates.CheckForm(schemaOf(t, tc.schema)); err != nil {
				t.Fatalf("CheckForm refused: %v", err)
			}
		})
	}
	refused := []struct{ name, schema, why string }{
		{"password field", `{"type":"object","properties":{"password":{"type":"string"}}}`, "password"},
		{"password in camel case", `{"type":"object","properties":{"dbPassword":{"type":"string"}}}`, "password"},
		{"passcode title", `{"type":"object","properties":{"code":{"type":"string","title":"Your passcode"}}}`, "passcode"},
		{"token", `{"type":"object","properties":{"accessToken":{"type":"string"}}}`, "token"},
		{"secret description", `{"type":"object","properties":{"x":{"type":"string","description":"The client SECRET"}}}`, "secret"},
		{"api key", `{"type":"object","properties":{"key":{"type":"string","title":"API key"}}}`, "api key"},
		{"apiKey", `{"type":"object","properties":{"apiKey":{"type":"string"}}}`, "api key"},
		{"api_key", `{"type":"object","properties":{"api_key":{"type":"string"}}}`, "api key"},
		{"apikey", `{"type":"object","properties":{"apikey":{"type":"string"}}}`, "api key"},
		{"credential", `{"type":"object","properties":{"creds":{"type":"string","title":"Credentials"}}}`, "credential"},
		{"private key", `{"type":"object","properties":{"pk":{"type":"string","description":"paste your private key"}}}`, "private key"},
		{"ssn", `{"type":"object","properties":{"ssn":{"type":"string"}}}`, "ssn"},
		{"pin", `{"type":"object","properties":{"code":{"type":"integer","title":"Card PIN"}}}`, "pin"},
		{"userPIN", `{"type":"object","properties":{"userPIN":{"type":"string"}}}`, "pin"},
		{"secret in the form's title", `{"type":"object","title":"Enter your token","properties":{}}`, "token"},
		{"secret in an option", `{"type":"object","properties":{"c":{"type":"string","oneOf":[{"const":"a","title":"Share my password"}]}}}`, "password"},
		{"nested object", `{"type":"object","properties":{"addr":{"type":"object","properties":{"city":{"type":"string"}}}}}`, "flat"},
		{"array of objects", `{"type":"object","properties":{"xs":{"type":"array","items":{"type":"object"}}}}`, "strings"},
		{"array without items", `{"type":"object","properties":{"xs":{"type":"array"}}}`, "items"},
		{"free array of strings", `{"type":"object","properties":{"xs":{"type":"array","items":{"type":"string"}}}}`, "enum"},
		{"null type", `{"type":"object","properties":{"x":{"type":"null"}}}`, "type"},
		{"type list", `{"type":"object","properties":{"x":{"type":["string","null"]}}}`, "type"},
		{"not an object", `{"type":"array","items":{"type":"string"}}`, "flat object"},
		{"unknown format", `{"type":"object","properties":{"x":{"type":"string","format":"ipv4"}}}`, "format"},
		{"pattern", `{"type":"object","properties":{"x":{"type":"string","pattern":"^a"}}}`, "pattern"},
		{"ref", `{"type":"object","properties":{"x":{"$ref":"#/defs/x"}}}`, "type"},
		{"required not a field", `{"type":"object","properties":{"x":{"type":"string"}},"required":["y"]}`, "required"},
		{"bad default", `{"type":"object","properties":{"x":{"type":"integer","default":"one"}}}`, "default"},
		{"min above max", `{"type":"object","properties":{"x":{"type":"string","minLength":5,"maxLength":2}}}`, "bound"},
		{"open object", `{"type":"object","additionalProperties":true,"properties":{}}`, "additionalProperties"},
		{"enumNames mismatch", `{"type":"object","properties":{"x":{"type":"string","enum":["a","b"],"enumNames":["A"]}}}`, "enumNames"},
	}
	for _, tc := range refused {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			t.Parallel()
			err := gates.CheckForm(schemaOf(t, tc.schema))
			if !errors.Is(err, gates.ErrFormRefused) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("CheckForm = %v; want ErrFormRefused saying %q", err, tc.why)
			}
		})
	}
}

func TestValidateAnswer(t *testing.T) {
	t.Parallel()
	schema := schemaOf(t, profile)
	good := `{"name":"Ada","email":"ada@example.com","site":"https://ada.example","born":"1815-12-10",
		"at":"2025-11-25T10:00:00Z","size":"m","tier":"pro","age":36,"score":9.5,"ok":true,"colors":["red","blue"],"tags":[]}`
	for _, tc := range []struct {
		name, content string
		want          map[string]string // path → part of the message
	}{
		{"valid", good, nil},
		{"only the required", `{"name":"Ada","email":"ada@example.com"}`, nil},
		{"required missing", `{"name":"Ada"}`, map[string]string{"/content/email": "required"}},
		{"extra field", `{"name":"Ada","email":"a@b.co","nick":"x"}`, map[string]string{"/content/nick": "not a field"}},
		{"wrong type string", `{"name":3,"email":"a@b.co"}`, map[string]string{"/content/name": "string"}},
		{"too short", `{"name":"A","email":"a@b.co"}`, map[string]string{"/content/name": "at least 2"}},
		{"too long", `{"name":"Adaaaaaaaaaa","email":"a@b.co"}`, map[string]string{"/content/name": "at most 10"}},
		{"length in characters", `{"name":"ÅdåÅdåÅdåÅ","email":"a@b.co"}`, nil},
		{"email", `{"name":"Ada","email":"Ada <ada@example.com>"}`, map[string]string{"/content/email": "email"}},
		{"uri", `{"name":"Ada","email":"a@b.co","site":"not a uri"}`, map[string]string{"/content/site": "URI"}},
		{"date", `{"name":"Ada","email":"a@b.co","born":"10/12/1815"}`, map[string]string{"/content/born": "date"}},
		{"date-time", `{"name":"Ada","email":"a@b.co","at":"2025-11-25"}`, map[string]string{"/content/at": "RFC 3339"}},
		{"enum", `{"name":"Ada","email":"a@b.co","size":"xl"}`, map[string]string{"/content/size": "one of"}},
		{"oneOf const", `{"name":"Ada","email":"a@b.co","tier":"Pro"}`, map[string]string{"/content/tier": "one of"}},
		{"integer", `{"name":"Ada","email":"a@b.co","age":3.5}`, map[string]string{"/content/age": "whole"}},
		{"minimum", `{"name":"Ada","email":"a@b.co","age":-1}`, map[string]string{"/content/age": "at least 0"}},
		{"maximum", `{"name":"Ada","email":"a@b.co","score":10}`, map[string]string{"/content/score": "at most 9.5"}},
		{"number type", `{"name":"Ada","email":"a@b.co","score":"9"}`, map[string]string{"/content/score": "number"}},
		{"boolean", `{"name":"Ada","email":"a@b.co","ok":"yes"}`, map[string]string{"/content/ok": "true or false"}},
		{"null", `{"name":null,"email":"a@b.co"}`, map[string]string{"/content/name": "string"}},
		{"multi option", `{"name":"Ada","email":"a@b.co","colors":["pink"]}`, map[string]string{"/content/colors": "options among"}},
		{"multi twice", `{"name":"Ada","email":"a@b.co","colors":["red","red"]}`, map[string]string{"/content/colors": "twice"}},
		{"minItems", `{"name":"Ada","email":"a@b.co","colors":[]}`, map[string]string{"/content/colors": "at least 1"}},
		{"maxItems", `{"name":"Ada","email":"a@b.co","colors":["red","green","blue"]}`, map[string]string{"/content/colors": "at most 2"}},
		{"anyOf const", `{"name":"Ada","email":"a@b.co","tags":["A"]}`, map[string]string{"/content/tags": "options among"}},
		{"multi not an array", `{"name":"Ada","email":"a@b.co","colors":"red"}`, map[string]string{"/content/colors": "array"}},
		{"several at once", `{"email":"nope","age":200}`, map[string]string{"/content/name": "required", "/content/email": "email", "/content/age": "at most 150"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			errs := gates.ValidateAnswer(schema, schemaOf(t, tc.content))
			got := map[string]string{}
			for _, e := range errs {
				if e.Code != fault.CodeValidationFailed {
					t.Errorf("%s: code %s", e.Path, e.Code)
				}
				got[e.Path] = e.Message
			}
			if len(got) != len(tc.want) {
				t.Fatalf("errors = %v, want paths %v", errs, tc.want)
			}
			for path, part := range tc.want {
				if !strings.Contains(got[path], part) {
					t.Errorf("%s: %q, want it to say %q (all: %v)", path, got[path], part, errs)
				}
			}
		})
	}
	// A Go caller's values ([]string, int) read as decoded JSON does.
	if errs := gates.ValidateAnswer(schema, map[string]any{"name": "Ada", "email": "a@b.co", "age": 36, "colors": []string{"red"}}); len(errs) != 0 {
		t.Fatalf("Go values: %v", errs)
	}
	// A field name needing escape in a JSON Pointer.
	slash := schemaOf(t, `{"type":"object","properties":{"a/b":{"type":"string"}}}`)
	if errs := gates.ValidateAnswer(slash, map[string]any{"a/b": 1}); len(errs) != 1 || errs[0].Path != "/content/a~1b" {
		t.Fatalf("escaped path: %v", errs)
	}
}

func TestAnswerValidatesAndStoresContent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	qu := b.ask(t, "q1", "alice")
	_, err := b.q.Answer(t.Context(), qu.ID, approver, map[string]any{"name": "A", "email": "nope"})
	var ve *fault.ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 2 || ve.Problems[0].Path != "/content/email" || ve.Problems[1].Path != "/content/name" {
		t.Fatalf("bad answer = %v", err)
	}
	if got, _ := b.q.Get(t.Context(), qu.ID); got.State != gates.QuestionPending {
		t.Fatalf("a refused answer decided the question: %s", got.State)
	}
	big := map[string]any{"name": "Ada", "email": "a@b.co", "site": "https://x.test/" + strings.Repeat("a", gates.MaxContentBytes)}
	if _, err := b.q.Answer(t.Context(), qu.ID, approver, big); !errors.As(err, &ve) || ve.Problems[0].Path != "/content" {
		t.Fatalf("oversized answer = %v", err)
	}
	got, err := b.q.Answer(t.Context(), qu.ID, approver, map[string]any{"name": "Ada", "email": "ada@example.com", "age": 36})
	if err != nil || got.State != gates.QuestionAnswered || got.AnsweredBy != "approver" || got.AnsweredAt == nil || got.Content["age"] != 36.0 {
		t.Fatalf("Answer = %+v, %v", got, err)
	}
	stored, _ := b.q.Get(t.Context(), qu.ID)
	if stored.Content["name"] != "Ada" || stored.Content["email"] != "ada@example.com" {
		t.Fatalf("stored content = %v", stored.Content)
	}
	if !slices.Equal(b.rec.resumed, []string{"ex_q1"}) {
		t.Fatalf("resumed = %v", b.rec.resumed)
	}
	if n, _ := b.q.PendingQuestions(t.Context()); n != 0 {
		t.Fatalf("pending after answer = %d", n)
	}
}

func TestURLQuestion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	url := func(q *gates.Question) {
		q.Mode, q.RequestedSchema, q.URL, q.ElicitationID = gates.ModeURL, nil, "https://pay.example.com/checkout?s=1", "el-1"
	}
	qu := b.ask(t, "u1", "alice", url)
	if qu.URL == "" || qu.ElicitationID != "el-1" || qu.RequestedSchema != nil {
		t.Fatalf("url question = %+v", qu)
	}
	var ve *fault.ValidationError
	if _, err := b.q.Answer(t.Context(), qu.ID, approver, map[string]any{"done": true}); !errors.As(err, &ve) || ve.Problems[0].Path != "/content" {
		t.Fatalf("url answer with content = %v", err)
	}
	if got, err := b.q.Answer(t.Context(), qu.ID, approver, map[string]any{}); err != nil || got.State != gates.QuestionAnswered {
		t.Fatalf("url answer {} = %+v, %v", got, err)
	}
	qu2 := b.ask(t, "u2", "alice", url)
	if got, err := b.q.Answer(t.Context(), qu2.ID, approver, nil); err != nil || got.State != gates.QuestionAnswered {
		t.Fatalf("url answer without content = %+v, %v", got, err)
	}
}

func TestDecideOnce(t *testing.T) {
	t.Parallel()
	answer := map[string]any{"name": "Ada", "email": "ada@example.com"}
	other := map[string]any{"name": "Bob", "email": "bob@example.com"}
	type step struct {
		do   string // answer, other, decline, cancel
		want error
	}
	for _, tc := range []struct {
		name  string
		steps []step
		final gates.QuestionState
	}{
		{"answer twice alike", []step{{"answer", nil}, {"answer", nil}}, gates.QuestionAnswered},
		{"answer then another answer", []step{{"answer", nil}, {"other", gates.ErrQuestionDecided}}, gates.QuestionAnswered},
		{"answer then decline", []step{{"answer", nil}, {"decline", gates.ErrQuestionDecided}}, gates.QuestionAnswered},
		{"decline twice", []step{{"decline", nil}, {"decline", nil}}, gates.QuestionDeclined},
		{"decline then answer", []step{{"decline", nil}, {"answer", gates.ErrQuestionDecided}}, gates.QuestionDeclined},
		{"cancel twice", []step{{"cancel", nil}, {"cancel", nil}}, gates.QuestionCancelled},
		{"cancel then decline", []step{{"cancel", nil}, {"decline", gates.ErrQuestionDecided}}, gates.QuestionCancelled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			qu := b.ask(t, "q", "alice")
			for i, s := range tc.steps {
				var err error
				switch s.do {
				case "answer":
					_, err = b.q.Answer(t.Context(), qu.ID, approver, answer)
				case "other":
					_, err = b.q.Answer(t.Context(), qu.ID, approver, other)
				case "decline":
					_, err = b.q.Decline(t.Context(), qu.ID, approver, fmt.Sprintf("not now (%d)", i))
				case "cancel":
					_, err = b.q.Cancel(t.Context(), qu.ID, approver)
				}
				if !errors.Is(err, s.want) || (s.want == nil && err != nil) {
					t.Fatalf("step %d (%s) = %v, want %v", i, s.do, err, s.want)
				}
			}
			got, _ := b.q.Get(t.Context(), qu.ID)
			if got.State != tc.final {
				t.Fatalf("final state %s, want %s", got.State, tc.final)
			}
			if tc.final == gates.QuestionAnswered && got.Content["name"] != "Ada" {
				t.Fatalf("the first answer was replaced: %v", got.Content)
			}
			if tc.final == gates.QuestionDeclined && got.Reason != "not now (0)" {
				t.Fatalf("reason = %q, want the first decline's", got.Reason)
			}
			// One decision event and one observation, whatever repeats.
			decisions := 0
			for _, typ := range b.rec.types() {
				if typ != gates.EventQuestionAsked {
					decisions++
					if typ != "question."+string(tc.final) {
						t.Errorf("event %s for a %s question", typ, tc.final)
					}
				}
			}
			if decisions != 1 || len(b.rec.observed) != 2 || b.rec.observed[1] != tc.final {
				t.Fatalf("events %v, observed %v; want one decision", b.rec.types(), b.rec.observed)
			}
			// A repeat alike resumes the run again (a retry after a lost
			// answer); a conflict does not.
			repeats := 0
			for _, s := range tc.steps {
				if s.want == nil {
					repeats++
				}
			}
			if len(b.rec.resumed) != repeats {
				t.Fatalf("resumed %d times, want %d", len(b.rec.resumed), repeats)
			}
		})
	}
}

func TestWhoMayAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		by        authz.Principal
		answerers []string
		want      error
	}{
		{"approver", approver, nil, nil},
		{"admin", authz.Principal{Name: "root", Roles: []authz.Role{authz.Admin}}, nil, nil},
		{"run key", authz.Principal{Name: "bob"}, nil, gates.ErrNotAnswerer},
		{"read key", authz.Principal{Name: "auditor", Roles: []authz.Role{authz.Read}}, nil, gates.ErrNotAnswerer},
		{"asker", alice, nil, gates.ErrSelfAnswer},
		{"asker with approve", authz.Principal{Name: "alice", Roles: []authz.Role{authz.Run, authz.Approve}}, nil, gates.ErrSelfAnswer},
		{"asker named by name", alice, []string{"alice"}, nil},
		{"asker named by a role only", authz.Principal{Name: "alice", Roles: []authz.Role{authz.Approve, "oncall"}}, []string{"role:oncall"}, gates.ErrSelfAnswer},
		{"approver not among named answerers", approver, []string{"carol"}, gates.ErrNotAnswerer},
		{"approver named by name", approver, []string{"approver"}, nil},
		{"named by name without approve", authz.Principal{Name: "carol"}, []string{"carol"}, nil},
		{"approver with the named role", authz.Principal{Name: "dave", Roles: []authz.Role{authz.Approve, "oncall"}}, []string{"role:oncall"}, nil},
		{"named role without approve", authz.Principal{Name: "erin", Roles: []authz.Role{"oncall"}}, []string{"role:oncall"}, gates.ErrNotAnswerer},
		{"approve glob over the connection", authz.Principal{Name: "f", Roles: []authz.Role{authz.Approve}, Approve: []string{"mem.*"}}, nil, nil},
		{"approve glob of every connection", authz.Principal{Name: "g", Roles: []authz.Role{authz.Approve}, Approve: []string{"*"}}, nil, nil},
		{"approve glob of one operation", authz.Principal{Name: "h", Roles: []authz.Role{authz.Approve}, Approve: []string{"mem.guarded"}}, nil, gates.ErrNotAnswerer},
		{"approve glob of another connection", authz.Principal{Name: "i", Roles: []authz.Role{authz.Approve}, Approve: []string{"other.*"}}, nil, gates.ErrNotAnswerer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.rec.answerers["mem"] = tc.answerers
			qu := b.ask(t, "q", "alice")
			if may := b.q.MayAnswer(qu, tc.by); may != (tc.want == nil) {
				t.Errorf("MayAnswer = %v", may)
			}
			for _, decide := range []func() (*gates.Question, error){
				func() (*gates.Question, error) {
					return b.q.Answer(t.Context(), qu.ID, tc.by, map[string]any{"name": "Ada", "email": "a@b.co"})
				},
				func() (*gates.Question, error) { return b.q.Decline(t.Context(), qu.ID, tc.by, "") },
				func() (*gates.Question, error) { return b.q.Cancel(t.Context(), qu.ID, tc.by) },
			} {
				_, err := decide()
				if tc.want == nil {
					if err != nil && !errors.Is(err, gates.ErrQuestionDecided) {
						t.Fatalf("decision = %v, want allowed", err)
					}
					continue
				}
				if !errors.Is(err, tc.want) {
					t.Fatalf("decision = %v, want %v", err, tc.want)
				}
			}
			got, _ := b.q.Get(t.Context(), qu.ID)
			if (tc.want == nil) != (got.State == gates.QuestionAnswered) {
				t.Fatalf("state %s after the decisions", got.State)
			}
		})
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	past := func(q *gates.Question) {
		q.CreatedAt = time.Now().Add(-2 * time.Hour)
		q.ExpiresAt = time.Now().Add(-time.Hour)
	}
	late := b.ask(t, "late", "alice", past)
	if late.State != gates.QuestionExpired {
		t.Fatalf("a question past its expiry reads %s", late.State)
	}
	if list, _ := b.q.List(t.Context(), gates.QuestionExpired, 10); len(list) != 1 {
		t.Fatalf("expired list = %v", list)
	}
	// An answer after the expiry records the expiry instead.
	got, err := b.q.Answer(t.Context(), late.ID, approver, map[string]any{"name": "Ada", "email": "a@b.co"})
	if !errors.Is(err, gates.ErrQuestionDecided) || got.State != gates.QuestionExpired || got.AnsweredBy != authz.SystemName || got.Content != nil {
		t.Fatalf("late answer = %+v, %v", got, err)
	}
	if typ := b.rec.types(); typ[len(typ)-1] != gates.EventQuestionExpired {
		t.Fatalf("events = %v", typ)
	}

	// The sweep expires what nobody touched, once.
	swept := b.ask(t, "swept", "alice", past)
	soon := b.ask(t, "soon", "alice", func(q *gates.Question) { q.ExpiresAt = time.Now().Add(150 * time.Millisecond) })
	fresh := b.ask(t, "fresh", "alice")
	b.q.Expire(t.Context())
	b.q.Expire(t.Context())
	if got, _ := b.q.Get(t.Context(), swept.ID); got.State != gates.QuestionExpired || got.Reason == "" {
		t.Fatalf("swept = %+v", got)
	}
	if got, _ := b.q.Get(t.Context(), soon.ID); got.State != gates.QuestionPending {
		t.Fatalf("soon = %s before its time", got.State)
	}
	time.Sleep(200 * time.Millisecond)
	if got, _ := b.q.Get(t.Context(), soon.ID); got.State != gates.QuestionExpired {
		t.Fatalf("soon = %s after its time", got.State)
	}
	b.q.Expire(t.Context())
	if got, _ := b.q.Get(t.Context(), fresh.ID); got.State != gates.QuestionPending {
		t.Fatalf("fresh = %s", got.State)
	}
	expired := 0
	for _, s := range b.rec.observed {
		if s == gates.QuestionExpired {
			expired++
		}
	}
	if expired != 3 {
		t.Fatalf("observed %v; want three expiries", b.rec.observed)
	}
	if n, _ := b.q.PendingQuestions(t.Context()); n != 1 {
		t.Fatalf("pending = %d, want only fresh", n)
	}
}

func TestContentNeverInEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const marker = "ada-marker-7f3c"
	qu := b.ask(t, "q", "alice")
	if _, err := b.q.Answer(t.Context(), qu.ID, approver, map[string]any{"name": "Ada", "email": marker + "@example.com"}); err != nil {
		t.Fatal(err)
	}
	qu2 := b.ask(t, "q2", "alice")
	if _, err := b.q.Decline(t.Context(), qu2.ID, approver, "no"); err != nil {
		t.Fatal(err)
	}
	b.rec.mu.Lock()
	defer b.rec.mu.Unlock()
	for _, e := range b.rec.events {
		data, _ := json.Marshal(e.data)
		if strings.Contains(string(data), marker) || strings.Contains(string(data), "content") {
			t.Fatalf("event %s carries the answer: %s", e.typ, data)
		}
		if e.typ == gates.EventQuestionAnswered && (e.data["question"] != qu.ID || e.data["step"] != "s" || e.data["state"] != gates.QuestionAnswered) {
			t.Fatalf("answered event = %v", e.data)
		}
	}
}

func TestRedacted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	qu := b.ask(t, "q", "alice", func(q *gates.Question) {
		q.Message = "the old one was hunter2-value"
		q.RequestedSchema = schemaOf(t, `{"type":"object","properties":{"name":{"type":"string"},"email":{"type":"string"}}}`)
	})
	if _, err := b.q.Answer(t.Context(), qu.ID, approver, map[string]any{"name": "hunter2-value", "email": "a@b.co"}); err != nil {
		t.Fatal(err)
	}
	raw, _ := b.q.Get(t.Context(), qu.ID)
	if raw.Content["name"] != "hunter2-value" {
		t.Fatalf("the run's read lost the answer: %v", raw.Content)
	}
	shown := b.q.Redacted(raw)
	if shown.Content["name"] != "<redacted>" || shown.Content["email"] != "a@b.co" || strings.Contains(shown.Message, "hunter2") {
		t.Fatalf("shown = %+v", shown)
	}
	if raw.Content["name"] != "hunter2-value" {
		t.Fatal("Redacted changed the record it was given")
	}
}

// One key's question older than 250 of another key's must still be in its
// list: the filter runs before the limit.
func TestQuestionListFiltersBeforeTheLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start := time.Now().Add(-time.Hour)
	at := func(d time.Duration) func(*gates.Question) {
		return func(q *gates.Question) { q.CreatedAt, q.ExpiresAt = start.Add(d), start.Add(d+24*time.Hour) }
	}
	b.ask(t, "alice", "alice", at(0))
	for i := range 250 {
		b.ask(t, fmt.Sprintf("bob%03d", i), "bob", at(time.Duration(i+1)*time.Second))
	}
	byAlice := func(q *gates.Question) bool { return q.RequestedBy == "alice" }
	got, err := b.q.ListWhere(t.Context(), gates.QuestionPending, 200, byAlice)
	if err != nil || len(got) != 1 || got[0].ID != "alice" {
		t.Fatalf("alice's list = %v, %v", got, err)
	}
	all, err := b.q.ListWhere(t.Context(), "", 500, nil)
	if err != nil || len(all) != 50 || all[0].ID != "bob249" {
		t.Fatalf("a limit past the bound lists the default 50 newest: %d, %v", len(all), err)
	}
	all, _ = b.q.List(t.Context(), "", gates.MaxQuestionList)
	if len(all) != gates.MaxQuestionList {
		t.Fatalf("list = %d", len(all))
	}
}
