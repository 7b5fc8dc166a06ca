package secrets

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// RedactedText replaces every registered value and each of its forms.
const RedactedText = "<redacted>"

// MinRedactLen is the shortest value Add registers. Scrubbing every "ab"
// or "1" would shred all output and, worse, the pattern of what was
// scrubbed would show where, and so what, the short secret is; a value that
// short is no secret worth the damage. Providers skip short values for the
// same reason.
const MinRedactLen = 4

// minShiftedLen is the shortest base64 fragment registered for a value
// found inside a longer base64 text (see redactForms): shorter fragments would
// match unrelated base64 data by chance.
const minShiftedLen = 8

// SecretRedactor replaces every registered secret value in text and values
// with "<redacted>", in the forms a value leaks in: as is, URL-encoded
// (url.QueryEscape and url.PathEscape), base64 (standard and URL
// alphabets, padded and not, and also the stable part of the value's
// encoding inside a longer base64 text such as a Basic authorization
// header), and each of those as escaped inside a JSON string. Gate 6
// registers every secret it resolves; providers register the credentials
// they hold.
//
// Replacement is one left-to-right pass, longest form first, so a value
// that contains another is scrubbed whole. The only way a value can show
// in the output afterwards is by overlapping the "<redacted>" marker
// itself (a secret such as "dact" or "d>xy"), which no real secret does.
//
// The zero value is ready to use and a SecretRedactor is safe for
// concurrent use. Values are never forgotten: a process redacts every
// secret it has resolved for as long as it lives. It has the method set
// ExecutionsOptions.Redactor asks for.
type SecretRedactor struct {
	mu     sync.Mutex // serialises Add
	values map[string]bool
	forms  map[string]bool
	state  atomic.Pointer[redactState]
}

// redactState is an immutable snapshot; Add swaps in a new one.
type redactState struct {
	gen uint64
	rep *strings.Replacer
}

// NewSecretRedactor returns an empty SecretRedactor.
func NewSecretRedactor() *SecretRedactor { return &SecretRedactor{} }

// Add registers each value (and its forms). Values shorter than
// MinRedactLen bytes are ignored. Adding a known value is cheap, so gate 6
// may call Add on every resolve.
func (r *SecretRedactor) Add(values ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := false
	for _, v := range values {
		if len(v) < MinRedactLen || r.values[v] {
			continue
		}
		if r.values == nil {
			r.values, r.forms = map[string]bool{}, map[string]bool{}
		}
		r.values[v] = true
		for _, f := range redactForms(v) {
			if !r.forms[f] {
				r.forms[f] = true
				changed = true
			}
		}
	}
	if !changed {
		return
	}
	all := slices.Collect(maps.Keys(r.forms))
	// Longest first: strings.Replacer tries the old strings in argument
	// order at each position.
	slices.SortFunc(all, func(a, b string) int {
		if len(a) != len(b) {
			return len(b) - len(a)
		}
		return strings.Compare(a, b)
	})
	pairs := make([]string, 0, 2*len(all))
	for _, f := range all {
		pairs = append(pairs, f, RedactedText)
	}
	var gen uint64 = 1
	if old := r.state.Load(); old != nil {
		gen = old.gen + 1
	}
	r.state.Store(&redactState{gen: gen, rep: strings.NewReplacer(pairs...)})
}

// redactForms lists the texts that betray v.
func redactForms(v string) []string {
	raw := []byte(v)
	base := []string{
		v,
		url.QueryEscape(v),
		url.PathEscape(v),
		base64.StdEncoding.EncodeToString(raw),
		base64.RawStdEncoding.EncodeToString(raw),
		base64.URLEncoding.EncodeToString(raw),
		base64.RawURLEncoding.EncodeToString(raw),
	}
	// v inside a longer base64 text (user:password in a Basic header, a
	// token inside an encoded JSON blob) is encoded from a byte offset of
	// 0, 1 or 2 modulo 3; for each, keep only the characters that depend
	// on v's bytes alone.
	for shift := range 3 {
		buf := make([]byte, shift+len(raw))
		copy(buf[shift:], raw)
		whole := 8 * len(buf) / 6 // characters fully set by these bytes
		skip := []int{0, 2, 3}[shift]
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			s := enc.EncodeToString(buf)
			if whole-skip >= minShiftedLen {
				base = append(base, s[skip:whole])
			}
		}
	}
	out := slices.Clone(base)
	for _, f := range base {
		out = append(out, jsonEscaped(f, true), jsonEscaped(f, false))
	}
	slices.Sort(out)
	out = slices.Compact(out)
	return slices.DeleteFunc(out, func(f string) bool { return len(f) < MinRedactLen })
}

// jsonEscaped is s as it appears between the quotes of a JSON string.
func jsonEscaped(s string, html bool) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(html)
	_ = enc.Encode(s) // a string always encodes
	out := bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	return string(out[1 : len(out)-1])
}

func (r *SecretRedactor) current() *redactState {
	if r == nil {
		return nil
	}
	return r.state.Load()
}

// String returns s with every registered form replaced by "<redacted>".
func (r *SecretRedactor) String(s string) string {
	st := r.current()
	if st == nil {
		return s
	}
	return st.rep.Replace(s)
}

// Bytes is String for bytes. The result may share b when nothing was
// replaced.
func (r *SecretRedactor) Bytes(b []byte) []byte {
	st := r.current()
	if st == nil {
		return b
	}
	s := string(b)
	if out := st.rep.Replace(s); out != s {
		return []byte(out)
	}
	return b
}

// Error returns an error whose message is err's, redacted; errors.Is and
// errors.As still see err. Nil stays nil.
func (r *SecretRedactor) Error(err error) error { return RedactError(r, err) }

