package gates

// The question queue: an upstream MCP server's elicitation (a form to fill
// in, or a URL to open) kept as a durable record a person answers while
// the run waits, as an approval is. It mirrors Approvals: one Redis hash
// per question under a hash tag of its own, an index of all questions by
// creation and one of the pending ones by expiry, deciding as one
// idempotent script, and the same rule of who may decide (the approve
// role, narrowed by the connection's answerers, never the asker unless the
// answerers name it).
//
// An accepted answer (its content) is kept, because the run must send it
// to the server, but it is treated like a call's arguments: it never goes
// on the event stream or into a log, and every read for people passes it
// through the Redact hook (Redacted).

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/mail"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// QuestionState is where a question is in its life.
type QuestionState string

// Question states.
const (
	QuestionPending   QuestionState = "pending"
	QuestionAnswered  QuestionState = "answered"
	QuestionDeclined  QuestionState = "declined"
	QuestionCancelled QuestionState = "cancelled"
	QuestionExpired   QuestionState = "expired"
)

// Question modes, as MCP's elicitation names them.
const (
	// ModeForm asks for values matching RequestedSchema.
	ModeForm = "form"
	// ModeURL asks a person to open URL and do what it says there; the
	// answer carries no content.
	ModeURL = "url"
)

// Question is an upstream server's question waiting for, or answered by,
// a person.
type Question struct {
	ID         string        `json:"id"`
	State      QuestionState `json:"state"`
	Execution  string        `json:"execution"`
	Step       string        `json:"step"`
	Connection string        `json:"connection"`
	// Mode is ModeForm or ModeURL.
	Mode    string `json:"mode"`
	Message string `json:"message"`
	// RequestedSchema is a form's flat object schema (see CheckForm).
	RequestedSchema map[string]any `json:"requestedSchema,omitempty"`
	// URL and ElicitationID are a URL question's.
	URL           string `json:"url,omitempty"`
	ElicitationID string `json:"elicitationId,omitempty"`
	// RequestedBy is the principal of the execution that asked.
	RequestedBy string     `json:"requestedBy"`
	CreatedAt   time.Time  `json:"createdAt"`
	ExpiresAt   time.Time  `json:"expiresAt"`
	AnsweredBy  string     `json:"answeredBy,omitempty"`
	AnsweredAt  *time.Time `json:"answeredAt,omitempty"`
	// Reason is a decline's reason (optional), or why it expired.
	Reason string `json:"reason,omitempty"`
	// Content is the accepted answer, kept for the run to send. People see
	// it only through Redacted.
	Content map[string]any `json:"content,omitempty"`
}

// Question errors.
var (
	ErrQuestionNotFound = errors.New("question not found")
	// ErrQuestionDecided: the question was already answered, declined,
	// cancelled or expired otherwise.
	ErrQuestionDecided = errors.New("question already decided")
	// ErrSelfAnswer: the decider is the principal whose execution asked,
	// and the connection's answerers do not name it. A question put to a
	// person should reach someone other than the run's own key unless
	// the deployment says that key answers for itself.
	ErrSelfAnswer = errors.New("the principal whose execution asked cannot answer its question unless the connection's answerers name it")
	// ErrNotAnswerer: the decider lacks the approve role for the
	// connection, or the connection's answerers name others.
	ErrNotAnswerer = errors.New("not an answerer of this question")
	// ErrQuestionInvalid: Ask was given a question patchbay cannot keep
	// (no id, an unknown mode, a URL that is not http(s), too large).
	ErrQuestionInvalid = errors.New("invalid question")
	// ErrFormRefused: a form's schema is not one patchbay puts in front
	// of a person (see CheckForm).
	ErrFormRefused = errors.New("form refused")
)

// Bounds of a question.
const (
	// MaxContentBytes bounds an answer's content as JSON.
	MaxContentBytes = 64 << 10
	// MaxQuestionBytes bounds a question as asked (message, schema, URL)
	// as JSON.
	MaxQuestionBytes = 256 << 10
	// MaxQuestionList bounds how many questions one List returns.
	MaxQuestionList = 200
	// DefaultQuestionTTL is how long a question without ExpiresAt waits.
	DefaultQuestionTTL = 24 * time.Hour
	// maxFormFields and maxFormOptions bound a form's fields and the
	// options of one select.
	maxFormFields  = 100
	maxFormOptions = 1000
)

// Events a question puts on its execution's stream. None carries the
// answer's content.
const (
	// EventQuestionAsked: {question, step, connection, mode}.
	EventQuestionAsked = "question.asked"
	// EventQuestionAnswered, …Declined, …Cancelled, …Expired:
	// {question, step, state}.
	EventQuestionAnswered  = "question.answered"
	EventQuestionDeclined  = "question.declined"
	EventQuestionCancelled = "question.cancelled"
	EventQuestionExpired   = "question.expired"
)

// QuestionHooks are the engine's side of the queue. Every hook may be nil.
type QuestionHooks struct {
	// Resume enqueues the execution a question belongs to once decided,
	// so a parked run continues.
	Resume func(ctx context.Context, execution string) error
	// Emit puts a question's events on the execution's stream.
	Emit func(ctx context.Context, execution, typ string, data map[string]any)
	// Answerers returns whom a connection names as the answerers of its
	// questions: principal names or "role:<role>" (nil: anyone with the
	// approve role for the connection).
	Answerers func(connection string) []string
	// Redact scrubs secrets from what people are shown (Redacted); nil
	// shows values as stored.
	Redact func(v any) any
	// Observe counts a question entering a state (pending when first
	// asked), for the metrics.
	Observe func(state QuestionState)
}

