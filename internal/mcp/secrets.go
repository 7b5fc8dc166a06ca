package mcp

import (
	"maps"
	"net/url"
	"path/filepath"
	"slices"

	"github.com/patchbay-dev/patchbay/internal/config"
)

// minSecretLen is the shortest stdio env value registered as a secret:
// shorter values ("1", "true", "info") are settings, and scrubbing them
// would mangle every log line that happens to contain them.
const minSecretLen = 8

// Secrets lists the values of an MCP entry that must be scrubbed from
// everything stored or shown: every header value, the URL's userinfo
// (user and password) and query values, and every stdio env value except
// those under 8 characters and absolute paths. The list is sorted and has
// no duplicates or empty strings; the redaction engine adds the encoded
// forms.
func Secrets(spec config.MCP) []string {
	set := map[string]bool{}
	add := func(v string) {
		if v != "" {
			set[v] = true
		}
	}
	for _, v := range spec.Headers {
		add(v)
	}
	if spec.URL != "" {
		if u, err := url.Parse(spec.URL); err == nil {
			if u.User != nil {
				add(u.User.Username())
				if p, ok := u.User.Password(); ok {
					add(p)
				}
			}
			for _, vs := range u.Query() {
				for _, v := range vs {
					add(v)
				}
			}
		}
	}
	for _, v := range spec.Env {
		if len(v) < minSecretLen || filepath.IsAbs(v) {
			continue
		}
		add(v)
	}
	return slices.Sorted(maps.Keys(set))
}
