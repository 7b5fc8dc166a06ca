package web

// The questions upstream MCP servers ask mid-call (elicitations), as the
// admin UI shows them beside the approvals: the pending ones this session
// may see, live, each with a form built from the server's schema (or the
// URL to open) for those it may answer, and the history. Answers go
// through gates.Questions (Answer, Decline, Cancel), so who may answer,
// the checks on an answer and their messages are the API's. Everything
// shown passes through Questions.Redacted first.

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
)

var questionStates = []gates.QuestionState{gates.QuestionPending, gates.QuestionAnswered, gates.QuestionDeclined,
	gates.QuestionCancelled, gates.QuestionExpired}

// The question pages' flash messages, chosen by key as the others are.
// They are added here so the questions' words stay with their page.
func init() {
	maps.Copy(flashes, map[string]string{
		"question-answered":  "Answered. The server gets the answer and the call goes on.",
		"question-declined":  "Declined. The server is told no answer will come.",
		"question-cancelled": "Cancelled. The server is told the question was dismissed.",
	})
	maps.Copy(badFlashes, map[string]string{
		"question-decided": "That question was already answered (or declined, cancelled or expired).",
		"question-self":    "You asked this (your execution did); another person must answer it.",
	})
}

type questionsData struct {
	Pending []questionCard
	// Version fingerprints the pending list, so the live stream only
	// signals real changes.
	Version string
	Filter  string
	// History is redacted.
	History []*gates.Question
}

// questionCard is a pending question as one session sees it.
type questionCard struct {
	// Q is the question as people are shown it (Questions.Redacted).
	Q *gates.Question
	// MayAnswer: the session may answer, decline or cancel it.
	MayAnswer bool
	// Asker: the session's principal is the one whose execution asked.
	Asker bool
	// Fields are a form question's inputs, with the values to show.
	Fields []questionField
	// Problems are errors about the answer as a whole.
	Problems []string
}

func (qc questionCard) invalid() bool {
	if len(qc.Problems) > 0 {
		return true
	}
	for _, f := range qc.Fields {
		if len(f.Errors) > 0 {
			return true
		}
	}
	return false
}

// Kinds of form field.
const (
	kindText    = "text"
	kindSelect  = "select"
	kindNumber  = "number"
	kindInteger = "integer"
	kindBoolean = "boolean"
	kindMulti   = "multi"
)

// questionField is one property of a form question as an HTML input.
type questionField struct {
	// Name is the property's name in the schema and the answer.
	Name string
	// ID is the input's id; Input its name in the posted form ("field:"
	// and the property's name, so no property clashes with _csrf).
	ID, Input   string
	Label, Hint string
	Kind        string
	Format      string // a string's format: email, uri, date, date-time
	Required    bool
	MinLength   string
	MaxLength   string
	Min, Max    string
	Value       string // text, number and select
	Checked     bool   // boolean
	Options     []questionOption
	Errors      []string
}

type questionOption struct {
	Value, Label string
	Selected     bool
}

// inputType is the HTML input type of a text field.
func (f questionField) inputType() string {
	switch f.Format {
	case "email":
		return "email"
	case "uri":
		return "url"
	case "date":
		return "date"
	case "date-time":
		return "datetime-local"
	}
	return "text"
}

// describedBy names the hint and error elements of the field.
func (f questionField) describedBy() string {
	var ids []string
	if f.Hint != "" {
		ids = append(ids, f.ID+"-hint")
	}
	if len(f.Errors) > 0 {
		ids = append(ids, f.ID+"-err")
	}
	return strings.Join(ids, " ")
}

// attrs are the input's optional attributes: bounds, required, and its
// state for assistive technology. hx-preserve keeps what was typed when
// the live list is swapped.
func (f questionField) attrs() templ.Attributes {
	a := templ.Attributes{"hx-preserve": "true"}
	if d := f.describedBy(); d != "" {
		a["aria-describedby"] = d
	}
	if len(f.Errors) > 0 {
		a["aria-invalid"] = "true"
	}
	// A checkbox's required would demand it be ticked; unticked is false,
	// an answer too. A multi-select's "at least one" is the server's.
	if f.Required && f.Kind != kindBoolean && f.Kind != kindMulti {
		a["required"] = true
	}
	switch f.Kind {
	case kindText:
		if f.MinLength != "" {
			a["minlength"] = f.MinLength
		}
		if f.MaxLength != "" {
			a["maxlength"] = f.MaxLength
		}
		if f.Format == "date-time" {
			a["step"] = "1"
		}
	case kindNumber, kindInteger:
		a["step"] = "any"
		if f.Kind == kindInteger {
			a["step"] = "1"
		}
		if f.Min != "" {
			a["min"] = f.Min
		}
		if f.Max != "" {
			a["max"] = f.Max
		}
	}
	return a
}