// Questions keeps question records in Redis.
type Questions struct {
	store *store.Store
	hooks QuestionHooks
}

// NewQuestions is the question queue kept in st, calling back through h.
func NewQuestions(st *store.Store, h QuestionHooks) *Questions {
	return &Questions{store: st, hooks: h}
}

func (q *Questions) key(id string) string { return q.store.Key("question", "{"+id+"}") }
func (q *Questions) pendingKey() string   { return q.store.Key("questions", "pending") }
func (q *Questions) allKey() string       { return q.store.Key("questions", "all") }

// QuestionID is derived from the execution and a key naming the question
// within it (the step's ledger key and the request's id), so a replayed
// step finds the question it asked instead of asking again.
func QuestionID(execution, key string) string {
	sum := sha256.Sum256([]byte(execution + "\x00" + key))
	return "qs_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// askScript writes a question's hash once: the question as asked in
// "data", its state and its expiry (milliseconds, for the decide script's
// clock check). It returns 1 when it wrote them, 0 when the question
// existed, and the state either way, so a repeated Ask after a crash
// completes the index rather than asking twice.
var askScript = redis.NewScript(`
if redis.call('HSETNX', KEYS[1], 'data', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'state', 'pending', 'expiresAt', ARGV[2])
  return {1, 'pending'}
end
return {0, redis.call('HGET', KEYS[1], 'state') or 'pending'}
`)

// Ask writes a pending question unless one with its id exists, and returns
// the stored one (an existing record as it is). CreatedAt defaults to now
// and ExpiresAt to DefaultQuestionTTL later. A form must pass CheckForm
// (ErrFormRefused: the engine declines it to the server with the error's
// text as the reason); a URL question needs an http(s) URL and an
// elicitation id. The first write emits EventQuestionAsked.
func (q *Questions) Ask(ctx context.Context, qu *Question) (*Question, error) {
	asked, err := q.prepare(qu)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(asked)
	if err != nil {
		return nil, fmt.Errorf("questions: encode %s: %w", asked.ID, err)
	}
	if len(data) > MaxQuestionBytes {
		return nil, fmt.Errorf("question %s is %d bytes as JSON, more than %d: %w", asked.ID, len(data), MaxQuestionBytes, ErrQuestionInvalid)
	}
	res, err := askScript.Run(ctx, q.store.Client, []string{q.key(asked.ID)}, data, asked.ExpiresAt.UnixMilli()).Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("the script answered %v", res)
	}
	if err != nil {
		return nil, fmt.Errorf("questions: ask %s: %w", asked.ID, err)
	}
	fresh, _ := res[0].(int64)
	state, _ := res[1].(string)
	// Indexing is idempotent (the same member and score), so it runs on a
	// repeated Ask too: a crash between the write and the index heals.
	_, err = q.store.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, q.allKey(), redis.Z{Score: float64(asked.CreatedAt.UnixMilli()), Member: asked.ID})
		if state == string(QuestionPending) {
			p.ZAdd(ctx, q.pendingKey(), redis.Z{Score: float64(asked.ExpiresAt.UnixMilli()), Member: asked.ID})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("questions: index %s: %w", asked.ID, err)
	}
	if fresh != 1 {
		return q.Get(ctx, asked.ID)
	}
	if !time.Now().Before(asked.ExpiresAt) {
		asked.State = QuestionExpired // as Get reads it
	}
	q.emit(ctx, asked.Execution, EventQuestionAsked, map[string]any{
		"question": asked.ID, "step": asked.Step, "connection": asked.Connection, "mode": asked.Mode})
	q.observe(QuestionPending)
	return asked, nil
}

// prepare checks a question to ask and returns the record to store: its
// own copy, pending, with the decision fields empty.
func (q *Questions) prepare(qu *Question) (*Question, error) {
	if qu == nil || qu.ID == "" || qu.Execution == "" {
		return nil, fmt.Errorf("a question needs an id and an execution: %w", ErrQuestionInvalid)
	}
	asked := *qu
	asked.State, asked.AnsweredBy, asked.AnsweredAt, asked.Reason, asked.Content = QuestionPending, "", nil, "", nil
	switch asked.Mode {
	case ModeForm:
		if err := CheckForm(asked.RequestedSchema); err != nil {
			return nil, fmt.Errorf("question %s: %w", asked.ID, err)
		}
		asked.URL, asked.ElicitationID = "", ""
	case ModeURL:
		if err := checkURL(asked.URL); err != nil {
			return nil, fmt.Errorf("question %s: %w: %w", asked.ID, err, ErrQuestionInvalid)
		}
		if asked.ElicitationID == "" {
			return nil, fmt.Errorf("question %s: a url question needs an elicitation id: %w", asked.ID, ErrQuestionInvalid)
		}
		asked.RequestedSchema = nil
	default:
		return nil, fmt.Errorf("question %s: mode %q is neither form nor url: %w", asked.ID, asked.Mode, ErrQuestionInvalid)
	}
	if asked.CreatedAt.IsZero() {
		asked.CreatedAt = time.Now().UTC()
	}
	if asked.ExpiresAt.IsZero() {
		asked.ExpiresAt = asked.CreatedAt.Add(DefaultQuestionTTL)
	}
	return &asked, nil
}

