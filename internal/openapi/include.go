package openapi

import (
	"context"
	"fmt"
	"slices"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/sandbox"
)

// selector is an entry's include compiled: an operation is selected when
// any entry selects it, by operationId, tag or expression.
type selector struct {
	entries []config.Include
	progs   []*sandbox.Program // per entry; nil for a name
	matched []bool
}

// newSelector compiles include; nil (everything) when it is empty. Config
// already refused an expression that does not compile, so an error here
// names the entry for a spec built by hand.
func newSelector(include []config.Include) (*selector, error) {
	if len(include) == 0 {
		return nil, nil
	}
	s := &selector{entries: include, progs: make([]*sandbox.Program, len(include)), matched: make([]bool, len(include))}
	for i, in := range include {
		if in.Expr == "" {
			continue
		}
		p, err := config.CompileInclude(in.Expr)
		if err != nil {
			return nil, fmt.Errorf("include[%d].$expr: %w", i, err)
		}
		s.progs[i] = p
	}
	return s, nil
}

// match reports whether some entry selects the operation. Every entry is
// tried, so that unmatched names exactly those that select nothing.
func (s *selector) match(ctx context.Context, id, method, path string, tags []string) (bool, error) {
	var env map[string]any
	hit := false
	for i, in := range s.entries {
		var ok bool
		if p := s.progs[i]; p != nil {
			if env == nil {
				anyTags := make([]any, len(tags))
				for j, t := range tags {
					anyTags[j] = t
				}
				env = map[string]any{"operationId": id, "method": method, "path": path, "tags": anyTags}
			}
			out, err := p.Run(ctx, env)
			if err != nil {
				return false, fmt.Errorf("include[%d].$expr on %s %s: %w", i, method, path, err)
			}
			ok, _ = out.(bool)
		} else {
			ok = in.Name == id || slices.Contains(tags, in.Name)
		}
		if ok {
			hit, s.matched[i] = true, true
		}
	}
	return hit, nil
}

// unmatched lists the entries, as written, that selected nothing.
func (s *selector) unmatched() []string {
	if s == nil {
		return nil
	}
	var out []string
	for i, in := range s.entries {
		if !s.matched[i] {
			out = append(out, in.String())
		}
	}
	return out
}
