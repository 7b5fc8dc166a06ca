package secrets_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/quick"

	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
)

// leakForms are the forms a secret must never survive in, computed here
// independently of the SecretRedactor.
func leakForms(secret string) []string {
	b := []byte(secret)
	return []string{
		secret,
		url.QueryEscape(secret),
		url.PathEscape(secret),
		base64.StdEncoding.EncodeToString(b),
		base64.RawStdEncoding.EncodeToString(b),
		base64.URLEncoding.EncodeToString(b),
		base64.RawURLEncoding.EncodeToString(b),
	}
}

// jsonForms adds each form as it appears inside an encoded JSON string.
func jsonForms(secret string) []string {
	forms := leakForms(secret)
	for _, f := range leakForms(secret) {
		data, _ := json.Marshal(f)
		forms = append(forms, string(data[1:len(data)-1]))
	}
	return forms
}

// unmark takes the markers out of out. A secret could only show after
// redaction by overlapping the marker itself ("dact", "d>xy"), which the
// secrets of these tests never do (they hold no '<', '>' or NUL).
func unmark(out string) string {
	return strings.NewReplacer(secrets.RedactedText, "\x00", `\u003credacted\u003e`, "\x00").Replace(out)
}

// survivor returns the first of forms found in out, or "".
func survivor(out string, forms []string) string {
	out = unmark(out)
	for _, f := range forms {
		if strings.Contains(out, f) {
			return f
		}
	}
	return ""
}

func TestRedactorForms(t *testing.T) {
	t.Parallel()
	const secret = "p@ss w/rd+=?&é"
	r := secrets.NewSecretRedactor()
	r.Add(secret)
	for i, form := range jsonForms(secret) {
		in := "before " + form + " after"
		if got, want := r.String(in), "before <redacted> after"; got != want {
			t.Errorf("form %d %q: String = %q, want %q", i, form, got, want)
		}
	}
	// Inside a longer base64 text, at each byte offset: a Basic header.
	for _, user := range []string{"", "u", "us", "user:"} {
		enc := base64.StdEncoding.EncodeToString([]byte(user + secret + "\x01tail"))
		if got := r.String("Basic " + enc); !strings.Contains(got, secrets.RedactedText) {
			t.Errorf("base64 of %q+secret not redacted: %q", user, got)
		}
	}
}

func TestRedactorIgnoresShortValues(t *testing.T) {
	t.Parallel()
	r := secrets.NewSecretRedactor()
	r.Add("", "a", "abc")
	if got := r.String("abc a abcd"); got != "abc a abcd" {
		t.Errorf("String = %q", got)
	}
	r.Add("abcd")
	if got := r.String("abc a abcd"); got != "abc a <redacted>" {
		t.Errorf("String = %q", got)
	}
}