// checkURL accepts the absolute http(s) URL a person may be asked to
// open; anything else (javascript:, file:, a relative reference) is not
// put in front of anyone.
func checkURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return errors.New("a url question needs an absolute http or https URL")
	}
	return nil
}

// Get returns one question as stored (its content unredacted, for the
// run), or ErrQuestionNotFound. A pending question past its expiry reads
// as expired, before the sweep (Expire) records it.
func (q *Questions) Get(ctx context.Context, id string) (*Question, error) {
	fields, err := q.store.Client.HGetAll(ctx, q.key(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("questions: get %s: %w", id, err)
	}
	return decodeQuestion(id, fields, time.Now())
}

// decodeQuestion reads the hash of a question: the question as asked in
// "data", which never changes, and the decision in fields of its own.
func decodeQuestion(id string, fields map[string]string, now time.Time) (*Question, error) {
	if fields["data"] == "" {
		return nil, fmt.Errorf("question %s: %w", id, ErrQuestionNotFound)
	}
	var qu Question
	if err := json.Unmarshal([]byte(fields["data"]), &qu); err != nil {
		return nil, fmt.Errorf("questions: decode %s: %w", id, err)
	}
	qu.State = QuestionState(fields["state"])
	qu.AnsweredBy, qu.Reason = fields["answeredBy"], fields["reason"]
	if t, err := time.Parse(time.RFC3339Nano, fields["answeredAt"]); err == nil {
		qu.AnsweredAt = &t
	}
	if c := fields["content"]; c != "" {
		if err := json.Unmarshal([]byte(c), &qu.Content); err != nil {
			return nil, fmt.Errorf("questions: decode the answer of %s: %w", id, err)
		}
	}
	if qu.State == QuestionPending && !now.Before(qu.ExpiresAt) {
		qu.State = QuestionExpired
	}
	return &qu, nil
}

// Redacted is qu as people are shown it: a copy whose content, message,
// URL and reason passed through the Redact hook. Every read path for
// people (the API, the admin UI) shows questions through it.
func (q *Questions) Redacted(qu *Question) *Question {
	if qu == nil {
		return nil
	}
	out := *qu
	if q.hooks.Redact == nil {
		return &out
	}
	if out.Content != nil {
		out.Content, _ = q.hooks.Redact(out.Content).(map[string]any)
	}
	if out.RequestedSchema != nil {
		out.RequestedSchema, _ = q.hooks.Redact(out.RequestedSchema).(map[string]any)
	}
	for _, s := range []*string{&out.Message, &out.URL, &out.Reason} {
		if *s != "" {
			*s, _ = q.hooks.Redact(*s).(string)
		}
	}
	return &out
}

// List returns questions newest first, optionally only those in state.
func (q *Questions) List(ctx context.Context, state QuestionState, limit int) ([]*Question, error) {
	return q.ListWhere(ctx, state, limit, nil)
}

// ListWhere is List keeping only the questions keep accepts (nil keeps
// all). The filter runs before the limit, so a caller who may see few
// questions still gets its newest ones, not those among everyone's newest.
// limit is at most MaxQuestionList (50 when out of range).
func (q *Questions) ListWhere(ctx context.Context, state QuestionState, limit int, keep func(*Question) bool) ([]*Question, error) {
	if limit <= 0 || limit > MaxQuestionList {
		limit = 50
	}
	out, err := newest(ctx, q.store, q.allKey(), limit, q.Get, func(qu *Question) bool {
		return (state == "" || qu.State == state) && (keep == nil || keep(qu))
	})
	if err != nil {
		return nil, fmt.Errorf("questions: list: %w", err)
	}
	return out, nil
}

// PendingQuestions counts the questions waiting for a person (expired ones
// the sweep has not reached yet included), for a gauge.
func (q *Questions) PendingQuestions(ctx context.Context) (int64, error) {
	return q.store.Client.ZCard(ctx, q.pendingKey()).Result()
}

// answerScript moves a pending question to a decided state, once. It
// returns 0 for no question, 1 when it decided, 2 when the question was
// already decided (the caller compares), and 3 when the question's time
// had passed by Redis's clock: it is then recorded as expired instead, so
// an answer that comes too late cannot slip past the sweep. A second call
// with the same decision changes nothing, so go-redis retrying the
// script, or a person clicking twice, is harmless.
var answerScript = redis.NewScript(`
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return 0 end
if state ~= 'pending' then return 2 end
if ARGV[1] ~= 'expired' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local exp = tonumber(redis.call('HGET', KEYS[1], 'expiresAt') or '0')
  if exp and exp > 0 and now >= exp then
    redis.call('HSET', KEYS[1], 'state', 'expired', 'answeredBy', ARGV[6], 'answeredAt', ARGV[3], 'reason', ARGV[7])
    return 3
  end
end
redis.call('HSET', KEYS[1], 'state', ARGV[1], 'answeredBy', ARGV[2], 'answeredAt', ARGV[3], 'reason', ARGV[4], 'content', ARGV[5])
return 1
`)

const expiredReason = "no answer before the question expired"

// Answer accepts a question as p with content, which must match the
// form's schema (a *fault.ValidationError naming each field under
// /content otherwise); a URL question is answered with no content (nil
// or {}), meaning the person did what the URL asked. See Decide for
// repeats and conflicts, and mayAnswer for who may.
func (q *Questions) Answer(ctx context.Context, id string, p authz.Principal, content map[string]any) (*Question, error) {
	return q.decideAs(ctx, id, QuestionAnswered, p, content, "")
}

// Decline declines a question as p, with an optional reason.
func (q *Questions) Decline(ctx context.Context, id string, p authz.Principal, reason string) (*Question, error) {
	return q.decideAs(ctx, id, QuestionDeclined, p, nil, reason)
}

// Cancel dismisses a question as p without a choice (MCP's "cancel").
func (q *Questions) Cancel(ctx context.Context, id string, p authz.Principal) (*Question, error) {
	return q.decideAs(ctx, id, QuestionCancelled, p, nil, "")
}

func (q *Questions) decideAs(ctx context.Context, id string, state QuestionState, p authz.Principal, content map[string]any, reason string) (*Question, error) {
	qu, err := q.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := q.mayAnswer(qu, p); err != nil {
		return qu, err
	}
	return q.Decide(ctx, id, state, p.Name, content, reason)
}

// mayAnswer is who may decide a question: a principal the connection's
// answerers name by name; otherwise one whose approve role reaches the
// connection (authz.MayAnswer) and, when the connection names answerers,
// is among them by role. The principal whose execution asked may decide
// only when the answerers name it by name: a question is for a person,
// and a role the run's own key happens to hold does not make it one.
func (q *Questions) mayAnswer(qu *Question, p authz.Principal) error {
	var answerers []string
	if q.hooks.Answerers != nil {
		answerers = q.hooks.Answerers(qu.Connection)
	}
	named := slices.Contains(answerers, p.Name)
	if p.Name == qu.RequestedBy {
		if named {
			return nil
		}
		return fmt.Errorf("question %s: %w", qu.ID, ErrSelfAnswer)
	}
	if named {
		return nil
	}
	if !p.MayAnswer(qu.Connection) {
		return fmt.Errorf("question %s of %s: %w", qu.ID, qu.Connection, ErrNotAnswerer)
	}
	if !p.Named(answerers) {
		return fmt.Errorf("question %s: %s names its answerers: %w", qu.ID, qu.Connection, ErrNotAnswerer)
	}
	return nil
}

// MayAnswer reports whether p may answer, decline or cancel qu, so a page
// can offer the buttons only to those who may press them, and a key the
// answerers name sees the question.
func (q *Questions) MayAnswer(qu *Question, p authz.Principal) bool { return q.mayAnswer(qu, p) == nil }

// Decide records a decision on a pending question as by, without asking
// who by is: it is the engine's (the sweep's expiry, or a question the
// calling MCP client answered itself); people go through Answer, Decline
// and Cancel. content is an answer's and is checked as Answer says.
//
// Deciding a question already decided alike returns it unchanged and
// resumes its execution again (a retry after a lost answer brings a parked
// run back); an answer alike must carry the same content. Any other
// decision on a decided question, or any decision once its time has
// passed, is ErrQuestionDecided. A decision emits its event (never the
// content), resumes the execution and is observed.
func (q *Questions) Decide(ctx context.Context, id string, state QuestionState, by string, content map[string]any, reason string) (*Question, error) {
	qu, err := q.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	var encoded string
	switch state {
	case QuestionAnswered:
		if content, err = q.checkAnswer(qu, content); err != nil {
			return qu, err
		}
		data, err := json.Marshal(content)
		if err != nil {
			return qu, fmt.Errorf("questions: encode the answer of %s: %w", id, err)
		}
		encoded = string(data)
	case QuestionDeclined, QuestionCancelled, QuestionExpired:
		if state == QuestionExpired && reason == "" {
			reason = expiredReason
		}
	default:
		return qu, fmt.Errorf("question %s: %q is not a decision", id, state)
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	code, err := answerScript.Run(ctx, q.store.Client, []string{q.key(id)},
		string(state), by, now, reason, encoded, authz.SystemName, expiredReason).Int()
	if err != nil {
		return nil, fmt.Errorf("questions: decide %s: %w", id, err)
	}
	if code == 0 {
		return nil, fmt.Errorf("question %s: %w", id, ErrQuestionNotFound)
	}
	if qu, err = q.Get(ctx, id); err != nil {
		return nil, err
	}
	switch code {
	case 2:
		if qu.State != state || (state == QuestionAnswered && !sameJSON(qu.Content, encoded)) {
			return qu, fmt.Errorf("question %s is %s: %w", id, qu.State, ErrQuestionDecided)
		}
		// The same decision again: perhaps the process that recorded it
		// died before enqueueing the execution. Enqueue it (again); a
		// second work item is harmless.
		return qu, q.resume(ctx, qu.Execution)
	case 3:
		q.decided(ctx, qu)
		return qu, errors.Join(fmt.Errorf("question %s is expired: %w", id, ErrQuestionDecided), q.resume(ctx, qu.Execution))
	}
	q.decided(ctx, qu)
	return qu, q.resume(ctx, qu.Execution)
}

// checkAnswer is content as the answer of qu will store it, or why not.
// The question must be pending for its content to matter: a decided one
// goes on to the script, which tells a repeat from a conflict.
func (q *Questions) checkAnswer(qu *Question, content map[string]any) (map[string]any, error) {
	if content == nil {
		content = map[string]any{}
	}
	if qu.State != QuestionPending {
		return content, nil
	}
	if qu.Mode == ModeURL {
		if len(content) > 0 {
			return nil, &fault.ValidationError{Problems: []fault.FieldError{{Path: "/content", Code: fault.CodeValidationFailed,
				Message: "a url question is answered without content ({} or none): it says the URL's task is done"}}}
		}
		return content, nil
	}
	if data, err := json.Marshal(content); err != nil || len(data) > MaxContentBytes {
		return nil, &fault.ValidationError{Problems: []fault.FieldError{{Path: "/content", Code: fault.CodeValidationFailed,
			Message: fmt.Sprintf("must be at most %d bytes as JSON", MaxContentBytes)}}}
	}
	if errs := ValidateAnswer(qu.RequestedSchema, content); len(errs) > 0 {
		return nil, &fault.ValidationError{Problems: errs}
	}
	return content, nil
}

// sameJSON reports whether the stored answer is the one encoded: both
// pass through a decode, so numbers read alike, and json sorts map keys.
func sameJSON(stored map[string]any, encoded string) bool {
	var again map[string]any
	if err := json.Unmarshal([]byte(encoded), &again); err != nil {
		return false
	}
	if stored == nil {
		stored = map[string]any{}
	}
	a, errA := json.Marshal(stored)
	b, errB := json.Marshal(again)
	return errA == nil && errB == nil && string(a) == string(b)
}

// decided is what follows a recorded decision: the index, the event and
// the metric.
func (q *Questions) decided(ctx context.Context, qu *Question) {
	q.store.Client.ZRem(ctx, q.pendingKey(), qu.ID)
	q.emit(ctx, qu.Execution, "question."+string(qu.State), map[string]any{"question": qu.ID, "step": qu.Step, "state": qu.State})
	q.observe(qu.State)
}

// Expire records as expired every pending question whose time has passed,
// up to 100 a call; the engine's sweep calls it as it calls
// Approvals.Expire.
func (q *Questions) Expire(ctx context.Context) {
	ids, err := q.store.Client.ZRangeByScore(ctx, q.pendingKey(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(time.Now().UnixMilli(), 10), Count: 100,
	}).Result()
	if err != nil {
		return
	}
	for _, id := range ids {
		_, _ = q.Decide(ctx, id, QuestionExpired, authz.SystemName, nil, expiredReason)
		q.store.Client.ZRem(ctx, q.pendingKey(), id)
	}
}

func (q *Questions) emit(ctx context.Context, execution, typ string, data map[string]any) {
	if q.hooks.Emit != nil {
		q.hooks.Emit(ctx, execution, typ, data)
	}
}

func (q *Questions) resume(ctx context.Context, execution string) error {
	if q.hooks.Resume == nil {
		return nil
	}
	return q.hooks.Resume(ctx, execution)
}

func (q *Questions) observe(state QuestionState) {
	if q.hooks.Observe != nil {
		q.hooks.Observe(state)
	}
}

// The forms patchbay puts in front of a person: MCP's restricted schema
// (elicitation, 2025-11-25). A flat object whose properties are each a
// string (formats email, uri, date, date-time; minLength, maxLength), a
// single select (enum, enum with the legacy enumNames, or oneOf of
// {const, title}), a number or integer (minimum, maximum), a boolean, or a
// multi-select (an array of a string enum, or of anyOf {const, title};
// minItems, maxItems). Any field may have a title, a description and a
// default.

type fieldKind int

const (
	kindString fieldKind = iota
	kindSelect
	kindNumber
	kindInteger
	kindBoolean
	kindMulti
)

var stringFormats = []string{"email", "uri", "date", "date-time"}

// field is one property of a checked form.
type field struct {
	kind     fieldKind
	format   string
	options  []string
	min, max *float64 // minLength/maxLength, minimum/maximum or minItems/maxItems
}

// CheckForm refuses a form schema patchbay will not put in front of a
// person: one that is not a flat object of the allowed primitive fields,
// or with a field whose name, title or description suggests a secret
// (password, passcode, token, secret, API key, credential, private key,
// SSN, PIN), since MCP forbids asking for sensitive information in a form
// (a URL question is the way for that). The error wraps ErrFormRefused
// and says why; it is the reason the question is declined with.
func CheckForm(schema map[string]any) error {
	_, err := parseForm(schema)
	return err
}

// form is a checked form: its fields by name and the required ones.
type form struct {
	fields   map[string]*field
	required []string
}

func refuse(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), ErrFormRefused)
}

