package agent

import (
	"testing"
)

func TestLineDiff(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, a, b, want string }{
		{"one line changed", "a\nb\nc", "a\nB\nc", "- b\n+ B"},
		{"added at the end", "a\nb", "a\nb\nc", "+ c"},
		{"removed at the start", "a\nb\nc", "b\nc", "- a"},
		{"moved", "a\nb\nc", "c\na\nb", "+ c\n- c"},
		{"from nothing", "", "a", "- \n+ a"},
		{"equal", "a\nb", "a\nb", ""},
	}
	for _, tc := range cases {
		got, ok := LineDiff(tc.a, tc.b)
		if !ok || got != tc.want {
			t.Errorf("%s: lineDiff = %q, %v; want %q", tc.name, got, ok, tc.want)
		}
	}
	long := make([]byte, 0, 3*MaxDiffLines)
	for range MaxDiffLines + 1 {
		long = append(long, "x\n"...)
	}
	if _, ok := LineDiff("a\n"+string(long), "b\n"+string(long)+"y"); ok {
		t.Error("a change over more than maxDiffLines lines was diffed")
	}
}

func TestLookShowsDiffsAgainstWhatWasSeen(t *testing.T) {
	t.Parallel()
	l := &LookLayer{Shown: map[string]string{}}
	steps := []struct {
		render    string
		full      bool
		form, out string
	}{
		{"a\nb", false, LookFull, "a\nb"},
		{"a\nb", false, LookUnchanged, ""},
		{"a\nc", false, LookDiff, "- b\n+ c"},
		{"a\nc", true, LookFull, "a\nc"},
		{"a\nd", false, LookDiff, "- c\n+ d"},
	}
	for i, s := range steps {
		form, out := l.Show("web", "ui.tree", s.render, s.full)
		if form != s.form || out != s.out {
			t.Errorf("step %d: show = %s %q, want %s %q", i, form, out, s.form, s.out)
		}
	}
}