func TestRedactorLongestFirst(t *testing.T) {
	t.Parallel()
	r := secrets.NewSecretRedactor()
	r.Add("abcd", "abcdefgh", "fghij")
	tests := map[string]string{
		"xabcdefghx":  "x<redacted>x",
		"abcdabcd":    "<redacted><redacted>",
		"abcdefghij":  "<redacted>ij",
		"zzfghijabcd": "zz<redacted><redacted>",
	}
	for in, want := range tests {
		if got := r.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactorZeroAndNil(t *testing.T) {
	t.Parallel()
	var zero secrets.SecretRedactor
	if zero.String("hunter22") != "hunter22" || string(zero.Bytes([]byte("x"))) != "x" {
		t.Error("zero SecretRedactor changed text")
	}
	zero.Add("hunter22")
	if zero.String("hunter22") != "<redacted>" {
		t.Error("zero SecretRedactor is not usable")
	}
	var nilR *secrets.SecretRedactor
	if nilR.String("a") != "a" || nilR.Error(nil) != nil {
		t.Error("nil SecretRedactor")
	}
}

type tokenHolder struct {
	Token string `json:"token"`
	N     int    `json:"n"`
}

func TestRedactorValue(t *testing.T) {
	t.Parallel()
	r := secrets.NewSecretRedactor()
	const s = "tok-secret-1"
	r.Add(s)
	in := map[string]any{
		"plain":          "keep",
		"n":              1.5,
		"ok":             true,
		"none":           nil,
		"nested":         []any{"a " + s, map[string]any{"k": s}},
		"key " + s:       "v",
		"key " + s + "x": "w", // does not collide
		"struct":         tokenHolder{Token: s, N: 2},
		"strings":        []string{s},
		"raw":            json.RawMessage(`{"t":"` + s + `"}`),
		"bytes":          []byte(s),
		"err":            errors.New("bad " + s),
		"number":         json.Number("12"),
	}
	got := r.Value(in)
	want := map[string]any{
		"plain":           "keep",
		"n":               1.5,
		"ok":              true,
		"none":            nil,
		"nested":          []any{"a <redacted>", map[string]any{"k": "<redacted>"}},
		"key <redacted>":  "v",
		"key <redacted>x": "w",
		"struct":          map[string]any{"token": "<redacted>", "n": 2.0},
		"strings":         []any{"<redacted>"},
		"raw":             json.RawMessage(`{"t":"<redacted>"}`),
		"bytes":           []byte("<redacted>"),
		"err":             "bad <redacted>",
		"number":          json.Number("12"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Value =\n%#v\nwant\n%#v", got, want)
	}
	// A deep copy: changing the result leaves the input alone.
	got.(map[string]any)["nested"].([]any)[1].(map[string]any)["k"] = "changed"
	if in["nested"].([]any)[1].(map[string]any)["k"] != s {
		t.Error("Value shares maps with its input")
	}
	// Keys that redact alike are all kept.
	r.Add("other-secret")
	collide := r.Value(map[string]any{"a " + s: 1, "a other-secret": 2}).(map[string]any)
	if len(collide) != 2 || collide["a <redacted>"] == nil || collide["a <redacted> (2)"] == nil {
		t.Errorf("colliding keys = %v", collide)
	}
	// Nothing registered: still a deep copy.
	empty := secrets.NewSecretRedactor()
	m := map[string]any{"a": []any{"b"}}
	c := empty.Value(m).(map[string]any)
	c["a"].([]any)[0] = "x"
	if m["a"].([]any)[0] != "b" {
		t.Error("Value without values is not a copy")
	}
}

func TestRedactorError(t *testing.T) {
	t.Parallel()
	r := secrets.NewSecretRedactor()
	r.Add("hunter22")
	base := errors.New("login failed")
	err := r.Error(fmt.Errorf("password hunter22: %w", base))
	if err.Error() != "password <redacted>: login failed" || !errors.Is(err, base) {
		t.Errorf("Error = %v (Is base: %v)", err, errors.Is(err, base))
	}
	if clean := r.Error(base); clean != base {
		t.Error("an error with nothing to redact was wrapped")
	}
}

func TestRedactorHandler(t *testing.T) {
	t.Parallel()
	const s = "sk-live-abcdef"
	tests := []struct {
		name string
		new  func(w io.Writer) slog.Handler
	}{
		{"json", func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) }},
		{"text", func(w io.Writer) slog.Handler { return slog.NewTextHandler(w, nil) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := secrets.NewSecretRedactor()
			var buf bytes.Buffer
			logger := slog.New(r.Handler(tt.new(&buf)))
			// Made before the secret is known; must not leak it later.
			early := logger.With("token", s).WithGroup("g").With("inner", "x "+s)
			r.Add(s)
			logger.Info("calling with "+s, "header", "Bearer "+s, "err", errors.New("bad "+s),
				slog.Group("grp", "deep", s), "any", map[string]any{"k": s}, "n", 3, s, "as key",
				"b64", base64.StdEncoding.EncodeToString([]byte(s)))
			early.Info("early", "later", url.QueryEscape(s))
			out := buf.String()
			if f := survivor(out, jsonForms(s)); f != "" {
				t.Fatalf("%q survives in:\n%s", f, out)
			}
			for _, want := range []string{"calling with", "Bearer", "n=3", `"n":3`} {
				if strings.Contains(want, "=") != (tt.name == "text") {
					continue
				}
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			if strings.Count(out, "redacted") < 9 {
				t.Errorf("too few redactions:\n%s", out)
			}
			if !logger.Enabled(t.Context(), slog.LevelInfo) || logger.Enabled(t.Context(), slog.LevelDebug) {
				t.Error("Enabled does not follow the wrapped handler")
			}
		})
	}
}

func TestRedactorConcurrent(t *testing.T) {
	t.Parallel()
	r := secrets.NewSecretRedactor()
	var buf lockedBuffer
	logger := slog.New(r.Handler(slog.NewJSONHandler(&buf, nil))).With("k", "v")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 20 {
				s := fmt.Sprintf("secret-%d-%d", i, j)
				r.Add(s)
				if got := r.String("x" + s + "x"); got != "x<redacted>x" {
					t.Errorf("String = %q", got)
					return
				}
				logger.Info(s)
			}
		})
	}
	wg.Wait()
	if strings.Contains(buf.String(), "secret-") {
		t.Error("a secret reached the log")
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *lockedBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *lockedBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// redactCase is one generated property case: a secret, other secrets
// registered beside it, and filler text around it.
type redactCase struct {
	Secret string
	Others []string
	Before string
	After  string
}

// Secrets draw from an alphabet with every character the encodings care
// about (but not '<', '>' or NUL, see unmark); filler draws from
// characters that no encoder (JSON, slog's text quoting) escapes, so an
// encoder cannot turn filler into a secret's escaped form.
const (
	secretAlphabet = "abcXYZ019 /+=?&%#:@!$\"\\\n\t\u00e9\u20ac\xff~-_."
	fillerAlphabet = "abcdefXYZ0123456789 -_.,:;!?()[]*/=%@#$~|"
)

func pickFrom(r *rand.Rand, alphabet string, lo, hi int) string {
	var b strings.Builder
	for range lo + r.Intn(hi-lo+1) {
		b.WriteByte(alphabet[r.Intn(len(alphabet))])
	}
	return b.String()
}

func (redactCase) Generate(r *rand.Rand, _ int) reflect.Value {
	c := redactCase{
		Secret: pickFrom(r, secretAlphabet, 4, 40),
		Before: pickFrom(r, fillerAlphabet, 0, 30),
		After:  pickFrom(r, fillerAlphabet, 0, 30),
	}
	for range r.Intn(3) {
		c.Others = append(c.Others, pickFrom(r, secretAlphabet, 4, 12))
	}
	return reflect.ValueOf(c)
}

// TestRedactProperty: for random secrets in every form, embedded in random
// text, in encoded JSON, in nested values and in log records, no form of
// any registered secret survives. Seeded, so it is the same every run.
func TestRedactProperty(t *testing.T) {
	t.Parallel()
	check := func(c redactCase) bool {
		r := secrets.NewSecretRedactor()
		r.Add(c.Others...)
		r.Add(c.Secret)
		forms := jsonForms(c.Secret)
		fail := func(where, out string) bool {
			if f := survivor(out, forms); f != "" {
				t.Errorf("secret %q: form %q survives %s:\n%q", c.Secret, f, where, out)
				return false
			}
			return true
		}
		ok := true
		for _, form := range leakForms(c.Secret) {
			text := c.Before + form + c.After
			ok = fail("in text", r.String(text)) && ok
			ok = fail("in bytes", string(r.Bytes([]byte(text)))) && ok

			doc := map[string]any{"msg": text, "list": []any{1, map[string]any{form: text}}}
			data, _ := json.Marshal(doc)
			ok = fail("in encoded JSON", string(r.Bytes(data))) && ok

			red, _ := json.Marshal(r.Value(map[string]any{text: []any{doc, text}}))
			ok = fail("in a nested value", string(red)) && ok

			var buf bytes.Buffer
			slog.New(r.Handler(slog.NewJSONHandler(&buf, nil))).Info(text, "a", text, slog.Group("g", text, doc))
			slog.New(r.Handler(slog.NewTextHandler(&buf, nil))).Info(text, "a", text)
			ok = fail("in a log line", buf.String()) && ok
		}
		if len(c.Secret) >= 7 {
			enc := base64.StdEncoding.EncodeToString([]byte(c.Before + c.Secret + c.After))
			if out := r.String(enc); !strings.Contains(out, secrets.RedactedText) {
				t.Errorf("secret %q inside base64 %q not redacted", c.Secret, enc)
				ok = false
			}
		}
		return ok
	}
	cfg := &quick.Config{MaxCount: 250, Rand: rand.New(rand.NewSource(4))}
	if err := quick.Check(check, cfg); err != nil {
		t.Fatal(err)
	}
}

// plainFiller reports whether JSON encodes s as itself.
func plainFiller(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || strings.IndexByte(`"\<>&`, c) >= 0 {
			return false
		}
	}
	return true
}