func parseForm(schema map[string]any) (*form, error) {
	if schema == nil {
		return nil, refuse("a form needs a requested schema")
	}
	schema, ok := plain(schema)
	if !ok {
		return nil, refuse("the form's schema is not JSON")
	}
	for k, v := range schema {
		switch k {
		case "$schema", "title", "description", "type", "properties", "required":
		case "additionalProperties":
			if v != false {
				return nil, refuse("the form's additionalProperties may only be false")
			}
		default:
			return nil, refuse("the form has keyword %q; a form is a flat object of type, properties and required", k)
		}
	}
	if schema["type"] != "object" {
		return nil, refuse(`a form's schema must be {"type": "object"}`)
	}
	for _, k := range []string{"title", "description"} {
		if s, ok := schema[k]; ok {
			text, isString := s.(string)
			if !isString {
				return nil, refuse("the form's %s must be a string", k)
			}
			if w := secretWord(text); w != "" {
				return nil, refuse("the form's %s looks like it asks for a secret (%s); forms may not ask for sensitive information", k, w)
			}
		}
	}
	props, isObject := schema["properties"].(map[string]any)
	if !isObject {
		if _, has := schema["properties"]; has || len(asList(schema["required"])) > 0 {
			return nil, refuse("the form's properties must be an object")
		}
		props = map[string]any{}
	}
	if len(props) > maxFormFields {
		return nil, refuse("the form has %d fields, more than %d", len(props), maxFormFields)
	}
	fields := make(map[string]*field, len(props))
	for _, name := range sortedKeys(props) {
		if w := secretWord(name); w != "" {
			return nil, refuse("field %q looks like it asks for a secret (%s); forms may not ask for sensitive information", name, w)
		}
		def, ok := props[name].(map[string]any)
		if !ok {
			return nil, refuse("field %q must be a schema object", name)
		}
		f, err := parseField(name, def)
		if err != nil {
			return nil, err
		}
		fields[name] = f
	}
	f := &form{fields: fields}
	if req, has := schema["required"]; has {
		list, ok := req.([]any)
		if !ok {
			return nil, refuse("the form's required must be an array of field names")
		}
		for _, r := range list {
			name, ok := r.(string)
			if !ok || fields[name] == nil {
				return nil, refuse("the form's required names %v, which is not one of its fields", r)
			}
			f.required = append(f.required, name)
		}
	}
	return f, nil
}

