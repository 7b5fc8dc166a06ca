package fault

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
)

// maxReportedNumbers bounds how many out-of-range numbers one answer names.
const maxReportedNumbers = 10

// NumbersOutOfRange returns the JSON Pointers (under base) of the numbers
// in raw that do not fit a float64, such as 1e400. Decoded the usual way
// such a number becomes null or an error that is easy to drop, so a value
// would change silently; callers refuse the request instead. Input that is
// not JSON has none (its own decoding reports it).
func NumbersOutOfRange(raw []byte, base string) []string {
	if !mayOverflow(raw) {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return nil
	}
	var out []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		if len(out) == maxReportedNumbers {
			return
		}
		switch x := v.(type) {
		case json.Number:
			if _, err := strconv.ParseFloat(string(x), 64); err != nil {
				out = append(out, path)
			}
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(x)) {
				walk(path+"/"+Escape(k), x[k])
			}
		case []any:
			for i, e := range x {
				walk(path+"/"+strconv.Itoa(i), e)
			}
		}
	}
	walk(base, v)
	return out
}

// mayOverflow reports whether raw may hold a number beyond a float64: one
// written with an exponent (a digit followed by e or E) or with at least
// 309 digits in a row. Any such number has one or the other, so a body
// with neither — nearly every request — is not decoded a second time just
// to look; a string that merely looks so costs the full check, no more.
func mayOverflow(raw []byte) bool {
	run := 0
	for i, c := range raw {
		switch {
		case c >= '0' && c <= '9':
			if run++; run >= 309 {
				return true
			}
		case (c == 'e' || c == 'E') && run > 0 && i+1 < len(raw):
			return true
		default:
			run = 0
		}
	}
	return false
}