// FuzzRedactorString: whatever the secret and the text around it, String
// never panics, and no form of a secret of MinRedactLen bytes or more
// survives (for secrets that cannot overlap the marker, see unmark).
func FuzzRedactorString(f *testing.F) {
	for _, seed := range [][3]string{
		{"hunter22", "password=", "&next=1"},
		{"p@ss w/rd+=", "Authorization: Basic ", ""},
		{"tok\"en\\x", `{"a":"`, `"}`},
		{"abcd", "abcabcdd", "dabcd"},
		{"\xff\xfe\xfd\xfc", "\xff", "\xfc"},
		{"short", "<redacted>", "<redacted"},
		{"€€€€", "%E2%82%AC", "4oKs"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, secret, before, after string) {
		r := secrets.NewSecretRedactor()
		r.Add(secret)
		checkable := len(secret) >= secrets.MinRedactLen && !strings.ContainsAny(secret, "<>\x00")
		for _, form := range leakForms(secret) {
			out := r.String(before + form + after)
			if !checkable {
				continue
			}
			if f := survivor(out, leakForms(secret)); f != "" {
				t.Fatalf("form %q of %q survives: %q", f, secret, out)
			}
		}
		if !checkable {
			return
		}
		if !plainFiller(before + after) {
			return // encoding could turn filler into an escaped secret
		}
		data, _ := json.Marshal(before + secret + after)
		if f := survivor(string(r.Bytes(data)), jsonForms(secret)); f != "" {
			t.Fatalf("form %q of %q survives in JSON %s", f, secret, data)
		}
	})
}
