package docs_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// What differs from one run to the next, and what stands for it in a
// golden. Both sides pass through normalize before they are compared, so
// a golden (and the answer block in a guide) may show real ids and times.
var volatile = []struct {
	re   *regexp.Regexp
	repl string
}{
	// RFC 3339 times: createdAt, expiresAt, a task's lastUpdatedAt.
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`), "<time>"},
	// Durations measured by the server.
	{regexp.MustCompile(`"(durationMs|loadMs)":\s*\d+`), `"$1": 0`},
	// Event ids of an execution's stream (a Redis stream id).
	{regexp.MustCompile(`\b\d{13}-\d+\b`), "<event>"},
	// An OpenAPI identity's hash covers the base URL, and so the port of
	// the mock the test started.
	{regexp.MustCompile(`(\.yaml|\.json)#[0-9a-f]{16}\b`), "$1#<hash>"},
	// Ports of loopback servers the test started.
	{regexp.MustCompile(`\b(127\.0\.0\.1|localhost):\d{2,5}\b`), "$1:<port>"},
}

// Ids are numbered in order of first appearance, so a golden still says
// which answers name the same execution: ex_ executions, ap_ approvals,
// qs_ questions (lower-case base32), and upper-case base32 ids (tasks,
// identity instances).
var (
	prefixedID = regexp.MustCompile(`\b([a-z]{2})_[a-z2-7]{26}\b`)
	bareID     = regexp.MustCompile(`\b[A-Z2-7]{26}\b`)
)

func normalize(s string) string {
	for _, v := range volatile {
		s = v.re.ReplaceAllString(s, v.repl)
	}
	seen := map[string]string{}
	number := func(kind, id string) string {
		if n, ok := seen[id]; ok {
			return n
		}
		count := 1
		for _, v := range seen {
			if strings.HasPrefix(v, kind) {
				count++
			}
		}
		seen[id] = kind + strconv.Itoa(count) + ">"
		return seen[id]
	}
	s = prefixedID.ReplaceAllStringFunc(s, func(id string) string { return number(id[:3]+"<", id) })
	return bareID.ReplaceAllStringFunc(s, func(id string) string { return number("<id", id) })
}

// ellipsis is what "..." becomes inside a golden's JSON: a member of an
// object (the object may have members the golden leaves out) or an
// element of an array (the array may go on).
const ellipsis = "…"

// matchOutput compares what a script printed with its golden, both
// normalized. When both are JSON (one value or several in a row) they are
// compared as values, so a golden may be formatted for reading, and a
// "..." in it stands for members or elements left out. Otherwise they are
// compared line by line, where a line "..." stands for any lines.
func matchOutput(golden, got string) error {
	golden, got = normalize(golden), normalize(got)
	if want, err := decodeJSON(golden, true); err == nil {
		have, err := decodeJSON(got, false)
		if err != nil {
			return fmt.Errorf("the golden is JSON, the output is not: %v", err)
		}
		if len(want) != len(have) {
			return fmt.Errorf("%d JSON values printed, the golden has %d", len(have), len(want))
		}
		for i := range want {
			if err := matchJSON(fmt.Sprintf("value %d", i+1), want[i], have[i]); err != nil {
				return err
			}
		}
		return nil
	}
	return matchLines(strings.Split(strings.TrimRight(golden, "\n"), "\n"), strings.Split(strings.TrimRight(got, "\n"), "\n"))
}

// decodeJSON reads one or more JSON values; with dots, "..." may stand
// where a member or element would.
func decodeJSON(s string, dots bool) ([]any, error) {
	if dots {
		var err error
		if s, err = expandEllipses(s); err != nil {
			return nil, err
		}
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var out []any
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("no JSON value")
	}
	return out, nil
}

