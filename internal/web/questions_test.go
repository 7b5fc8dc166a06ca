package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/chromedp/chromedp"

	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

// questionSchema is the form the questions of these tests ask: every
// kind of field a form may have.
const questionSchema = `{"type":"object","properties":{
	"name":{"type":"string","title":"Your name","description":"As on the ticket","minLength":2,"maxLength":40},
	"email":{"type":"string","format":"email"},
	"size":{"type":"string","title":"Size","oneOf":[{"const":"s","title":"Small"},{"const":"m","title":"Medium"},{"const":"l","title":"Large"}],"default":"m"},
	"count":{"type":"integer","title":"How many","minimum":1,"maximum":10,"default":2},
	"ratio":{"type":"number","minimum":0,"maximum":1},
	"urgent":{"type":"boolean","title":"Urgent"},
	"tags":{"type":"array","title":"Tags","items":{"type":"string","enum":["red","green","blue"]}},
	"due":{"type":"string","format":"date-time"}},
	"required":["name","size","count"]}`

var questionN atomic.Int64

// askQuestion puts a pending form question with schema, asked by the
// execution of by, to the queue, as the engine would.
func askQuestion(t testing.TB, b *bundle, by, message, schema string) *gates.Question {
	t.Helper()
	var s map[string]any
	must(t, json.Unmarshal([]byte(schema), &s))
	exec := fmt.Sprintf("ex_q%d", questionN.Add(1))
	qu, err := b.execs.Questions().Ask(context.Background(), &gates.Question{ID: gates.QuestionID(exec, "ask"), Execution: exec, Step: "ask",
		Connection: "mem", Mode: gates.ModeForm, Message: message, RequestedSchema: s, RequestedBy: by, ExpiresAt: time.Now().Add(time.Hour)})
	must(t, err)
	return qu
}

// askURLQuestion puts a pending URL question of by to the queue.
func askURLQuestion(t testing.TB, b *bundle, by string) *gates.Question {
	t.Helper()
	exec := fmt.Sprintf("ex_q%d", questionN.Add(1))
	qu, err := b.execs.Questions().Ask(context.Background(), &gates.Question{ID: gates.QuestionID(exec, "ask"), Execution: exec, Step: "ask",
		Connection: "mem", Mode: gates.ModeURL, Message: "Approve the payment", URL: "https://pay.example.com/c/1?x=<y>",
		ElicitationID: "el-1", RequestedBy: by, ExpiresAt: time.Now().Add(time.Hour)})
	must(t, err)
	return qu
}

func question(t testing.TB, b *bundle, id string) *gates.Question {
	t.Helper()
	qu, err := b.execs.Questions().Get(context.Background(), id)
	must(t, err)
	return qu
}

// field finds the input of a question's property.
func field(qu *gates.Question, name string) string {
	return `#question-` + qu.ID + ` [name="field:` + name + `"]`
}

// goodValues fill questionSchema's form validly.
func goodValues() url.Values {
	return url.Values{"field:name": {"Ada"}, "field:email": {"ada@example.com"}, "field:size": {"l"}, "field:count": {"3"},
		"field:ratio": {"0.25"}, "field:urgent": {"true"}, "field:tags": {"red", "blue"}, "field:due": {"2026-07-28T14:30"}}
}