// placeholder: a select without a value chosen offers an empty choice
// first, so nothing is picked for the person.
func (f questionField) placeholder() bool {
	if !f.Required {
		return true
	}
	return !slices.ContainsFunc(f.Options, func(o questionOption) bool { return o.Selected })
}

// questionFields reads a form question's schema (one CheckForm accepted
// when it was asked) into inputs showing its defaults. Properties come in
// name order: the schema reaches patchbay as a JSON object, whose order
// is not kept.
func questionFields(id string, schema map[string]any) []questionField {
	props, _ := schema["properties"].(map[string]any)
	required := map[string]bool{}
	if list, ok := schema["required"].([]any); ok {
		for _, r := range list {
			if s, ok := r.(string); ok {
				required[s] = true
			}
		}
	}
	out := make([]questionField, 0, len(props))
	for i, name := range slices.Sorted(maps.Keys(props)) {
		def, _ := props[name].(map[string]any)
		f := questionField{Name: name, ID: fmt.Sprintf("q-%s-%d", id, i), Input: "field:" + name, Label: name, Required: required[name]}
		if s, _ := def["title"].(string); s != "" {
			f.Label = s
		}
		f.Hint, _ = def["description"].(string)
		switch def["type"] {
		case "number":
			f.Kind = kindNumber
		case "integer":
			f.Kind = kindInteger
		case "boolean":
			f.Kind = kindBoolean
		case "array":
			f.Kind = kindMulti
			items, _ := def["items"].(map[string]any)
			f.Options = enumOptions(items["enum"], nil)
			if f.Options == nil {
				f.Options = constOptions(items["anyOf"])
			}
		default:
			f.Kind = kindText
			f.Format, _ = def["format"].(string)
			if opts := enumOptions(def["enum"], def["enumNames"]); opts != nil {
				f.Kind, f.Options = kindSelect, opts
			} else if opts := constOptions(def["oneOf"]); opts != nil {
				f.Kind, f.Options = kindSelect, opts
			}
		}
		switch f.Kind {
		case kindText:
			f.MinLength, f.MaxLength = numberText(def["minLength"]), numberText(def["maxLength"])
		case kindNumber, kindInteger:
			f.Min, f.Max = numberText(def["minimum"]), numberText(def["maximum"])
		}
		if d, has := def["default"]; has {
			f.show(d)
		}
		out = append(out, f)
	}
	return out
}

// enumOptions are a string enum's options, labelled by enumNames when the
// schema gives them; nil when v is no list.
func enumOptions(v, names any) []questionOption {
	list, ok := v.([]any)
	if !ok {
		return nil
	}
	labels, _ := names.([]any)
	out := make([]questionOption, 0, len(list))
	for i, x := range list {
		s := fmt.Sprint(x)
		o := questionOption{Value: s, Label: s}
		if i < len(labels) {
			if l, ok := labels[i].(string); ok && l != "" {
				o.Label = l
			}
		}
		out = append(out, o)
	}
	return out
}

// constOptions are the options of a oneOf or anyOf of {const, title}:
// the const is the value, the title its label.
func constOptions(v any) []questionOption {
	list, ok := v.([]any)
	if !ok {
		return nil
	}
	out := make([]questionOption, 0, len(list))
	for _, x := range list {
		opt, _ := x.(map[string]any)
		c, _ := opt["const"].(string)
		t, _ := opt["title"].(string)
		if t == "" {
			t = c
		}
		out = append(out, questionOption{Value: c, Label: t})
	}
	return out
}

// numberText is a JSON number as an HTML attribute value; "" for none.
func numberText(v any) string {
	n, ok := v.(float64)
	if !ok || math.IsNaN(n) || math.IsInf(n, 0) {
		return ""
	}
	return strconv.FormatFloat(n, 'f', -1, 64)
}

