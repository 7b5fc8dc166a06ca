package document

import (
	"fmt"
	"strings"

	"github.com/Masterminds/semver/v3"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// profileOf resolves a manifest entry's "name@range" against what the
// connection speaks — for a handle, what its pool speaks, which every
// lease's server is bound to or checked against — or, for a server the
// document brings, against the catalog (what it speaks is known only once
// it is attached). It returns the profile the entry's steps are typed by.
func (p *parser) profileOf(name string, e map[string]any, s string, at string) *profiles.Profile {
	pname, cons, err := profiles.ParseRef(s)
	if err != nil {
		p.fail(at, fault.CodeValidationFailed, "%v", err)
		return nil
	}
	cat := p.reg.Catalog()
	if !cat.Known(pname) {
		p.fail(at, fault.CodeValidationFailed, "unknown profile %q (known: %s)", pname, strings.Join(cat.Names(), ", "))
		return nil
	}
	_, attaches := e["mcp"]
	if pool, ok := e["from"].(string); ok {
		name = pool
	}
	conn, err := p.reg.Get(name)
	if attaches || err != nil {
		prof, ok := cat.Match(pname, cons)
		if !ok {
			p.fail(at, fault.CodeValidationFailed, "no version of profile %s is within %s (known: %s)", pname, rangeOf(s), strings.Join(cat.Names(), ", "))
		}
		return prof
	}
	spoken := conn.Profiles()
	if len(spoken) == 0 {
		if st := conn.Status(); st.State != connect.StateReady {
			p.fail(at, registry.NotReadyCode(st.State), "connection %q is %s, so its profiles cannot be checked", name, st.State)
			return nil
		}
	}
	var speaks []string
	for _, sp := range spoken {
		speaks = append(speaks, sp.Name+"@"+sp.Version)
		if sp.Name != pname {
			continue
		}
		if v, err := semver.NewVersion(sp.Version); err != nil || !cons.Check(v) {
			p.fail(at, fault.CodeValidationFailed, "connection %q speaks %s@%s, outside %s", name, sp.Name, sp.Version, rangeOf(s))
			return nil
		}
		if sp.Profile == nil {
			p.fail(at, fault.CodeValidationFailed, "connection %q declares %s@%s, which this server has no definition of", name, sp.Name, sp.Version)
		}
		return sp.Profile
	}
	p.fail(at, fault.CodeValidationFailed, "connection %q does not speak profile %q (it speaks: %s)", name, pname, OrNone(speaks))
	return nil
}

func rangeOf(ref string) string {
	_, r, _ := strings.Cut(ref, "@")
	return r
}

func OrNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, ", ")
}

// typeCall types a call by the profile of its connection's entry: an
// operation of the profile gets its arguments checked now when they are
// all literal (else when the step runs) and its result after each call.
func (p *parser) typeCall(n *Node) {
	prof := p.entryProfiles[n.Connection]
	if prof == nil {
		return
	}
	if op, ok := prof.Operations[n.Op]; ok {
		n.Profile, n.ProfileOp = prof, op
	}
}

// checkLiteralArgs validates a typed call's arguments at submit when none
// is computed.
func (p *parser) checkLiteralArgs(n *Node, path string) {
	if n.ProfileOp == nil {
		return
	}
	args := map[string]any{}
	for k, v := range n.Args {
		l, ok := v.(Literal)
		if !ok || len(n.Secrets) > 0 {
			return
		}
		args[k] = l.v
	}
	if err := n.ProfileOp.CheckInput(args); err != nil {
		p.fail(path+"/args", fault.CodeValidationFailed, "arguments do not match %s operation %s: %s", n.Profile.ID(), n.Op, OneLine(err))
	}
}

// CheckProfileArgs is the run-time check of a typed call's arguments
// (after gates, refs opened, secrets still placeholders).
func CheckProfileArgs(n *Node, args map[string]any) error {
	if n.ProfileOp == nil {
		return nil
	}
	if err := n.ProfileOp.CheckInput(JSONValue(args)); err != nil {
		return fault.Deny(fault.GateSchema, fmt.Sprintf("arguments do not match %s operation %s: %s", n.Profile.ID(), n.Op, OneLine(err)))
	}
	return nil
}

// CheckProfileResult checks a typed call's result against the profile: a
// server that answers otherwise contradicts what it speaks.
func CheckProfileResult(n *Node, conn string, out any) error {
	if n.ProfileOp == nil {
		return nil
	}
	if err := n.ProfileOp.CheckOutput(JSONValue(out)); err != nil {
		return fmt.Errorf("the result of %s on %s contradicts %s: %s", n.Op, conn, n.Profile.ID(), OneLine(err))
	}
	return nil
}

func OneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