func TestQuestionsPage(t *testing.T) {
	t.Parallel()
	b := setup(t, roleUsers()...)
	c := signIn(t, b)

	t.Run("lists a pending question with its form", func(t *testing.T) {
		qu := askQuestion(t, b, "ci-bot", "Who ships this? <script>alert(1)</script>", questionSchema)
		p := c.get("/admin/questions")
		if p.status != http.StatusOK {
			t.Fatalf("status %d", p.status)
		}
		if text(p.doc.Find(`nav a[aria-current="page"]`)) != "Questions" {
			t.Error("the navigation does not mark Questions")
		}
		card := p.doc.Find(`#pending-questions article[data-question="` + qu.ID + `"]`)
		if card.Length() != 1 {
			t.Fatalf("pending card missing: %s", text(p.doc.Find("#pending-questions")))
		}
		// The message is text, escaped, never markup.
		if got := card.Find(".question-message").Text(); got != qu.Message || card.Find("script").Length() != 0 {
			t.Fatalf("message %q", got)
		}
		dl := text(card.Find("dl"))
		for _, want := range []string{qu.Execution, "ask", "ci-bot", "expires " + qu.ExpiresAt.UTC().Format("2006-01-02 15:04:05 UTC")} {
			if !strings.Contains(dl, want) {
				t.Errorf("card lacks %q: %s", want, dl)
			}
		}
		if href, _ := card.Find("dl a").Attr("href"); href != "/admin/executions/"+qu.Execution {
			t.Errorf("execution link %q", href)
		}
		if text(card.Find("h3")) != "mem asks" {
			t.Errorf("heading %q", text(card.Find("h3")))
		}

		attr := func(sel, name string) string {
			v, ok := p.doc.Find(sel).Attr(name)
			if !ok {
				return "<none>"
			}
			return v
		}
		for _, c := range []struct{ sel, attr, want string }{
			{field(qu, "name"), "type", "text"},
			{field(qu, "name"), "minlength", "2"},
			{field(qu, "name"), "maxlength", "40"},
			{field(qu, "name"), "required", ""},
			{field(qu, "email"), "type", "email"},
			{field(qu, "email"), "required", "<none>"},
			{field(qu, "due"), "type", "datetime-local"},
			{field(qu, "count"), "type", "number"},
			{field(qu, "count"), "step", "1"},
			{field(qu, "count"), "min", "1"},
			{field(qu, "count"), "max", "10"},
			{field(qu, "count"), "value", "2"},
			{field(qu, "ratio"), "step", "any"},
			{field(qu, "ratio"), "max", "1"},
			{field(qu, "urgent"), "type", "checkbox"},
			{field(qu, "urgent"), "checked", "<none>"},
		} {
			if got := attr(c.sel, c.attr); got != c.want {
				t.Errorf("%s %s = %q, want %q", c.sel, c.attr, got, c.want)
			}
		}
		// The select offers the oneOf's consts labelled by their titles,
		// its default chosen.
		var opts []string
		p.doc.Find(field(qu, "size") + " option").Each(func(_ int, o *goquery.Selection) {
			v, _ := o.Attr("value")
			_, sel := o.Attr("selected")
			opts = append(opts, fmt.Sprintf("%s=%s:%v", v, text(o), sel))
		})
		if got := strings.Join(opts, " "); got != "s=Small:false m=Medium:true l=Large:false" {
			t.Errorf("size options %s", got)
		}
		if n := p.doc.Find(field(qu, "tags") + `[type="checkbox"]`).Length(); n != 3 {
			t.Errorf("tags: %d checkboxes", n)
		}
		// Titles label the inputs, descriptions describe them, required
		// fields say so.
		nameID := attr(field(qu, "name"), "id")
		label := text(p.doc.Find(`label[for="` + nameID + `"]`))
		if label != "Your name (required)" {
			t.Errorf("name label %q", label)
		}
		if text(p.doc.Find("#"+attr(field(qu, "name"), "aria-describedby"))) != "As on the ticket" {
			t.Error("the name's description is not its hint")
		}
		if l := text(p.doc.Find(`label[for="` + attr(field(qu, "email"), "id") + `"]`)); l != "email" {
			t.Errorf("email label %q", l)
		}
		for _, a := range []string{"answer", "decline", "cancel"} {
			if card.Find(`[action="/admin/questions/`+qu.ID+`/`+a+`"], [formaction="/admin/questions/`+qu.ID+`/`+a+`"]`).Length() != 1 {
				t.Errorf("no %s action", a)
			}
		}
		// The live list: the stream and the fragment it fetches.
		if v, _ := p.doc.Find("[sse-connect]").Attr("sse-connect"); !strings.HasPrefix(v, "/admin/questions/stream?v=") {
			t.Errorf("sse-connect %q", v)
		}
		if f := c.get("/admin/questions/pending"); f.doc.Find(`article[data-question="`+qu.ID+`"] form`).Length() != 2 {
			t.Error("the fragment lacks the question's forms")
		}
	})

	t.Run("a valid form answers it with typed values", func(t *testing.T) {
		qu := askQuestion(t, b, "ci-bot", "Who ships this?", questionSchema)
		c.get("/admin/questions")
		p := c.post("/admin/questions/"+qu.ID+"/answer", goodValues())
		if p.status != http.StatusSeeOther || p.header.Get("Location") != "/admin/questions?flash=question-answered" {
			t.Fatalf("answer: %d %s", p.status, p.header.Get("Location"))
		}
		got := question(t, b, qu.ID)
		if got.State != gates.QuestionAnswered || got.AnsweredBy != "admin" {
			t.Fatalf("question %s by %q", got.State, got.AnsweredBy)
		}
		raw, _ := json.Marshal(got.Content)
		const want = `{"count":3,"due":"2026-07-28T14:30:00Z","email":"ada@example.com","name":"Ada","ratio":0.25,"size":"l","tags":["red","blue"],"urgent":true}`
		if string(raw) != want {
			t.Fatalf("content %s, want %s", raw, want)
		}
		if _, ok := got.Content["count"].(float64); !ok {
			t.Errorf("count is %T", got.Content["count"])
		}
		if _, ok := got.Content["tags"].([]any); !ok {
			t.Errorf("tags is %T", got.Content["tags"])
		}
		p = c.get("/admin/questions?flash=question-answered")
		if !strings.HasPrefix(text(p.doc.Find(".flash")), "Answered.") {
			t.Errorf("flash %q", text(p.doc.Find(".flash")))
		}
		if p.doc.Find(`#pending-questions article[data-question="`+qu.ID+`"]`).Length() != 0 {
			t.Error("an answered question is still pending")
		}
		row := p.doc.Find(`#question-history tr[data-question="` + qu.ID + `"]`)
		if text(row.Find(".badge")) != "answered" || !strings.Contains(text(row), "admin") || !strings.Contains(row.Find("pre").Text(), `"Ada"`) {
			t.Errorf("history row %q", text(row))
		}
		// Answering again: already answered.
		p = c.post("/admin/questions/"+qu.ID+"/answer", goodValues())
		if p.header.Get("Location") != "/admin/questions?flash=question-decided" {
			t.Fatalf("second answer: %s", p.header.Get("Location"))
		}
		if p := c.get("/admin/questions?flash=question-decided"); !strings.Contains(text(p.doc.Find(".flash.bad")), "already answered") {
			t.Errorf("decided flash %q", text(p.doc.Find(".flash")))
		}
	})

	t.Run("unchecked boxes are false and empty optional fields are left out", func(t *testing.T) {
		qu := askQuestion(t, b, "ci-bot", "Who?", questionSchema)
		p := c.post("/admin/questions/"+qu.ID+"/answer", url.Values{"field:name": {"Bo"}, "field:size": {"s"}, "field:count": {"1"},
			"field:email": {""}, "field:ratio": {""}, "field:due": {""}})
		if p.status != http.StatusSeeOther {
			t.Fatalf("answer: %d %s", p.status, text(p.doc.Find(".errors")))
		}
		raw, _ := json.Marshal(question(t, b, qu.ID).Content)
		if string(raw) != `{"count":1,"name":"Bo","size":"s","urgent":false}` {
			t.Fatalf("content %s", raw)
		}
	})

	t.Run("invalid values are shown again with each field's message", func(t *testing.T) {
		qu := askQuestion(t, b, "ci-bot", "Who ships this?", questionSchema)
		c.get("/admin/questions")
		bad := goodValues()
		bad.Set("field:name", "A")
		bad.Set("field:count", "2.5")
		bad.Set("field:email", "not-an-address")
		bad.Del("field:size")
		p := c.post("/admin/questions/"+qu.ID+"/answer", bad)
		if p.status != http.StatusUnprocessableEntity {
			t.Fatalf("status %d", p.status)
		}
		// The messages are the queue's own, for the same content.
		var schema map[string]any
		must(t, json.Unmarshal([]byte(questionSchema), &schema))
		problems := gates.ValidateAnswer(schema, map[string]any{"name": "A", "count": 2.5, "email": "not-an-address", "ratio": 0.25,
			"urgent": true, "tags": []any{"red", "blue"}, "due": "2026-07-28T14:30:00Z"})
		if len(problems) != 4 {
			t.Fatalf("problems %v", problems)
		}
		for _, pr := range problems {
			name := strings.TrimPrefix(pr.Path, "/content/")
			box := p.doc.Find(`#question-` + qu.ID + ` [data-field="` + name + `"]`)
			if got := text(box.Find(".field-error")); got != pr.Message {
				t.Errorf("%s: message %q, want %q", name, got, pr.Message)
			}
			if v, _ := box.Find(`[name="field:` + name + `"]`).Attr("aria-invalid"); v != "true" {
				t.Errorf("%s not marked invalid", name)
			}
		}
		if text(p.doc.Find(`#answer-`+qu.ID+`-errors`)) == "" {
			t.Error("no error summary")
		}
		// What was typed is kept.
		if v, _ := p.doc.Find(field(qu, "name")).Attr("value"); v != "A" {
			t.Errorf("name kept as %q", v)
		}
		if v, _ := p.doc.Find(field(qu, "count")).Attr("value"); v != "2.5" {
			t.Errorf("count kept as %q", v)
		}
		if _, ok := p.doc.Find(field(qu, "urgent")).Attr("checked"); !ok {
			t.Error("urgent lost its tick")
		}
		var ticked []string
		p.doc.Find(field(qu, "tags") + "[checked]").Each(func(_ int, s *goquery.Selection) {
			v, _ := s.Attr("value")
			ticked = append(ticked, v)
		})
		if strings.Join(ticked, ",") != "red,blue" {
			t.Errorf("tags kept as %v", ticked)
		}
		if got := question(t, b, qu.ID); got.State != gates.QuestionPending {
			t.Fatalf("an invalid answer decided the question: %s", got.State)
		}
		// A number that is no number is named too.
		bad = goodValues()
		bad.Set("field:ratio", "lots")
		p = c.post("/admin/questions/"+qu.ID+"/answer", bad)
		if p.status != http.StatusUnprocessableEntity || text(p.doc.Find(`#question-`+qu.ID+` [data-field="ratio"] .field-error`)) != "must be a number" {
			t.Fatalf("ratio: %d %q", p.status, text(p.doc.Find(`#question-`+qu.ID+` [data-field="ratio"]`)))
		}
	})

	t.Run("a POST without the CSRF token is refused", func(t *testing.T) {
		qu := askQuestion(t, b, "ci-bot", "Who?", questionSchema)
		c.get("/admin/questions")
		for name, p := range map[string]page{
			"none":  c.do(http.MethodPost, "/admin/questions/"+qu.ID+"/answer", goodValues()),
			"wrong": c.do(http.MethodPost, "/admin/questions/"+qu.ID+"/decline", url.Values{"_csrf": {strings.Repeat("0", 64)}}),
			"cross-site": c.do(http.MethodPost, "/admin/questions/"+qu.ID+"/cancel", url.Values{"_csrf": {c.csrf}},
				"Sec-Fetch-Site", "cross-site"),
		} {
			if p.status != http.StatusForbidden {
				t.Errorf("%s: status %d, want 403", name, p.status)
			}
		}
		if got := question(t, b, qu.ID); got.State != gates.QuestionPending {
			t.Fatalf("a refused POST decided the question: %s", got.State)
		}
	})

	t.Run("the asker cannot answer its own question", func(t *testing.T) {
		qu := askQuestion(t, b, "approver", "Who?", questionSchema)
		approver := signInWith(t, b, "approver-key")
		p := approver.get("/admin/questions")
		card := p.doc.Find(`#pending-questions article[data-question="` + qu.ID + `"]`)
		if card.Length() != 1 || card.Find("form").Length() != 0 || !strings.Contains(text(card), "another person must answer") {
			t.Fatalf("the asker's card: %q", text(card))
		}
		for _, a := range []string{"answer", "decline", "cancel"} {
			p := approver.post("/admin/questions/"+qu.ID+"/"+a, goodValues())
			if p.status != http.StatusSeeOther || p.header.Get("Location") != "/admin/questions?flash=question-self" {
				t.Fatalf("%s as the asker: %d %s", a, p.status, p.header.Get("Location"))
			}
		}
		p = approver.get("/admin/questions?flash=question-self")
		if !strings.Contains(text(p.doc.Find(".flash.bad")), "another person must answer") {
			t.Errorf("self flash %q", text(p.doc.Find(".flash")))
		}
		if got := question(t, b, qu.ID); got.State != gates.QuestionPending {
			t.Fatalf("the asker decided its own question: %s", got.State)
		}
		// Another answerer may.
		if p := c.post("/admin/questions/"+qu.ID+"/answer", goodValues()); p.header.Get("Location") != "/admin/questions?flash=question-answered" {
			t.Fatalf("the operator answers: %d %s", p.status, p.header.Get("Location"))
		}
	})

	t.Run("who sees and who may answer", func(t *testing.T) {
		qu := askQuestion(t, b, "alice", "Who?", questionSchema)
		bob, auditor := signInWith(t, b, "bob-key"), signInWith(t, b, "auditor-key")
		if bob.get("/admin/questions").doc.Find(`[data-question="`+qu.ID+`"]`).Length() != 0 {
			t.Error("bob sees alice's question")
		}
		if p := bob.post("/admin/questions/"+qu.ID+"/answer", goodValues()); p.header.Get("Location") != "/admin/questions?flash=gone" {
			t.Errorf("bob answers: %d %s", p.status, p.header.Get("Location"))
		}
		p := auditor.get("/admin/questions")
		card := p.doc.Find(`#pending-questions article[data-question="` + qu.ID + `"]`)
		if card.Length() != 1 || card.Find("form").Length() != 0 {
			t.Errorf("the auditor's card: %q", text(card))
		}
		if p := auditor.post("/admin/questions/"+qu.ID+"/answer", goodValues()); p.status != http.StatusForbidden {
			t.Errorf("the auditor answers: %d", p.status)
		}
		if p := c.post("/admin/questions/qs_nope/answer", goodValues()); p.header.Get("Location") != "/admin/questions?flash=gone" {
			t.Errorf("a missing question: %s", p.header.Get("Location"))
		}
		if got := question(t, b, qu.ID); got.State != gates.QuestionPending {
			t.Fatalf("state %s", got.State)
		}
	})

	t.Run("a url question is answered by I have done it", func(t *testing.T) {
		qu := askURLQuestion(t, b, "ci-bot")
		p := c.get("/admin/questions")
		card := p.doc.Find(`#pending-questions article[data-question="` + qu.ID + `"]`)
		link := card.Find("a.question-url")
		href, _ := link.Attr("href")
		rel, _ := link.Attr("rel")
		target, _ := link.Attr("target")
		if href != qu.URL || rel != "noopener noreferrer" || target != "_blank" || text(link) != qu.URL {
			t.Fatalf("link href=%q rel=%q target=%q text=%q", href, rel, target, text(link))
		}
		if card.Find(`input[name^="field:"]`).Length() != 0 {
			t.Error("a url question shows form fields")
		}
		button := card.Find(`form[action="/admin/questions/` + qu.ID + `/answer"] button`)
		if text(button) != "I have done it" {
			t.Fatalf("button %q", text(button))
		}
		p = c.post("/admin/questions/"+qu.ID+"/answer", nil)
		if p.header.Get("Location") != "/admin/questions?flash=question-answered" {
			t.Fatalf("answer: %d %s", p.status, p.header.Get("Location"))
		}
		got := question(t, b, qu.ID)
		if got.State != gates.QuestionAnswered || len(got.Content) != 0 {
			t.Fatalf("question %s with %v", got.State, got.Content)
		}
	})

	t.Run("decline with a reason, and cancel", func(t *testing.T) {
		qu := askQuestion(t, b, "ci-bot", "Who?", questionSchema)
		p := c.post("/admin/questions/"+qu.ID+"/decline", url.Values{"reason": {"  not ours  "}})
		if p.header.Get("Location") != "/admin/questions?flash=question-declined" {
			t.Fatalf("decline: %d %s", p.status, p.header.Get("Location"))
		}
		if got := question(t, b, qu.ID); got.State != gates.QuestionDeclined || got.Reason != "not ours" || got.AnsweredBy != "admin" {
			t.Fatalf("declined: %s %q by %q", got.State, got.Reason, got.AnsweredBy)
		}
		row := c.get("/admin/questions?state=declined").doc.Find(`#question-history tr[data-question="` + qu.ID + `"]`)
		if !strings.Contains(text(row), "not ours") {
			t.Errorf("history row %q", text(row))
		}
		uq := askURLQuestion(t, b, "ci-bot")
		if p := c.post("/admin/questions/"+uq.ID+"/cancel", nil); p.header.Get("Location") != "/admin/questions?flash=question-cancelled" {
			t.Fatalf("cancel: %d %s", p.status, p.header.Get("Location"))
		}
		if got := question(t, b, uq.ID); got.State != gates.QuestionCancelled {
			t.Fatalf("cancelled: %s", got.State)
		}
	})
}