// show sets the field to display v, a value of its type (a default).
func (f *questionField) show(v any) {
	switch f.Kind {
	case kindBoolean:
		f.Checked = v == true
	case kindMulti:
		list, _ := v.([]any)
		for i := range f.Options {
			f.Options[i].Selected = slices.Contains(list, any(f.Options[i].Value))
		}
	case kindSelect:
		for i := range f.Options {
			f.Options[i].Selected = v == any(f.Options[i].Value)
		}
	case kindNumber, kindInteger:
		f.Value = numberText(v)
	default:
		s, _ := v.(string)
		if f.Format == "date-time" {
			s = localTime(s)
		}
		f.Value = s
	}
}

// The layouts a datetime-local input sends. Its value has no zone; the
// form says it is UTC.
var localLayouts = []string{"2006-01-02T15:04", "2006-01-02T15:04:05"}

// localTime is an RFC 3339 time as a datetime-local input's value, in
// UTC; other text as it is.
func localTime(s string) string {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return s
	}
	t = t.UTC()
	if t.Second() == 0 {
		return t.Format(localLayouts[0])
	}
	return t.Format(localLayouts[1])
}

// rfc3339 is a datetime-local input's value as an RFC 3339 time in UTC;
// other text (an RFC 3339 time typed by hand, or something wrong for the
// check to name) as it is.
func rfc3339(s string) string {
	for _, l := range localLayouts {
		if t, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			return t.Format(time.RFC3339)
		}
	}
	return s
}

// answerContent turns a posted form into the answer's content, typed as
// the schema says: numbers parsed, a boolean from its checkbox's
// presence, a multi-select as an array. An empty field is left out (so a
// required one is reported missing); a number that does not parse is kept
// as its text, for the check to name. fields are set to show what was
// posted, for a form shown again.
func answerContent(fields []questionField, form url.Values) map[string]any {
	content := map[string]any{}
	for i := range fields {
		f := &fields[i]
		vals := form[f.Input]
		v := ""
		if len(vals) > 0 {
			v = vals[0]
		}
		switch f.Kind {
		case kindBoolean:
			f.Checked = len(vals) > 0
			content[f.Name] = f.Checked
		case kindMulti:
			picked := []any{}
			for j := range f.Options {
				f.Options[j].Selected = slices.Contains(vals, f.Options[j].Value)
			}
			for _, x := range vals {
				picked = append(picked, x)
			}
			if len(picked) > 0 {
				content[f.Name] = picked
			}
		case kindSelect:
			for j := range f.Options {
				f.Options[j].Selected = f.Options[j].Value == v
			}
			if v != "" {
				content[f.Name] = v
			}
		case kindNumber, kindInteger:
			f.Value = v
			v = strings.TrimSpace(v)
			if v == "" {
				continue
			}
			if n, err := strconv.ParseFloat(v, 64); err == nil && !math.IsInf(n, 0) {
				content[f.Name] = n
			} else {
				content[f.Name] = v
			}
		default:
			f.Value = v
			if v == "" {
				continue
			}
			if f.Format == "date-time" {
				v = rfc3339(v)
			}
			content[f.Name] = v
		}
	}
	return content
}

// placeProblems shows each problem next to the field its path
// (/content/<field>) names, and the others above the form.
func placeProblems(qc *questionCard, problems []fault.FieldError) {
	for _, p := range problems {
		placed := false
		for i := range qc.Fields {
			if p.Path == "/content/"+fault.Escape(qc.Fields[i].Name) {
				qc.Fields[i].Errors = append(qc.Fields[i].Errors, p.Message)
				placed = true
				break
			}
		}
		if !placed {
			qc.Problems = append(qc.Problems, p.Message)
		}
	}
}

// seesQuestion is the API's rule: the questions its own executions asked,
// those its approve role reaches, all with read, and any it may answer (a
// key the connection's answerers name).
func (h *handler) seesQuestion(p authz.Principal, qu *gates.Question) bool {
	return p.SeesQuestion(qu.RequestedBy, qu.Connection) || h.Executions.Questions().MayAnswer(qu, p)
}

// pendingQuestions lists the pending questions this session may see.
func (h *handler) pendingQuestions(c echo.Context) ([]*gates.Question, error) {
	who := h.principal(c)
	return h.Executions.Questions().ListWhere(bg(c), gates.QuestionPending, gates.MaxQuestionList, func(qu *gates.Question) bool {
		return h.seesQuestion(who, qu)
	})
}

