package document

import (
	"path"
	"strings"
)

// MatchOp matches an operation name against operation globs. Names may
// hold '/' (OpenAPI operationIds such as issues/list-for-repo), which
// path.Match's '*' does not cross; in an operation name '/' is an ordinary
// character, so a deny or grant of "*" covers every operation and
// "issues*" all of issues/…. (matchAny keeps path.Match's reading for
// values such as URLs, where '*' must stay inside one segment.)
func MatchOp(globs []string, name string) bool {
	const sep = "\x00"
	name = strings.ReplaceAll(name, "/", sep)
	for _, g := range globs {
		if ok, _ := path.Match(strings.ReplaceAll(g, "/", sep), name); ok {
			return true
		}
	}
	return false
}

func MatchAny(globs []string, name string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}