// allowed keywords of a field, beyond type, title, description, default.
var fieldKeywords = map[string][]string{
	"string":  {"format", "minLength", "maxLength", "enum", "enumNames", "oneOf"},
	"number":  {"minimum", "maximum"},
	"integer": {"minimum", "maximum"},
	"boolean": nil,
	"array":   {"items", "minItems", "maxItems"},
}

func parseField(name string, def map[string]any) (*field, error) {
	typ, _ := def["type"].(string)
	extra, known := fieldKeywords[typ]
	if !known {
		if _, nested := def["properties"]; nested || typ == "object" {
			return nil, refuse("field %q is an object; a form is flat (strings, numbers, integers, booleans, selects)", name)
		}
		return nil, refuse("field %q has type %v; a form's fields are strings, numbers, integers, booleans or selects", name, def["type"])
	}
	for k, v := range def {
		switch {
		case k == "type":
		case k == "title" || k == "description":
			text, ok := v.(string)
			if !ok {
				return nil, refuse("field %q: %s must be a string", name, k)
			}
			find := secretWord
			if k == "description" {
				// Prose may mention what it does not ask for ("not your
				// PIN"); only the long words count there.
				find = secretPart
			}
			if w := find(text); w != "" {
				return nil, refuse("field %q: its %s looks like it asks for a secret (%s); forms may not ask for sensitive information", name, k, w)
			}
		case k == "default" || slices.Contains(extra, k):
		default:
			return nil, refuse("field %q has keyword %q, which a %s field of a form may not have", name, k, typ)
		}
	}
	f := &field{}
	var err error
	switch typ {
	case "string":
		f.kind = kindString
		if f.min, err = bound(name, def, "minLength", true); err != nil {
			return nil, err
		}
		if f.max, err = bound(name, def, "maxLength", true); err != nil {
			return nil, err
		}
		if fm, has := def["format"]; has {
			s, _ := fm.(string)
			if !slices.Contains(stringFormats, s) {
				return nil, refuse("field %q has format %v; a form's formats are email, uri, date and date-time", name, fm)
			}
			f.format = s
		}
		if f.options, err = selectOptions(name, def); err != nil {
			return nil, err
		}
		if f.options != nil {
			f.kind = kindSelect
		}
	case "number", "integer":
		f.kind = kindNumber
		if typ == "integer" {
			f.kind = kindInteger
		}
		if f.min, err = bound(name, def, "minimum", false); err != nil {
			return nil, err
		}
		if f.max, err = bound(name, def, "maximum", false); err != nil {
			return nil, err
		}
	case "boolean":
		f.kind = kindBoolean
	case "array":
		f.kind = kindMulti
		if f.min, err = bound(name, def, "minItems", true); err != nil {
			return nil, err
		}
		if f.max, err = bound(name, def, "maxItems", true); err != nil {
			return nil, err
		}
		if f.options, err = multiOptions(name, def["items"]); err != nil {
			return nil, err
		}
	}
	if f.min != nil && f.max != nil && *f.min > *f.max {
		return nil, refuse("field %q: its lower bound is above its upper bound", name)
	}
	if d, has := def["default"]; has {
		if msg := f.check(d); msg != "" {
			return nil, refuse("field %q: its default %s", name, msg)
		}
	}
	return f, nil
}

