package document

import (
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// LookOp is the Op of "<connection>_look" tools, which no connection has.
const LookOp = "$look"

// parseLook parses a manifest entry's {"look": {"<read>": timing}}: each
// timing is turn, effect or ask, and each read one the entry's profile
// (or what the connection speaks, when that is known) has.
func (p *parser) parseLook(name string, v any, at string) {
	m, ok := v.(map[string]any)
	if !ok {
		p.fail(at, fault.CodeValidationFailed, "must map read names to turn, effect or ask")
		return
	}
	reads, known := p.readsFor(name)
	out := map[string]string{}
	for _, read := range SortedKeys(m) {
		ra := at + "/" + fault.Escape(read)
		t, _ := m[read].(string)
		switch {
		case t != profiles.LookTurn && t != profiles.LookEffect && t != profiles.LookAsk:
			p.fail(ra, fault.CodeValidationFailed, "must be turn, effect or ask")
		case known && reads[read] == nil:
			p.fail(ra, fault.CodeValidationFailed, "connection %q has no read %q (its profile reads: %s)", name, read, OrNone(SortedKeys(reads)))
		default:
			out[read] = t
		}
	}
	if p.looks == nil {
		p.looks = map[string]map[string]string{}
	}
	p.looks[name] = out
}