// expandEllipses rewrites each "..." outside strings into JSON: a member
// `"…": 0` in an object, an element `"…"` in an array, with the commas
// JSON wants around it.
func expandEllipses(s string) (string, error) {
	var b strings.Builder
	var stack []byte
	inString := false
	last := func() byte { // the last significant byte written
		out := strings.TrimRight(b.String(), " \t\r\n")
		if out == "" {
			return 0
		}
		return out[len(out)-1]
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inString:
			if c == '\\' && i+1 < len(s) {
				b.WriteByte(c)
				i++
				c = s[i]
			} else if c == '"' {
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			stack = append(stack, c)
		case c == '}' || c == ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		case strings.HasPrefix(s[i:], "..."):
			if len(stack) == 0 {
				return "", errors.New(`"..." outside an object or array`)
			}
			if l := last(); l != ',' && l != '{' && l != '[' {
				b.WriteByte(',')
			}
			if stack[len(stack)-1] == '{' {
				b.WriteString(`"` + ellipsis + `": 0`)
			} else {
				b.WriteString(`"` + ellipsis + `"`)
			}
			i += 2
			rest := strings.TrimLeft(s[i+1:], " \t\r\n")
			if rest != "" && rest[0] != ',' && rest[0] != '}' && rest[0] != ']' {
				b.WriteByte(',')
			}
			continue
		}
		b.WriteByte(c)
	}
	return b.String(), nil
}

// matchJSON reports the first place where got differs from want.
func matchJSON(path string, want, got any) error {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: got %s, the golden has an object", path, short(got))
		}
		_, open := w[ellipsis]
		keys := make([]string, 0, len(w))
		for k := range w {
			if k != ellipsis {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			gv, ok := g[k]
			if !ok {
				return fmt.Errorf("%s: no member %q in the output", path, k)
			}
			if err := matchJSON(path+"/"+k, w[k], gv); err != nil {
				return err
			}
		}
		if !open {
			for k := range g {
				if _, ok := w[k]; !ok {
					return fmt.Errorf("%s: member %q is not in the golden (add it, or \"...\")", path, k)
				}
			}
		}
		return nil
	case []any:
		g, ok := got.([]any)
		if !ok {
			return fmt.Errorf("%s: got %s, the golden has an array", path, short(got))
		}
		n := slices.Index(w, any(ellipsis))
		if n >= 0 && n != len(w)-1 {
			return fmt.Errorf("%s: \"...\" may only end an array", path)
		}
		if n < 0 {
			n = len(w)
			if len(g) != n {
				return fmt.Errorf("%s: %d elements in the output, %d in the golden", path, len(g), n)
			}
		}
		if len(g) < n {
			return fmt.Errorf("%s: %d elements in the output, the golden shows %d", path, len(g), n)
		}
		for i := range n {
			if err := matchJSON(fmt.Sprintf("%s/%d", path, i), w[i], g[i]); err != nil {
				return err
			}
		}
		return nil
	default:
		if !reflect.DeepEqual(want, got) {
			return fmt.Errorf("%s: got %s, the golden has %s", path, short(got), short(want))
		}
		return nil
	}
}

func short(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 120 {
		return string(b[:117]) + "..."
	}
	return string(b)
}

// matchLines matches got against want, where a line "..." in want stands
// for any number of lines.
func matchLines(want, got []string) error {
	var match func(w, g int) bool
	memo := map[[2]int]bool{}
	match = func(w, g int) bool {
		key := [2]int{w, g}
		if v, ok := memo[key]; ok {
			return v
		}
		var ok bool
		switch {
		case w == len(want):
			ok = g == len(got)
		case strings.TrimSpace(want[w]) == "...":
			ok = match(w+1, g) || (g < len(got) && match(w, g+1))
		default:
			ok = g < len(got) && want[w] == got[g] && match(w+1, g+1)
		}
		memo[key] = ok
		return ok
	}
	if match(0, 0) {
		return nil
	}
	// Say where: the first line of want that no prefix of got reaches.
	for i := range want {
		if strings.TrimSpace(want[i]) == "..." {
			continue
		}
		if !slices.Contains(got, want[i]) {
			return fmt.Errorf("golden line %d %q is not in the output", i+1, want[i])
		}
	}
	return errors.New("the output's lines differ from the golden's (order, or lines the golden does not show)")
}

// formatGolden is what -update writes: JSON values indented, one after
// another; anything else as it was printed.
func formatGolden(out string) string {
	vals, err := decodeJSON(out, false)
	if err != nil {
		if !strings.HasSuffix(out, "\n") {
			out += "\n"
		}
		return out
	}
	var b bytes.Buffer
	dec := json.NewDecoder(strings.NewReader(out))
	for range vals {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return out
		}
		_ = json.Indent(&b, raw, "", "  ")
		b.WriteByte('\n')
	}
	return b.String()
}