// bound reads a numeric keyword; whole (lengths, item counts) must be a
// whole number from 0.
func bound(name string, def map[string]any, key string, whole bool) (*float64, error) {
	v, has := def[key]
	if !has {
		return nil, nil
	}
	n, ok := number(v)
	if !ok || (whole && (n < 0 || n != math.Trunc(n))) {
		return nil, refuse("field %q: %s must be a %s", name, key, map[bool]string{true: "whole number from 0", false: "number"}[whole])
	}
	return &n, nil
}

// selectOptions are a single select's values (enum, or oneOf of {const,
// title}); nil for a plain string.
func selectOptions(name string, def map[string]any) ([]string, error) {
	enum, hasEnum := def["enum"]
	oneOf, hasOneOf := def["oneOf"]
	_, hasNames := def["enumNames"]
	switch {
	case hasEnum && hasOneOf:
		return nil, refuse("field %q has both enum and oneOf", name)
	case hasNames && !hasEnum:
		return nil, refuse("field %q has enumNames without enum", name)
	case hasEnum:
		opts, err := stringList(name, "enum", enum)
		if err != nil {
			return nil, err
		}
		if hasNames {
			names, err := stringList(name, "enumNames", def["enumNames"])
			if err != nil {
				return nil, err
			}
			if len(names) != len(opts) {
				return nil, refuse("field %q: enumNames must name each enum value", name)
			}
			if err := checkTitles(name, names); err != nil {
				return nil, err
			}
		}
		return opts, nil
	case hasOneOf:
		return constTitles(name, "oneOf", oneOf)
	}
	return nil, nil
}

