package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// questionQueue is a question queue of its own for API tests: no engine
// asks, the test does (Ask), and the hooks record what they are told.
type questionQueue struct {
	*gates.Questions
	mu      sync.Mutex
	events  []string
	resumed []string
	metrics *api.Metrics // set by withQuestions, once setup made them
}

// The answerers of the test connections: "named" names bob, "self" names
// alice (so she may answer what her own runs are asked), "mem" none.
var testAnswerers = map[string][]string{"named": {"bob"}, "self": {"alice"}}

// redactedMarker stands in a secret value the redactor knows.
const redactedMarker = "s3cret-value-xyz"

func newQuestionQueue(t testing.TB) *questionQueue {
	t.Helper()
	qq := &questionQueue{}
	qq.Questions = gates.NewQuestions(storetest.New(t), gates.QuestionHooks{
		Resume: func(_ context.Context, exec string) error {
			qq.mu.Lock()
			defer qq.mu.Unlock()
			qq.resumed = append(qq.resumed, exec)
			return nil
		},
		Emit: func(_ context.Context, _, typ string, data map[string]any) {
			raw, _ := json.Marshal(data)
			qq.mu.Lock()
			defer qq.mu.Unlock()
			qq.events = append(qq.events, typ+" "+string(raw))
		},
		Answerers: func(connection string) []string { return testAnswerers[connection] },
		Redact: func(v any) any {
			raw, _ := json.Marshal(v)
			var out any
			_ = json.Unmarshal([]byte(strings.ReplaceAll(string(raw), redactedMarker, "<redacted>")), &out)
			return out
		},
		Observe: func(s gates.QuestionState) {
			qq.mu.Lock()
			m := qq.metrics
			qq.mu.Unlock()
			if m != nil {
				m.QuestionEntered(string(s))
			}
		},
	})
	return qq
}

// withQuestions serves qq under /v1/questions and counts its states in the
// server's metrics.
func withQuestions(qq *questionQueue) func(*api.Options) {
	return func(o *api.Options) {
		o.Questions = qq.Questions
		qq.mu.Lock()
		qq.metrics = o.Metrics
		qq.mu.Unlock()
	}
}

// questionForm is the form the tests' questions ask.
const questionForm = `{"type":"object","properties":{
	"name":{"type":"string","minLength":2},
	"email":{"type":"string","format":"email"},
	"size":{"type":"string","enum":["s","m","l"]}},"required":["name","email"]}`

// goodAnswer and badAnswer are bodies of POST …/answer for questionForm.
const (
	goodAnswer = `{"content":{"name":"Ada","email":"ada@example.com","size":"m"}}`
	badAnswer  = `{"content":{"name":"A","size":"xl","nick":"x"}}`
)

// ask puts a form question to an execution of by on connection.
func (qq *questionQueue) ask(t testing.TB, key, exec, by, connection string) string {
	t.Helper()
	var schema map[string]any
	if err := json.Unmarshal([]byte(questionForm), &schema); err != nil {
		t.Fatal(err)
	}
	qu, err := qq.Ask(context.Background(), &gates.Question{ID: gates.QuestionID(exec, key), Execution: exec, Step: "s",
		Connection: connection, Mode: gates.ModeForm, Message: "who are you?", RequestedSchema: schema, RequestedBy: by})
	if err != nil {
		t.Fatal(err)
	}
	return qu.ID
}

// askURL puts a URL question to an execution of by.
func (qq *questionQueue) askURL(t testing.TB, key, exec, by string) string {
	t.Helper()
	qu, err := qq.Ask(context.Background(), &gates.Question{ID: gates.QuestionID(exec, key), Execution: exec, Step: "s",
		Connection: "mem", Mode: gates.ModeURL, Message: "pay here", URL: "https://pay.example.com/c/1", ElicitationID: "el-1", RequestedBy: by})
	if err != nil {
		t.Fatal(err)
	}
	return qu.ID
}

var askN struct {
	sync.Mutex
	n int
}

// freshKey names a question no other cell asked.
func freshKey() string {
	askN.Lock()
	defer askN.Unlock()
	askN.n++
	return fmt.Sprintf("k%d", askN.n)
}