func TestNormalize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"times", `{"createdAt":"2026-12-05T06:03:38.960434961Z","at":"2026-01-02T03:04:05+01:00"}`, `{"createdAt":"<time>","at":"<time>"}`},
		{"durations", `{"durationMs":5, "loadMs": 120, "timeoutMs": 5000}`, `{"durationMs": 0, "loadMs": 0, "timeoutMs": 5000}`},
		{"ids numbered by first appearance", `ex_6qajzy3hgx3ltscbbzw4vnmve6 ex_zskuu27xhb45c63mfbn2jcjlbz ex_6qajzy3hgx3ltscbbzw4vnmve6:sum`, `ex_<1> ex_<2> ex_<1>:sum`},
		{"kinds numbered apart", `qs_bclge6wihlvpmuhqynawd7ogwm ex_ni6rcr4hf3p5moivpz5qharyu5 ap_bclge6wihlvpmuhqynawd7ogwm`, `qs_<1> ex_<1> ap_<1>`},
		{"upper-case ids", `"task":"SQ56GAADRUAOTH4DFSYL57PHY6","instance":"TUQPTEIBW6ZNG3WH3QJRDP6LJV","again":"SQ56GAADRUAOTH4DFSYL57PHY6"`, `"task":"<id1>","instance":"<id2>","again":"<id1>"`},
		{"event ids", "id: 1796450938613-1\nevent: step.started", "id: <event>\nevent: step.started"},
		{"ports", "http://127.0.0.1:45563/mcp localhost:4010", "http://127.0.0.1:<port>/mcp localhost:<port>"},
		{"document hashes", `"instance":"./petstore3.yaml#70ba0b049e3f6799"`, `"instance":"./petstore3.yaml#<hash>"`},
		{"words stay", "Add 2 and 3 with the demo tools", "Add 2 and 3 with the demo tools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := normalize(tc.in); got != tc.want {
				t.Errorf("normalize(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestMatchOutput(t *testing.T) {
	t.Parallel()
	run := `{"id":"ex_6qajzy3hgx3ltscbbzw4vnmve6","status":"succeeded","steps":[{"id":"sum","durationMs":5,"output":{"sum":5}},{"id":"save"}],"links":{"self":"/v1/executions/ex_6qajzy3hgx3ltscbbzw4vnmve6"}}`
	for _, tc := range []struct {
		name, golden, got string
		ok                bool
	}{
		{"same JSON, other formatting and ids", "{\n  \"id\": \"ex_zskuu27xhb45c63mfbn2jcjlbz\",\n  \"status\": \"succeeded\",\n  \"steps\": [{ \"id\": \"sum\", \"durationMs\": 3, \"output\": { \"sum\": 5 } }, { \"id\": \"save\" }],\n  \"links\": { \"self\": \"/v1/executions/ex_zskuu27xhb45c63mfbn2jcjlbz\" }\n}\n", run, true},
		{"ellipses leave members and elements out", `{"id": "ex_zskuu27xhb45c63mfbn2jcjlbz", "steps": [{"id": "sum", ...}, ...], ...}`, run, true},
		{"ellipsis without commas", "{\n  \"status\": \"succeeded\"\n  ...\n  \"id\": \"ex_zskuu27xhb45c63mfbn2jcjlbz\"\n}", run, true},
		{"a renamed member", `{"id": "ex_zskuu27xhb45c63mfbn2jcjlbz", "state": "succeeded", ...}`, run, false},
		{"a member the golden does not show", `{"id": "ex_zskuu27xhb45c63mfbn2jcjlbz", "status": "succeeded", "steps": [...]}`, run, false},
		{"another value", `{"status": "failed", ...}`, run, false},
		{"a missing element", `{"steps": [{"id": "sum", ...}], ...}`, run, false},
		{"the same id twice must stay the same", `{"id": "ex_zskuu27xhb45c63mfbn2jcjlbz", "links": {"self": "/v1/executions/ex_aaaaaaaaaaaaaaaaaaaaaaaaaa"}, ...}`, run, false},
		{"several values", "{\"a\": 1}\n{\"b\": 2}\n", `{"a":1}{"b":2}`, true},
		{"text with elided lines", "event: a\n...\nevent: z\n", "event: a\nevent: b\nevent: c\nevent: z", true},
		{"text out of order", "event: z\n...\nevent: a\n", "event: a\nevent: z", false},
		{"text, a line changed", "ready\nsucceeded\n", "ready\nfailed\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := matchOutput(tc.golden, tc.got)
			if (err == nil) != tc.ok {
				t.Errorf("matchOutput = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
