package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// Event is one event of a connection, as the inbox stores it and as
// trigger expressions (event) and workflows ($input.connection_event) see
// it.
type Event struct {
	Connection string    `json:"connection"`
	Type       string    `json:"type"`
	ID         string    `json:"id"`
	Payload    any       `json:"payload"`
	ReceivedAt time.Time `json:"receivedAt"`
	// Thread is the turn's thread, from the trigger's thread expression,
	// else the natural thread of the event in a profile its connection
	// speaks, else the trigger's id; set on the copy a turn receives.
	Thread string `json:"thread,omitempty"`
	// Trace is the W3C trace context of the request that brought the
	// event, kept in the inbox only (see trace.go).
	Trace map[string]string `json:"trace,omitempty"`
}

// MaxEventIDLen bounds event ids and webhook-ids, which become Redis keys.
const MaxEventIDLen = 256

// ValidEventID reports whether s may be an event id: 1 to 256 printable
// characters.
func ValidEventID(s string) bool {
	if s == "" || len(s) > MaxEventIDLen {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// EventError is an event that cannot be accepted, with the JSON Pointer of
// each problem (relative to the {type, id, payload} body).
type EventError struct {
	Problems []FieldProblem
}

// FieldProblem is one problem of an event.
type FieldProblem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

func (e *EventError) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.Path + ": " + p.Message
	}
	return "invalid event: " + strings.Join(parts, "; ")
}

// Sentinel errors of Emit.
var (
	// ErrUnknownSource: no connection of that name takes events this way.
	ErrUnknownSource = errors.New("no such event source")
)

// DecodeEvent parses a {type, id, payload} body. A missing id is
// defaultID (a webhook's webhook-id); "" means required.
func DecodeEvent(body []byte, defaultID string) (Event, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return Event{}, &EventError{Problems: []FieldProblem{{Path: "", Message: "must be a JSON object {type, id, payload}"}}}
	}
	var ev Event
	var ps []FieldProblem
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		if k != "type" && k != "id" && k != "payload" {
			ps = append(ps, FieldProblem{"/" + k, fmt.Sprintf("unknown field %q (allowed: type, id, payload)", k)})
		}
	}
	if err := json.Unmarshal(raw["type"], &ev.Type); err != nil || ev.Type == "" {
		ps = append(ps, FieldProblem{"/type", "is required and must be a string"})
	}
	if v, ok := raw["id"]; ok {
		if err := json.Unmarshal(v, &ev.ID); err != nil || !ValidEventID(ev.ID) {
			ps = append(ps, FieldProblem{"/id", fmt.Sprintf("must be a string of 1 to %d printable characters", MaxEventIDLen)})
		}
	} else if defaultID != "" {
		ev.ID = defaultID
	} else {
		ps = append(ps, FieldProblem{"/id", "is required"})
	}
	if v, ok := raw["payload"]; ok {
		if paths := fault.NumbersOutOfRange(v, "/payload"); len(paths) > 0 {
			for _, p := range paths {
				ps = append(ps, FieldProblem{p, "is a number too large to represent (beyond ±1.8e308)"})
			}
		} else if err := json.Unmarshal(v, &ev.Payload); err != nil {
			ps = append(ps, FieldProblem{"/payload", "is not valid JSON"})
		}
	}
	if len(ps) > 0 {
		return Event{}, &EventError{Problems: ps}
	}
	return ev, nil
}

// envOf is what a trigger expression sees.
func envOf(ev Event) map[string]any {
	return map[string]any{"event": map[string]any{
		"connection": ev.Connection, "type": ev.Type, "id": ev.ID,
		"payload": ev.Payload, "receivedAt": ev.ReceivedAt.Format(time.RFC3339Nano),
	}}
}

func compile(src string) (*sandbox.Program, error) { return config.CompileExpr(src) }

// run evaluates a trigger expression. Triggers are judged as events
// arrive, with no execution to cancel yet; the sandbox's own limits
// (sandbox.MaxDuration, MaxSteps, MaxBytes) bound each evaluation.
func run(p *sandbox.Program, env map[string]any) (any, error) {
	return p.Run(context.Background(), env)
}

// template is a trigger's input: literals and {"$expr"} leaves.
type template struct {
	lit  any
	prog *sandbox.Program
	obj  map[string]*template
	arr  []*template
}

func compileTemplate(v any) (*template, error) {
	switch x := v.(type) {
	case map[string]any:
		if src, ok := x["$expr"].(string); ok && len(x) == 1 {
			p, err := compile(src)
			if err != nil {
				return nil, err
			}
			return &template{prog: p}, nil
		}
		t := &template{obj: map[string]*template{}}
		for k, item := range x {
			c, err := compileTemplate(item)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			t.obj[k] = c
		}
		return t, nil
	case []any:
		t := &template{arr: make([]*template, len(x))}
		for i, item := range x {
			c, err := compileTemplate(item)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			t.arr[i] = c
		}
		return t, nil
	}
	return &template{lit: v}, nil
}

