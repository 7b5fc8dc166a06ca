package connect

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// PathArgError is a path parameter's value that would not stay one
// segment of its operation's path: "..", "." or "" (which a normalizing
// proxy or server resolves or collapses), or one holding "/" or "\", as
// written or once percent-decoded any number of times. Sent, it would
// reach another path than the one the allowlist granted and the policy
// judged. Gate 2 refuses such arguments; a provider that builds the
// request checks again.
type PathArgError struct {
	// Arg is the argument, the path template's parameter name.
	Arg string
	// Path is the operation's path template.
	Path   string
	Reason string
}

func (e *PathArgError) Error() string {
	return fmt.Sprintf("argument %q %s: a path parameter must stay one segment of %s (not empty, \".\" or \"..\", no \"/\" or \"\\\", also percent-encoded)", e.Arg, e.Reason, e.Path)
}

var pathParamRE = regexp.MustCompile(`\{([^{}/]+)\}`)

// CheckPathArgs checks the arguments of an HTTP operation's path
// parameters (the {name}s of route.Path); other arguments, and values
// that are not text (a secret still to be filled in, a number), pass. A
// list or an object is checked item by item.
func CheckPathArgs(route *HTTPRoute, args map[string]any) error {
	if route == nil {
		return nil
	}
	for _, m := range pathParamRE.FindAllStringSubmatch(route.Path, -1) {
		name := m[1]
		v, ok := args[name]
		if !ok {
			continue
		}
		if reason := badSegment(v); reason != "" {
			return &PathArgError{Arg: name, Path: route.Path, Reason: reason}
		}
	}
	return nil
}

// badSegment says why v cannot be one path segment, "" when it can.
func badSegment(v any) string {
	switch x := v.(type) {
	case string:
		return badText(x)
	case []any:
		for _, item := range x {
			if r := badSegment(item); r != "" {
				return r
			}
		}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if r := badText(k); r != "" {
				return r
			}
			if r := badSegment(x[k]); r != "" {
				return r
			}
		}
	}
	return ""
}

// maxDecodes bounds how many times a value is percent-decoded; each
// decoding that changes a value shortens it, so this is only a bound on
// the work for long values.
const maxDecodes = 8

func badText(s string) string {
	quoted := fmt.Sprintf("%q", Excerpt(s, 64))
	cur := s
	for i := 0; ; i++ {
		shown := quoted
		if i > 0 {
			shown = fmt.Sprintf("%s (decoded: %q)", quoted, Excerpt(cur, 64))
		}
		switch {
		case cur == "":
			return "is empty"
		case cur == "." || cur == "..":
			return "is " + shown
		case strings.ContainsAny(cur, `/\`):
			return "is " + shown + ` and holds "/" or "\"`
		}
		next, err := url.PathUnescape(cur)
		if err != nil || next == cur || i == maxDecodes {
			return ""
		}
		cur = next
	}
}
