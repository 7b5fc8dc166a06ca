package fault_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

func TestNumbersOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		want      []string
	}{
		{"none", `{"a": 1, "b": [1.5, -2e300, 0]}`, nil},
		{"top level", `1e400`, []string{"/input"}},
		{"in an object", `{"n": 1e400, "m": 2}`, []string{"/input/n"}},
		{"negative", `{"n": -1e400}`, []string{"/input/n"}},
		{"in an array", `{"a": [0, 1, 1e999]}`, []string{"/input/a/2"}},
		{"escaped key", `{"a/b": {"c~d": 1E+400}}`, []string{"/input/a~1b/c~0d"}},
		{"several, sorted", `{"z": 1e400, "a": 1e401}`, []string{"/input/a", "/input/z"}},
		{"tiny is fine", `{"n": 1e-400}`, nil},
		{"no exponent, 400 digits", `{"n": 1` + strings.Repeat("0", 399) + `}`, []string{"/input/n"}},
		{"309 digits that fit", `{"n": 1` + strings.Repeat("0", 308) + `}`, nil},
		{"an exponent in a string", `{"s": "1e400", "t": "` + strings.Repeat("9", 400) + `"}`, nil},
		{"not JSON", `{"n": `, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fault.NumbersOutOfRange([]byte(tc.raw), "/input"); !slices.Equal(got, tc.want) {
				t.Errorf("NumbersOutOfRange(%s) = %q, want %q", tc.raw, got, tc.want)
			}
		})
	}
}