// multiOptions are a multi-select's values: items {type: string, enum}
// or items {anyOf: [{const, title}]}.
func multiOptions(name string, items any) ([]string, error) {
	it, ok := items.(map[string]any)
	if !ok {
		return nil, refuse("field %q is an array without items; a form's arrays are multi-selects of a string enum", name)
	}
	if anyOf, has := it["anyOf"]; has {
		if len(it) != 1 {
			return nil, refuse("field %q: items with anyOf may have nothing else", name)
		}
		return constTitles(name, "items.anyOf", anyOf)
	}
	for k := range it {
		if k != "type" && k != "enum" {
			return nil, refuse("field %q: items may only be {type: string, enum} or {anyOf}", name)
		}
	}
	if it["type"] != "string" {
		return nil, refuse("field %q: a multi-select's items must be strings", name)
	}
	if _, has := it["enum"]; !has {
		return nil, refuse("field %q: a multi-select's items need an enum", name)
	}
	return stringList(name, "items.enum", it["enum"])
}

func stringList(name, key string, v any) ([]string, error) {
	list, ok := v.([]any)
	if !ok || len(list) == 0 || len(list) > maxFormOptions {
		return nil, refuse("field %q: %s must be an array of 1 to %d strings", name, key, maxFormOptions)
	}
	out := make([]string, len(list))
	for i, x := range list {
		s, ok := x.(string)
		if !ok {
			return nil, refuse("field %q: %s must hold strings only", name, key)
		}
		out[i] = s
	}
	return out, nil
}

func constTitles(name, key string, v any) ([]string, error) {
	list, ok := v.([]any)
	if !ok || len(list) == 0 || len(list) > maxFormOptions {
		return nil, refuse("field %q: %s must be an array of 1 to %d options", name, key, maxFormOptions)
	}
	out := make([]string, len(list))
	titles := make([]string, len(list))
	for i, x := range list {
		opt, _ := x.(map[string]any)
		c, okC := opt["const"].(string)
		t, okT := opt["title"].(string)
		if !okC || !okT || len(opt) != 2 {
			return nil, refuse("field %q: each of %s must be {const: string, title: string}", name, key)
		}
		out[i], titles[i] = c, t
	}
	return out, checkTitles(name, titles)
}

// checkTitles refuses an option whose label asks for a secret.
func checkTitles(name string, titles []string) error {
	for _, t := range titles {
		if w := secretWord(t); w != "" {
			return refuse("field %q: option %q looks like it asks for a secret (%s); forms may not ask for sensitive information", name, t, w)
		}
	}
	return nil
}

// Words that mark a field as asking for a secret. Long ones are found
// inside other words too (accessToken, db_password, clientsecret, API
// key, api_key); short ones only as words of their own (PIN, SSN), so
// "shipping" or "opinion" are not refused.
var (
	secretParts = [][2]string{{"password", "password"}, {"passwd", "password"}, {"passphrase", "passphrase"},
		{"passcode", "passcode"}, {"token", "token"}, {"secret", "secret"}, {"credential", "credential"},
		{"apikey", "api key"}, {"privatekey", "private key"}}
	secretWords = map[string]string{"pin": "pin", "pins": "pin", "ssn": "ssn", "ssns": "ssn"}
)

// secretPart returns the long secret word inside text, or "".
func secretPart(text string) string {
	joined := strings.Join(splitWords(text), "")
	for _, p := range secretParts {
		if strings.Contains(joined, p[0]) {
			return p[1]
		}
	}
	return ""
}

// secretWord returns what in text suggests a secret, or "".
func secretWord(text string) string {
	if p := secretPart(text); p != "" {
		return p
	}
	for _, w := range splitWords(text) {
		if s, ok := secretWords[w]; ok {
			return s
		}
	}
	return ""
}

// splitWords lowercases text split at anything not a letter or digit and
// at camelCase humps (userPIN → user, pin; apiKey → api, key).
func splitWords(text string) []string {
	var words []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			words = append(words, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	runes := []rune(text)
	for i, r := range runes {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			flush()
			continue
		}
		if unicode.IsUpper(r) && len(cur) > 0 {
			prev := runes[i-1]
			nextLower := i+1 < len(runes) && unicode.IsLower(runes[i+1])
			if unicode.IsLower(prev) || unicode.IsDigit(prev) || (unicode.IsUpper(prev) && nextLower) {
				flush()
			}
		}
		cur = append(cur, r)
	}
	flush()
	return words
}