func questionsVersion(qs []*gates.Question) string {
	ids := make([]string, len(qs))
	for i, qu := range qs {
		ids[i] = qu.ID
	}
	return fmt.Sprintf("%d-%x", len(ids), hashString(strings.Join(ids, ",")))
}

// questionCards are the pending questions as this session sees them;
// failed, when set, stands for its question (a form shown again with what
// was posted and what is wrong with it).
func (h *handler) questionCards(c echo.Context, pending []*gates.Question, failed *questionCard) []questionCard {
	qs := h.Executions.Questions()
	who := h.principal(c)
	cards := make([]questionCard, 0, len(pending))
	for _, qu := range pending {
		if failed != nil && failed.Q.ID == qu.ID {
			cards = append(cards, *failed)
			continue
		}
		shown := qs.Redacted(qu)
		qc := questionCard{Q: shown, MayAnswer: qs.MayAnswer(qu, who), Asker: qu.RequestedBy == who.Name}
		if qu.Mode == gates.ModeForm {
			qc.Fields = questionFields(qu.ID, shown.RequestedSchema)
		}
		cards = append(cards, qc)
	}
	return cards
}

// questionsPageData is the whole page: the pending list (failed standing
// for its question, if set) and the history under the ?state= filter.
func (h *handler) questionsPageData(c echo.Context, failed *questionCard) (questionsData, error) {
	pending, err := h.pendingQuestions(c)
	if err != nil {
		return questionsData{}, err
	}
	d := questionsData{Pending: h.questionCards(c, pending, failed), Version: questionsVersion(pending), Filter: c.QueryParam("state")}
	state := gates.QuestionState(d.Filter)
	if !slices.Contains(questionStates, state) {
		state, d.Filter = "", ""
	}
	who := h.principal(c)
	qs := h.Executions.Questions()
	history, err := qs.ListWhere(bg(c), state, 100, func(qu *gates.Question) bool { return h.seesQuestion(who, qu) })
	if err != nil {
		return questionsData{}, err
	}
	for _, qu := range history {
		d.History = append(d.History, qs.Redacted(qu))
	}
	return d, nil
}

func (h *handler) questions(c echo.Context) error {
	d, err := h.questionsPageData(c, nil)
	if err != nil {
		return err
	}
	return h.render(c, http.StatusOK, questionsPage(h.page(c, "Questions", "questions"), d))
}

// questionsFragment is the pending list alone, fetched by htmx when the
// stream says it changed.
func (h *handler) questionsFragment(c echo.Context) error {
	pending, err := h.pendingQuestions(c)
	if err != nil {
		return err
	}
	return h.render(c, http.StatusOK, questionList(sessionOf(c).CSRF, h.questionCards(c, pending, nil), questionsVersion(pending)))
}

// questionsStream is a Server-Sent Events stream with one "changed" event
// whenever the set of pending questions this session sees differs from
// the version the page was rendered with (?v=), polled as the approvals'
// stream is and counted against the same caps.
func (h *handler) questionsStream(c echo.Context) error {
	return h.changedStream(c, func() (string, int, error) {
		pending, err := h.pendingQuestions(c)
		return questionsVersion(pending), len(pending), err
	})
}

const questionsPath = "/admin/questions"

// questionOutcome answers a refused decision as the approvals page does:
// back to the list with a flash saying why, or a 403 page.
func questionOutcome(c echo.Context, err error) error {
	switch {
	case errors.Is(err, gates.ErrQuestionNotFound):
		return c.Redirect(http.StatusSeeOther, questionsPath+"?flash=gone")
	case errors.Is(err, gates.ErrSelfAnswer):
		return c.Redirect(http.StatusSeeOther, questionsPath+"?flash=question-self")
	case errors.Is(err, gates.ErrNotAnswerer):
		return &refused{"You may not answer this question: it needs the approve role for this connection, and the connection's policy may name its answerers."}
	case errors.Is(err, gates.ErrQuestionDecided):
		return c.Redirect(http.StatusSeeOther, questionsPath+"?flash=question-decided")
	}
	return err
}

// seenQuestion is the question of the route's id if this session may see
// it; otherwise ErrQuestionNotFound, as for one that does not exist.
func (h *handler) seenQuestion(c echo.Context) (*gates.Question, error) {
	qu, err := h.Executions.Questions().Get(bg(c), c.Param("id"))
	if err != nil {
		return nil, err
	}
	if !h.seesQuestion(h.principal(c), qu) {
		return nil, fmt.Errorf("question %s: %w", qu.ID, gates.ErrQuestionNotFound)
	}
	return qu, nil
}