// TestQuestionsAuthorization: the question routes for the sessions of the
// admin authorization matrix (no session, alice and bob with run, an
// auditor with read, an approver, the operator), on a question alice's
// run asked.
func TestQuestionsAuthorization(t *testing.T) {
	t.Parallel()
	b := setup(t, roleUsers()...)
	sessions := []func(t *testing.T) *client{
		func(t *testing.T) *client { return newClient(t, b.url) },
		func(t *testing.T) *client { return signInWith(t, b, "alice-key") },
		func(t *testing.T) *client { return signInWith(t, b, "bob-key") },
		func(t *testing.T) *client { return signInWith(t, b, "auditor-key") },
		func(t *testing.T) *client { return signInWith(t, b, "approver-key") },
		func(t *testing.T) *client { return signInWith(t, b, adminToken) },
	}
	const (
		see = http.StatusSeeOther
		no  = http.StatusForbidden
		ok  = http.StatusOK
	)
	// Alice asked (sent back with flash=question-self), bob may not see it
	// (flash=gone), the auditor sees it but may not answer (403).
	for _, row := range []struct {
		method, path string
		want         [6]int
		flash        [6]string
	}{
		{"GET", "/admin/questions", [6]int{see, ok, ok, ok, ok, ok}, [6]string{}},
		{"GET", "/admin/questions/pending", [6]int{see, ok, ok, ok, ok, ok}, [6]string{}},
		{"GET", "/admin/questions/stream", [6]int{see, ok, ok, ok, ok, ok}, [6]string{}},
		{"POST", "/admin/questions/{q}/answer", [6]int{no, see, see, no, see, see}, [6]string{"", "question-self", "gone", "", "question-answered", "question-answered"}},
		{"POST", "/admin/questions/{q}/decline", [6]int{no, see, see, no, see, see}, [6]string{"", "question-self", "gone", "", "question-declined", "question-declined"}},
		{"POST", "/admin/questions/{q}/cancel", [6]int{no, see, see, no, see, see}, [6]string{"", "question-self", "gone", "", "question-cancelled", "question-cancelled"}},
	} {
		for i := range sessions {
			t.Run(fmt.Sprintf("%s %s as %d", row.method, row.path, i), func(t *testing.T) {
				c := sessions[i](t)
				qu := askURLQuestion(t, b, "alice")
				path := strings.ReplaceAll(row.path, "{q}", qu.ID)
				if row.method == http.MethodGet {
					if got := c.status(row.method, path); got != row.want[i] {
						t.Errorf("GET %s = %d, want %d", path, got, row.want[i])
					}
					return
				}
				p := c.post(path, nil)
				if p.status != row.want[i] {
					t.Fatalf("POST %s = %d, want %d", path, p.status, row.want[i])
				}
				if f := row.flash[i]; f != "" && p.header.Get("Location") != "/admin/questions?flash="+f {
					t.Errorf("POST %s went to %s, want flash=%s", path, p.header.Get("Location"), f)
				}
			})
		}
	}
}

