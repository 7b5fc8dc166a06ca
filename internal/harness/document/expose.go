package document

import (
	"encoding/json"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// Exposure modes of a manifest entry.
const (
	ExposeEager   = "eager"
	ExposeCall    = "call"
	ExposeProfile = "profile"
)

// exposure is how one manifest entry's operations reach a model.
type exposure struct {
	Mode    string
	Profile *profiles.Profile // the entry's profile; nil without one
}

// exposure parses an entry's "expose" (after its profile) and records it
// when it differs from eager.
func (p *parser) exposure(name string, e map[string]any, at string) {
	prof := p.entryProfiles[name]
	_, named := e["profile"]
	mode := ExposeEager
	if named {
		mode = ExposeProfile
	}
	if v, ok := e["expose"]; ok {
		s, _ := v.(string)
		switch s {
		case ExposeEager, ExposeCall:
			mode = s
		case ExposeProfile:
			if !named {
				p.fail(at+"/expose", fault.CodeValidationFailed, "\"profile\" offers the eager set of the entry's profile, and this entry names no profile; use \"eager\" or \"call\"")
			}
		default:
			raw, _ := json.Marshal(v)
			p.fail(at+"/expose", fault.CodeValidationFailed, "must be \"eager\", \"call\" or \"profile\", got %s", raw)
		}
	}
	if mode == ExposeEager {
		return
	}
	if p.exposures == nil {
		p.exposures = map[string]exposure{}
	}
	p.exposures[name] = exposure{Mode: mode, Profile: prof}
}