// answerQuestion accepts a question: a form's fields, typed and checked
// against its schema (shown again with 422 and each field's message when
// they do not pass), or nothing for a URL question ("I have done it").
func (h *handler) answerQuestion(c echo.Context) error {
	qs := h.Executions.Questions()
	who := h.principal(c)
	qu, err := h.seenQuestion(c)
	if err != nil {
		return questionOutcome(c, err)
	}
	// Whether it still waits, and for whom, before what was typed is
	// judged: the refusal says more than the form's errors would.
	if qu.State != gates.QuestionPending {
		return questionOutcome(c, gates.ErrQuestionDecided)
	}
	if !qs.MayAnswer(qu, who) {
		if qu.RequestedBy == who.Name {
			return questionOutcome(c, gates.ErrSelfAnswer)
		}
		return questionOutcome(c, gates.ErrNotAnswerer)
	}
	var content map[string]any
	var fields []questionField
	if qu.Mode == gates.ModeForm {
		form, err := c.FormParams()
		if err != nil {
			return echo.NewHTTPError(http.StatusBadRequest)
		}
		fields = questionFields(qu.ID, qu.RequestedSchema)
		content = answerContent(fields, form)
		if problems := gates.ValidateAnswer(qu.RequestedSchema, content); len(problems) > 0 {
			return h.answerInvalid(c, qu, fields, problems)
		}
	}
	_, err = qs.Answer(bg(c), qu.ID, who, content)
	if ve := (*fault.ValidationError)(nil); errors.As(err, &ve) && qu.Mode == gates.ModeForm {
		return h.answerInvalid(c, qu, fields, ve.Problems)
	}
	if err != nil {
		return questionOutcome(c, err)
	}
	return c.Redirect(http.StatusSeeOther, questionsPath+"?flash=question-answered")
}

// answerInvalid shows the page again (422) with the question's form as
// posted and each problem next to its field.
func (h *handler) answerInvalid(c echo.Context, qu *gates.Question, posted []questionField, problems []fault.FieldError) error {
	qs := h.Executions.Questions()
	shown := qs.Redacted(qu)
	// Labels, hints and options as shown; values as posted.
	fields := questionFields(qu.ID, shown.RequestedSchema)
	for i := range fields {
		for _, p := range posted {
			if p.Name == fields[i].Name {
				fields[i].Value, fields[i].Checked = p.Value, p.Checked
				for j := range fields[i].Options {
					fields[i].Options[j].Selected = slices.ContainsFunc(p.Options, func(o questionOption) bool {
						return o.Selected && o.Value == fields[i].Options[j].Value
					})
				}
			}
		}
	}
	failed := &questionCard{Q: shown, MayAnswer: true, Fields: fields}
	placeProblems(failed, problems)
	d, err := h.questionsPageData(c, failed)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(d.Pending, func(qc questionCard) bool { return qc.Q.ID == qu.ID }) {
		d.Pending = append([]questionCard{*failed}, d.Pending...)
	}
	return h.render(c, http.StatusUnprocessableEntity, questionsPage(h.page(c, "Questions", "questions"), d))
}

// declineQuestion declines a question, with an optional reason.
func (h *handler) declineQuestion(c echo.Context) error {
	reason := strings.TrimSpace(c.FormValue("reason"))
	if len(reason) > maxNote {
		reason = strings.ToValidUTF8(reason[:maxNote], "")
	}
	if _, err := h.seenQuestion(c); err != nil {
		return questionOutcome(c, err)
	}
	if _, err := h.Executions.Questions().Decline(bg(c), c.Param("id"), h.principal(c), reason); err != nil {
		return questionOutcome(c, err)
	}
	return c.Redirect(http.StatusSeeOther, questionsPath+"?flash=question-declined")
}

// cancelQuestion dismisses a question without a choice.
func (h *handler) cancelQuestion(c echo.Context) error {
	if _, err := h.seenQuestion(c); err != nil {
		return questionOutcome(c, err)
	}
	if _, err := h.Executions.Questions().Cancel(bg(c), c.Param("id"), h.principal(c)); err != nil {
		return questionOutcome(c, err)
	}
	return c.Redirect(http.StatusSeeOther, questionsPath+"?flash=question-cancelled")
}