// TestQuestionsBrowser: in headless Chromium, sign in, open the questions
// page, fill a form question's text field and select, and submit it.
func TestQuestionsBrowser(t *testing.T) {
	ctx := browser(t)
	b := setup(t)
	run := func(actions ...chromedp.Action) {
		t.Helper()
		if err := chromedp.Run(ctx, actions...); err != nil {
			t.Fatal(err)
		}
	}
	qu := askQuestion(t, b, "ci-bot", "Which region should the deploy go to?", `{"type":"object","properties":{
		"name":{"type":"string","title":"Release name","minLength":2},
		"region":{"type":"string","title":"Region","oneOf":[{"const":"eu-west","title":"Europe (west)"},{"const":"us-east","title":"US (east)"}]}},
		"required":["name","region"]}`)
	card := `#pending-questions article[data-question="` + qu.ID + `"]`
	run(chromedp.Navigate(b.url+"/admin"), chromedp.WaitVisible(`#token`, chromedp.ByQuery),
		chromedp.SendKeys(`#token`, adminToken, chromedp.ByQuery), chromedp.Submit(`#token`, chromedp.ByQuery),
		chromedp.WaitVisible(`#connections`, chromedp.ByQuery),
		chromedp.Click(`nav a[href="/admin/questions"]`, chromedp.ByQuery),
		chromedp.WaitVisible(card, chromedp.ByQuery),
		chromedp.SendKeys(card+` input[name="field:name"]`, "v1.4.2", chromedp.ByQuery),
		chromedp.SetValue(card+` select[name="field:region"]`, "us-east", chromedp.ByQuery),
		both("questions"),
		chromedp.Click(card+` form.answer button.primary`, chromedp.ByQuery),
		chromedp.WaitVisible(`.flash`, chromedp.ByQuery), chromedp.WaitVisible(`#no-questions`, chromedp.ByQuery))
	got := question(t, b, qu.ID)
	if got.State != gates.QuestionAnswered {
		t.Fatalf("question %s", got.State)
	}
	if raw, _ := json.Marshal(got.Content); string(raw) != `{"name":"v1.4.2","region":"us-east"}` {
		t.Fatalf("content %s", raw)
	}
}