// exerciseQuestions drives every /v1/questions route as the test key (an
// admin, so it may answer what alice's runs are asked).
func exerciseQuestions(t *testing.T, b *bundle, qq *questionQueue) {
	t.Helper()
	const jsonCT = "application/json"
	a := qq.ask(t, "a", "ex_q1", "alice", "mem")
	if r := b.do(t, "GET", "/v1/questions?state=pending&limit=10", "", ""); r.status != 200 || len(r.json(t)["items"].([]any)) != 1 {
		t.Fatalf("GET questions = %d %s", r.status, r.body)
	}
	if r := b.do(t, "GET", "/v1/questions?state=asked", "", ""); r.status != 422 {
		t.Fatalf("GET questions?state=asked = %d %s", r.status, r.body)
	}
	if r := b.do(t, "GET", "/v1/questions/"+a, "", ""); r.status != 200 || r.json(t)["mode"] != "form" || r.json(t)["requestedSchema"] == nil {
		t.Fatalf("GET question = %d %s", r.status, r.body)
	}
	if r := b.do(t, "GET", "/v1/questions/qs_nope", "", ""); r.status != 404 || r.json(t)["code"] != "QUESTION_NOT_FOUND" {
		t.Fatalf("GET missing question = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/questions/"+a+"/answer", jsonCT, badAnswer); r.status != 422 || r.json(t)["code"] != "VALIDATION_FAILED" {
		t.Fatalf("bad answer = %d %s", r.status, r.body)
	}
	r := b.do(t, "POST", "/v1/questions/"+a+"/answer", jsonCT, goodAnswer)
	if r.status != 200 || r.json(t)["state"] != "answered" || r.json(t)["answeredBy"] != "tester" {
		t.Fatalf("answer = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/questions/"+a+"/decline", jsonCT, `{"reason":"changed my mind"}`); r.status != 409 || r.json(t)["code"] != "QUESTION_DECIDED" {
		t.Fatalf("decline after answer = %d %s", r.status, r.body)
	}
	d := qq.ask(t, "d", "ex_q1", "alice", "mem")
	if r := b.do(t, "POST", "/v1/questions/"+d+"/decline", jsonCT, `{"reason":"not today"}`); r.status != 200 || r.json(t)["reason"] != "not today" {
		t.Fatalf("decline = %d %s", r.status, r.body)
	}
	c := qq.ask(t, "c", "ex_q1", "alice", "mem")
	if r := b.do(t, "POST", "/v1/questions/"+c+"/cancel", jsonCT, `{}`); r.status != 200 || r.json(t)["state"] != "cancelled" {
		t.Fatalf("cancel = %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/questions/"+c+"/answer", jsonCT, goodAnswer); r.status != 409 {
		t.Fatalf("answer after cancel = %d %s", r.status, r.body)
	}
	r = b.do(t, "GET", "/metrics", "", "")
	for _, want := range []string{`patchbay_questions_total{state="asked"} 3`, `patchbay_questions_total{state="answered"} 1`,
		`patchbay_questions_total{state="declined"} 1`, `patchbay_questions_total{state="cancelled"} 1`, `patchbay_questions_total{state="expired"} 0`} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestQuestions drives the question routes end to end as each kind of key.
func TestQuestions(t *testing.T) {
	t.Parallel()
	qq := newQuestionQueue(t)
	b := setup(t, withQuestions(qq))
	const jsonCT = "application/json"
	as := func(key string) []string { return []string{"Authorization", "Bearer " + key} }
	items := func(t *testing.T, key, query string) []string {
		t.Helper()
		r := b.do(t, "GET", "/v1/questions"+query, "", "", as(key)...)
		if r.status != 200 {
			t.Fatalf("GET questions as %s = %d %s", key, r.status, r.body)
		}
		var ids []string
		for _, it := range r.json(t)["items"].([]any) {
			ids = append(ids, it.(map[string]any)["id"].(string))
		}
		return ids
	}

	mem := qq.ask(t, "mem", "ex_alice", "alice", "mem")        // no answerers: the approve role
	named := qq.ask(t, "named", "ex_alice", "alice", "named")  // bob answers
	self := qq.ask(t, "self", "ex_alice", "alice", "self")     // alice answers for herself
	bobs := qq.ask(t, "bobs", "ex_bob", "bob", "mem")          // bob's own run was asked
	pay := qq.askURL(t, "pay", "ex_alice", "alice")            // a URL to open
	secret := qq.ask(t, "secret", "ex_alice", "alice", "self") // answered with a secret value

	t.Run("lists what each key may see", func(t *testing.T) {
		for _, tc := range []struct {
			key  string
			want []string
		}{
			{"alice-key", []string{secret, pay, self, named, mem}},
			{"bob-key", []string{bobs, named}}, // his own, and one he is named to answer
			{"auditor-key", []string{secret, pay, bobs, self, named, mem}},
			{"approver-key", []string{secret, pay, bobs, self, named, mem}},
			{"pusher-key", nil},
		} {
			// Asked within one millisecond, they have no order to check.
			got := items(t, tc.key, "")
			slices.Sort(got)
			slices.Sort(tc.want)
			if !slices.Equal(got, tc.want) {
				t.Errorf("%s sees %v, want %v", tc.key, got, tc.want)
			}
		}
		if got := items(t, "alice-key", "?limit=2&state=pending"); len(got) != 2 {
			t.Errorf("limit=2: %v", got)
		}
	})

	t.Run("get answers 404 for what a key may not see", func(t *testing.T) {
		for _, tc := range []struct {
			key, id string
			want    int
		}{
			{"alice-key", mem, 200}, {"bob-key", mem, 404}, {"auditor-key", mem, 200}, {"approver-key", mem, 200}, {"pusher-key", mem, 404},
			{"bob-key", named, 200}, {"bob-key", bobs, 200}, {"alice-key", bobs, 404},
		} {
			r := b.do(t, "GET", "/v1/questions/"+tc.id, "", "", as(tc.key)...)
			if r.status != tc.want {
				t.Errorf("GET %s as %s = %d, want %d", tc.id, tc.key, r.status, tc.want)
			}
			if r.status == 404 && r.json(t)["code"] != "QUESTION_NOT_FOUND" {
				t.Errorf("404 code = %s", r.body)
			}
		}
	})

	t.Run("bad content is 422 naming each field", func(t *testing.T) {
		r := b.do(t, "POST", "/v1/questions/"+mem+"/answer", jsonCT, badAnswer, as("approver-key")...)
		if r.status != 422 || r.json(t)["code"] != "VALIDATION_FAILED" {
			t.Fatalf("bad answer = %d %s", r.status, r.body)
		}
		var paths []string
		for _, e := range r.json(t)["errors"].([]any) {
			paths = append(paths, e.(map[string]any)["path"].(string))
		}
		if want := "/content/email,/content/name,/content/nick,/content/size"; strings.Join(paths, ",") != want {
			t.Fatalf("paths = %v, want %s", paths, want)
		}
		for body, path := range map[string]string{
			`{"content":"Ada"}`:          "/content",
			`{"content":{},"x":1}`:       "/x",
			`{"content":{"name":1e400}}`: "/content/name",
		} {
			r := b.do(t, "POST", "/v1/questions/"+mem+"/answer", jsonCT, body, as("approver-key")...)
			if r.status/100 != 4 || !strings.Contains(string(r.body), `"path":"`+path+`"`) {
				t.Errorf("%s = %d %s; want a problem at %s", body, r.status, r.body, path)
			}
		}
		if r := b.do(t, "GET", "/v1/questions/"+mem, "", "", as("approver-key")...); r.json(t)["state"] != "pending" {
			t.Fatalf("a refused answer decided the question: %s", r.body)
		}
	})

	t.Run("who may decide", func(t *testing.T) {
		for _, tc := range []struct {
			key, id, route, body string
			want                 int
			code                 string
		}{
			{"alice-key", mem, "answer", goodAnswer, 409, "QUESTION_SELF"},
			{"alice-key", mem, "decline", "", 409, "QUESTION_SELF"},
			{"auditor-key", mem, "answer", goodAnswer, 403, "FORBIDDEN"},
			{"bob-key", mem, "cancel", "", 404, "QUESTION_NOT_FOUND"},
			{"pusher-key", mem, "answer", goodAnswer, 404, "QUESTION_NOT_FOUND"},
			{"approver-key", named, "answer", goodAnswer, 403, "FORBIDDEN"}, // the connection names bob
			{"approver-key", bobs, "cancel", "", 200, ""},
			{"bob-key", named, "answer", goodAnswer, 200, ""},
			{"alice-key", self, "answer", goodAnswer, 200, ""}, // named by name: she answers herself
		} {
			ct := ""
			if tc.body != "" {
				ct = jsonCT
			}
			r := b.do(t, "POST", "/v1/questions/"+tc.id+"/"+tc.route, ct, tc.body, as(tc.key)...)
			if r.status != tc.want || (tc.code != "" && r.json(t)["code"] != tc.code) {
				t.Errorf("%s %s as %s = %d %s, want %d %s", tc.route, tc.id, tc.key, r.status, r.body, tc.want, tc.code)
			}
		}
	})

	t.Run("decided once", func(t *testing.T) {
		r := b.do(t, "POST", "/v1/questions/"+mem+"/answer", jsonCT, goodAnswer, as("approver-key")...)
		if r.status != 200 || r.json(t)["state"] != "answered" || r.json(t)["content"].(map[string]any)["name"] != "Ada" {
			t.Fatalf("answer = %d %s", r.status, r.body)
		}
		if r = b.do(t, "POST", "/v1/questions/"+mem+"/answer", jsonCT, goodAnswer, as("approver-key")...); r.status != 200 {
			t.Fatalf("the same answer again = %d %s", r.status, r.body)
		}
		for route, body := range map[string]string{"answer": `{"content":{"name":"Bob","email":"bob@example.com"}}`, "decline": "", "cancel": `{}`} {
			ct := ""
			if body != "" {
				ct = jsonCT
			}
			if r = b.do(t, "POST", "/v1/questions/"+mem+"/"+route, ct, body, as("approver-key")...); r.status != 409 || r.json(t)["code"] != "QUESTION_DECIDED" {
				t.Errorf("%s after answer = %d %s", route, r.status, r.body)
			}
		}
	})

	t.Run("decline and its reason", func(t *testing.T) {
		d := qq.ask(t, "decline", "ex_alice", "alice", "mem")
		long := `{"reason":"` + strings.Repeat("x", 2001) + `"}`
		if r := b.do(t, "POST", "/v1/questions/"+d+"/decline", jsonCT, long, as("approver-key")...); r.status != 422 {
			t.Fatalf("long reason = %d %s", r.status, r.body)
		}
		r := b.do(t, "POST", "/v1/questions/"+d+"/decline", jsonCT, `{"reason":"not mine to say"}`, as("approver-key")...)
		if r.status != 200 || r.json(t)["state"] != "declined" || r.json(t)["reason"] != "not mine to say" || r.json(t)["answeredBy"] != "approver" {
			t.Fatalf("decline = %d %s", r.status, r.body)
		}
		if r := b.do(t, "POST", "/v1/questions/"+d+"/cancel", jsonCT, `{"why":1}`, as("approver-key")...); r.status != 422 {
			t.Fatalf("cancel with a member = %d %s", r.status, r.body)
		}
	})

	t.Run("a url question is answered without content", func(t *testing.T) {
		if r := b.do(t, "POST", "/v1/questions/"+pay+"/answer", jsonCT, `{"content":{"paid":true}}`, as("approver-key")...); r.status != 422 {
			t.Fatalf("url answer with content = %d %s", r.status, r.body)
		}
		r := b.do(t, "POST", "/v1/questions/"+pay+"/answer", "", "", as("approver-key")...)
		if r.status != 200 || r.json(t)["state"] != "answered" || r.json(t)["url"] != "https://pay.example.com/c/1" {
			t.Fatalf("url answer = %d %s", r.status, r.body)
		}
	})

	t.Run("answers are shown redacted and never emitted", func(t *testing.T) {
		body := `{"content":{"name":"` + redactedMarker + `","email":"ada@example.com"}}`
		if r := b.do(t, "POST", "/v1/questions/"+secret+"/answer", jsonCT, body, as("alice-key")...); r.status != 200 || strings.Contains(string(r.body), redactedMarker) {
			t.Fatalf("answer = %d %s", r.status, r.body)
		}
		for _, key := range []string{"alice-key", "auditor-key"} {
			r := b.do(t, "GET", "/v1/questions/"+secret, "", "", as(key)...)
			if r.json(t)["content"].(map[string]any)["name"] != "<redacted>" {
				t.Errorf("GET as %s = %s", key, r.body)
			}
			if r = b.do(t, "GET", "/v1/questions?state=answered", "", "", as(key)...); strings.Contains(string(r.body), redactedMarker) {
				t.Errorf("list as %s shows the secret: %s", key, r.body)
			}
		}
		if stored, _ := qq.Get(context.Background(), secret); stored.Content["name"] != redactedMarker {
			t.Fatalf("the run's copy of the answer = %v", stored.Content)
		}
		qq.mu.Lock()
		defer qq.mu.Unlock()
		for _, ev := range qq.events {
			if strings.Contains(ev, redactedMarker) || strings.Contains(ev, "ada@example.com") {
				t.Fatalf("an event carries an answer: %s", ev)
			}
		}
	})
}

// Without a question queue the routes are there and know no question.
func TestQuestionsWithoutQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if r := b.do(t, "GET", "/v1/questions", "", ""); r.status != 200 || len(r.json(t)["items"].([]any)) != 0 {
		t.Fatalf("GET questions = %d %s", r.status, r.body)
	}
	for _, req := range [][2]string{{"GET", "/v1/questions/qs_x"}, {"POST", "/v1/questions/qs_x/answer"}, {"POST", "/v1/questions/qs_x/decline"}, {"POST", "/v1/questions/qs_x/cancel"}} {
		if r := b.do(t, req[0], req[1], "", ""); r.status != 404 || r.json(t)["code"] != "QUESTION_NOT_FOUND" {
			t.Errorf("%s %s = %d %s", req[0], req[1], r.status, r.body)
		}
	}
}