// RedactError is SecretRedactor.Error for any Redactor.
func RedactError(r Redactor, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := r.String(msg); red != msg {
		return &redactedError{msg: red, err: err}
	}
	return err
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// Value returns a deep copy of the JSON-like value v (map[string]any,
// []any, strings, numbers, bools, nil) with every string and map key
// redacted. Other types (structs, typed maps and slices) are first turned
// into that form through encoding/json, so nothing escapes by having an
// unusual type; json.RawMessage and []byte are redacted as bytes. Two keys
// that redact to the same text are both kept, the later (in sorted order)
// with " (2)", " (3)"… appended.
func (r *SecretRedactor) Value(v any) any {
	var rep *strings.Replacer
	if st := r.current(); st != nil {
		rep = st.rep
	}
	return redactValue(rep, v, 0)
}

// MaxRedactDepth bounds recursion; deeper values are replaced whole rather
// than risk a stack overflow on a hostile, deeply nested result.
const MaxRedactDepth = 512

func redactValue(rep *strings.Replacer, v any, depth int) any {
	if depth > MaxRedactDepth {
		return RedactedText
	}
	str := func(s string) string {
		if rep == nil {
			return s
		}
		return rep.Replace(s)
	}
	switch x := v.(type) {
	case nil, bool, float64, float32, int, int8, int16, int32, int64,
		uint, uint8, uint16, uint32, uint64, json.Number:
		return x
	case string:
		return str(x)
	case map[string]any:
		out := make(map[string]any, len(x))
		for _, k := range slices.Sorted(maps.Keys(x)) {
			rk := str(k)
			if _, taken := out[rk]; taken {
				for n := 2; ; n++ {
					if _, taken := out[rk+" ("+strconv.Itoa(n)+")"]; !taken {
						rk += " (" + strconv.Itoa(n) + ")"
						break
					}
				}
			}
			out[rk] = redactValue(rep, x[k], depth+1)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, item := range x {
			out[i] = redactValue(rep, item, depth+1)
		}
		return out
	case json.RawMessage:
		return json.RawMessage(str(string(x)))
	case []byte:
		return []byte(str(string(x)))
	case error:
		return str(x.Error())
	}
	data, err := json.Marshal(v)
	if err != nil {
		return str(fmt.Sprint(v))
	}
	var plain any
	if err := json.Unmarshal(data, &plain); err != nil {
		return str(string(data))
	}
	return redactValue(rep, plain, depth+1)
}

// Handler wraps h so that the message and every attribute of every record
// are redacted before h sees them: string values, group members, errors
// and other values (as Value does), and keys. Attributes given to
// WithAttrs are redacted again whenever a value has been added since, so a
// logger made before a secret was resolved does not leak it afterwards.
func (r *SecretRedactor) Handler(h slog.Handler) slog.Handler {
	return &redactHandler{r: r, base: h}
}

// redactHandler keeps the WithAttrs/WithGroup calls made on it and applies
// them, redacted, to its base handler, rebuilding that chain only when the
// SecretRedactor has learnt a value since the last build.
type redactHandler struct {
	r     *SecretRedactor
	base  slog.Handler
	ops   []handlerOp // immutable once built
	built atomic.Pointer[builtHandler]
}

type handlerOp struct {
	group string
	attrs []slog.Attr
}

type builtHandler struct {
	gen uint64
	h   slog.Handler
}

func (h *redactHandler) handler() (slog.Handler, *redactState) {
	st := h.r.current()
	var gen uint64
	if st != nil {
		gen = st.gen
	}
	if b := h.built.Load(); b != nil && b.gen == gen {
		return b.h, st
	}
	out := h.base
	for _, op := range h.ops {
		if op.group != "" {
			out = out.WithGroup(op.group)
			continue
		}
		attrs := make([]slog.Attr, len(op.attrs))
		for i, a := range op.attrs {
			attrs[i] = redactAttr(st, a)
		}
		out = out.WithAttrs(attrs)
	}
	h.built.Store(&builtHandler{gen: gen, h: out})
	return out, st
}

func (h *redactHandler) Enabled(ctx context.Context, level slog.Level) bool {
	inner, _ := h.handler()
	return inner.Enabled(ctx, level)
}

func (h *redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	inner, st := h.handler()
	if st == nil {
		return inner.Handle(ctx, rec)
	}
	out := slog.NewRecord(rec.Time, rec.Level, st.rep.Replace(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(st, a))
		return true
	})
	return inner.Handle(ctx, out)
}

func (h *redactHandler) with(op handlerOp) *redactHandler {
	return &redactHandler{r: h.r, base: h.base, ops: append(slices.Clip(h.ops), op)}
}

func (h *redactHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return h.with(handlerOp{attrs: slices.Clone(attrs)})
}

func (h *redactHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return h.with(handlerOp{group: name})
}

func redactAttr(st *redactState, a slog.Attr) slog.Attr {
	if st == nil {
		return a
	}
	a.Key = st.rep.Replace(a.Key)
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		a.Value = slog.StringValue(st.rep.Replace(v.String()))
	case slog.KindGroup:
		group := v.Group()
		out := make([]slog.Attr, len(group))
		for i, g := range group {
			out[i] = redactAttr(st, g)
		}
		a.Value = slog.GroupValue(out...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			a.Value = slog.StringValue(st.rep.Replace(x.Error()))
		case fmt.Stringer:
			a.Value = slog.StringValue(st.rep.Replace(x.String()))
		default:
			a.Value = slog.AnyValue(redactValue(st.rep, x, 0))
		}
	default:
		a.Value = v
	}
	return a
}

// Redactor registers secret values and scrubs them from text and values.
type Redactor interface {
	Add(values ...string)
	String(s string) string
	Value(v any) any
}