func (t *template) eval(env map[string]any) (any, error) {
	switch {
	case t.prog != nil:
		return run(t.prog, env)
	case t.obj != nil:
		out := make(map[string]any, len(t.obj))
		for k, c := range t.obj {
			v, err := c.eval(env)
			if err != nil {
				return nil, err
			}
			out[k] = v
		}
		return out, nil
	case t.arr != nil:
		out := make([]any, len(t.arr))
		for i, c := range t.arr {
			v, err := c.eval(env)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	return t.lit, nil
}

// trigger is a compiled config.Trigger.
type trigger struct {
	config.Trigger
	filter *sandbox.Program
	thread *sandbox.Program
	input  *template
}

func compileTrigger(t config.Trigger) (*trigger, error) {
	c := &trigger{Trigger: t}
	var err error
	if t.Filter != "" {
		if c.filter, err = compile(t.Filter); err != nil {
			return nil, fmt.Errorf("trigger %s: filter: %w", t.ID, err)
		}
	}
	if t.Thread != "" {
		if c.thread, err = compile(t.Thread); err != nil {
			return nil, fmt.Errorf("trigger %s: thread: %w", t.ID, err)
		}
	}
	if c.input, err = compileTemplate(t.Input); err != nil {
		return nil, fmt.Errorf("trigger %s: input: %w", t.ID, err)
	}
	if len(t.Document) == 0 {
		return nil, fmt.Errorf("trigger %s: no workflow document", t.ID)
	}
	return c, nil
}

// matches runs the filter.
func (t *trigger) matches(env map[string]any) (bool, error) {
	if t.filter == nil {
		return true, nil
	}
	out, err := run(t.filter, env)
	if err != nil {
		return false, err
	}
	b, ok := out.(bool)
	if !ok {
		return false, fmt.Errorf("filter returned %T, not a boolean", out)
	}
	return b, nil
}

// threadOf is ev's thread when it has one: the trigger's thread
// expression, else natural, the thread the profile its connection speaks
// gives the event ("" for none).
func (t *trigger) threadOf(ev Event, natural string) (string, bool, error) {
	if t.thread == nil {
		return natural, natural != "", nil
	}
	out, err := run(t.thread, envOf(ev))
	if err != nil {
		return "", false, fmt.Errorf("thread: %w", err)
	}
	return fmt.Sprint(out), true, nil
}

// explicitThread is the thread of ev when the trigger names one or the
// event has a natural thread; events on such a thread join the running
// execution on it. Otherwise every event starts its own turn.
func (t *trigger) explicitThread(ev Event, natural string) (string, bool, error) {
	thread, ok, err := t.threadOf(ev, natural)
	if !ok || err != nil {
		return "", false, err
	}
	return t.Connection + ":" + thread, true, nil
}

// turnInput is the input of the turn for ev: the input template's value
// with the event as connection_event. A value that is not an object is
// wrapped as {"input": value}.
func (t *trigger) turnInput(ev Event, natural string) (any, error) {
	env := envOf(ev)
	thread, ok, err := t.threadOf(ev, natural)
	if err != nil {
		return nil, err
	}
	ev.Thread = t.ID
	if ok {
		ev.Thread = thread
	}
	v, err := t.input.eval(env)
	if err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		m = map[string]any{}
		if v != nil {
			m["input"] = v
		}
	}
	m["connection_event"] = ev
	return m, nil
}

// source is what one connection takes events for.
type source struct {
	name     string
	schemas  map[string]*jsonschema.Schema // nil for a connection without declared events
	triggers []*trigger
	inbox    *inbox
	dedupe   time.Duration
	// server: the events come from an MCP server's subscriptions, never
	// through Emit.
	server bool
}

// validate checks ev against the declared events of s.
func (s *source) validate(ev Event) error {
	if s.schemas == nil {
		if !config.ValidEventType(ev.Type) {
			return &EventError{Problems: []FieldProblem{{"/type", "is not a valid event type"}}}
		}
		return nil
	}
	sch, ok := s.schemas[ev.Type]
	if !ok {
		return &EventError{Problems: []FieldProblem{{"/type", fmt.Sprintf("source %s has no event %q (it has: %s)", s.name, ev.Type, strings.Join(slices.Sorted(maps.Keys(s.schemas)), ", "))}}}
	}
	if err := sch.Validate(ev.Payload); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			return &EventError{Problems: schemaProblems(ve)}
		}
		return &EventError{Problems: []FieldProblem{{"/payload", err.Error()}}}
	}
	return nil
}

var printer = message.NewPrinter(language.English)

// schemaProblems flattens a schema failure to its leaves, each with its
// JSON Pointer under /payload.
func schemaProblems(ve *jsonschema.ValidationError) []FieldProblem {
	var out []FieldProblem
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			path := "/payload"
			for _, seg := range e.InstanceLocation {
				path += "/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(seg)
			}
			out = append(out, FieldProblem{Path: path, Message: e.ErrorKind.LocalizedString(printer)})
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	if len(out) > 20 {
		out = out[:20]
	}
	return out
}