// ValidateAnswer checks an answer's content against the form's schema:
// every required field present, no field the form lacks, each value of
// its field's type and within its enum, bounds, lengths and format. Each
// problem names its field as /content/<field>. A schema CheckForm refuses
// is one problem at /content.
func ValidateAnswer(schema map[string]any, content map[string]any) []fault.FieldError {
	form, err := parseForm(schema)
	if err != nil {
		return []fault.FieldError{{Path: "/content", Code: fault.CodeValidationFailed, Message: err.Error()}}
	}
	if content != nil {
		var ok bool
		if content, ok = plain(content); !ok {
			return []fault.FieldError{{Path: "/content", Code: fault.CodeValidationFailed, Message: "must be a JSON object"}}
		}
	}
	var errs []fault.FieldError
	add := func(name, msg string) {
		errs = append(errs, fault.FieldError{Path: "/content/" + fault.Escape(name), Code: fault.CodeValidationFailed, Message: msg})
	}
	for _, name := range sortedKeys(content) {
		f := form.fields[name]
		if f == nil {
			add(name, "is not a field of the form")
			continue
		}
		if msg := f.check(content[name]); msg != "" {
			add(name, msg)
		}
	}
	for _, name := range form.required {
		if _, has := content[name]; !has {
			add(name, "is required")
		}
	}
	sort.SliceStable(errs, func(i, j int) bool { return errs[i].Path < errs[j].Path })
	return errs
}

// check says what is wrong with v as this field's value, or "".
func (f *field) check(v any) string {
	switch f.kind {
	case kindString, kindSelect:
		s, ok := v.(string)
		if !ok {
			return "must be a string"
		}
		if f.kind == kindSelect {
			if !slices.Contains(f.options, s) {
				return "must be one of " + quoteList(f.options)
			}
			return ""
		}
		n := float64(utf8.RuneCountInString(s))
		if f.min != nil && n < *f.min {
			return fmt.Sprintf("must be at least %v characters", *f.min)
		}
		if f.max != nil && n > *f.max {
			return fmt.Sprintf("must be at most %v characters", *f.max)
		}
		if f.format != "" && !validFormat(f.format, s) {
			return "must be " + map[string]string{
				"email": "an email address", "uri": "an absolute URI",
				"date": "a date (YYYY-MM-DD)", "date-time": "a date and time (RFC 3339)",
			}[f.format]
		}
	case kindNumber, kindInteger:
		n, ok := number(v)
		if !ok {
			return "must be a number"
		}
		if f.kind == kindInteger && n != math.Trunc(n) {
			return "must be a whole number"
		}
		if f.min != nil && n < *f.min {
			return fmt.Sprintf("must be at least %v", *f.min)
		}
		if f.max != nil && n > *f.max {
			return fmt.Sprintf("must be at most %v", *f.max)
		}
	case kindBoolean:
		if _, ok := v.(bool); !ok {
			return "must be true or false"
		}
	case kindMulti:
		list, ok := v.([]any)
		if !ok {
			if ss, isStrings := v.([]string); isStrings {
				list = make([]any, len(ss))
				for i, s := range ss {
					list[i] = s
				}
			} else {
				return "must be an array of options"
			}
		}
		seen := map[string]bool{}
		for _, x := range list {
			s, ok := x.(string)
			if !ok || !slices.Contains(f.options, s) {
				return "must hold only options among " + quoteList(f.options)
			}
			if seen[s] {
				return fmt.Sprintf("must not pick %q twice", s)
			}
			seen[s] = true
		}
		n := float64(len(list))
		if f.min != nil && n < *f.min {
			return fmt.Sprintf("must pick at least %v", *f.min)
		}
		if f.max != nil && n > *f.max {
			return fmt.Sprintf("must pick at most %v", *f.max)
		}
	}
	return ""
}

func validFormat(format, s string) bool {
	switch format {
	case "email":
		a, err := mail.ParseAddress(s)
		return err == nil && a.Address == s && a.Name == ""
	case "uri":
		u, err := url.Parse(s)
		return err == nil && u.Scheme != "" && !strings.ContainsAny(s, " \t\r\n")
	case "date":
		_, err := time.Parse(time.DateOnly, s)
		return err == nil
	case "date-time":
		_, err := time.Parse(time.RFC3339, s)
		return err == nil
	}
	return true
}

// number is v as a float64 when it is a JSON number (decoded or a Go
// number a caller built).
func number(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, !math.IsNaN(n) && !math.IsInf(n, 0)
	case float32:
		return float64(n), true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case int32:
		return float64(n), true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}

func quoteList(opts []string) string {
	const show = 20
	q := make([]string, 0, min(len(opts), show)+1)
	for i, o := range opts {
		if i == show {
			q = append(q, fmt.Sprintf("… (%d more)", len(opts)-show))
			break
		}
		q = append(q, strconv.Quote(o))
	}
	return strings.Join(q, ", ")
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// plain is v as encoding/json would decode it (map[string]any, []any,
// float64), so a schema or an answer a Go caller built with []string or
// int reads like one that came over the wire.
func plain(m map[string]any) (map[string]any, bool) {
	data, err := json.Marshal(m)
	if err != nil {
		return nil, false
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, false
	}
	return out, true
}
