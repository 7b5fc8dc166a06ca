// Package authz owns who may do what: the roles an API key carries, and the
// rules the JSON API and the admin UI apply with them. It holds no state and
// imports nothing of patchbay's, so config can validate role names and
// api, web and harness can share one answer to "may this principal …?".
//
// The roles:
//   - run: submit executions under the key's allowlist; read, stream, cancel
//     and resume its own executions; see its own approvals and allowlist.
//   - read: read every execution, approval, connection, allowlist and dead
//     letter (an auditor or a dashboard). Changes nothing.
//   - approve: decide approvals, limited to Approve globs when given
//     ("<connection>.<operation>"), never a call its holder requested; and
//     answer servers' questions (globs covering a whole connection).
//   - admin: allowlists, secrets, dead letters, redelivery, starting the
//     harness, and everything the other roles allow.
//
// A key without roles has run: it can do its own work and see it, nothing
// else. Any other role name (oncall, sre) grants nothing by itself; a
// connection's policy may name it among its approvers as "role:<name>".
// Pushing events into a source is a grant of its own (Push), not a role:
// a push starts trigger runs with the host's trust.
package authz

import (
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Role is a named set of permissions.
type Role string

// The built-in roles.
const (
	Run     Role = "run"
	Read    Role = "read"
	Approve Role = "approve"
	Admin   Role = "admin"
)

var roleName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)

// ValidRole reports whether name can be a role: a lowercase letter, then
// lowercase letters, digits, '_' or '-' (at most 32).
func ValidRole(name string) bool { return roleName.MatchString(name) }

// Principal is who makes a request: an API key, or the operator signed in
// to the admin UI with the admin token.
type Principal struct {
	// Name identifies the principal: it owns the executions it starts and
	// is recorded as requester and decider.
	Name string
	// Allowlist bounds what its documents may use.
	Allowlist string
	// Roles it holds; empty means run.
	Roles []Role
	// Approve limits the approve role to approvals whose
	// "<connection>.<operation>" matches one of these globs; empty means
	// any.
	Approve []string
	// Push names the sources it may push events into.
	Push []string
	// Bridge, when set, says the caller is an acp-agent node's agent,
	// authenticated with the credential minted for that node run: /mcp
	// offers it the node's tools and runs its calls as steps of the
	// node's execution (the bridge's id, see harness.Executions.Bridge).
	Bridge string
}

// Names patchbay gives principals of its own. A configured key named like
// one would be that principal: it would own, read and replay what that
// one owns (executions, idempotency keys, OAuth sign-ins), so Reserved
// refuses them.
const (
	// OperatorName is the operator signed in with the admin token; a
	// shared OAuth connection's sign-in is kept under it.
	OperatorName = "admin"
	// HostName owns host-trusted runs: triggers, cron, pushed events.
	HostName = "trigger"
	// SystemName is recorded as the decider of approvals that expire.
	SystemName = "patchbay"
	// GeneratedName is the key a server makes for one run when none is
	// configured.
	GeneratedName = "generated"
)

// EnvKeyName is the name of the key at position i (from 0) of the
// environment's key list, whose keys have no names of their own.
func EnvKeyName(i int) string { return "env-" + strconv.Itoa(i+1) }

var envKeyName = regexp.MustCompile(`^env-[0-9]+$`)

// Reserved says why name may not be given to a configured key, or ""
// when it may: patchbay's own principals and the names of the
// environment's keys (env-<n>) are taken.
func Reserved(name string) string {
	switch name {
	case OperatorName:
		return "the operator's (the admin token's) principal"
	case HostName:
		return "the principal of host-trusted runs (triggers, cron)"
	case SystemName:
		return "the decider of expired approvals"
	case GeneratedName:
		return "the key made for a run when none is configured"
	}
	if envKeyName.MatchString(name) {
		return "names env-<n> are given to the keys of the environment's list"
	}
	return ""
}

// Operator is the principal of the admin token: every role.
func Operator(name string) Principal {
	return Principal{Name: name, Roles: slices.Clone(builtin)}
}

// Has reports whether p holds r. admin holds every built-in role (not the
// other names, so "role:oncall" among a connection's approvers stays with
// on-call); a principal with no roles holds run.
func (p Principal) Has(r Role) bool {
	if len(p.Roles) == 0 {
		return r == Run
	}
	if slices.Contains(p.Roles, r) {
		return true
	}
	return slices.Contains(p.Roles, Admin) && slices.Contains(builtin, r)
}

var builtin = []Role{Run, Read, Approve, Admin}

// RoleNames are p's roles as strings, run when it names none.
func (p Principal) RoleNames() []string {
	if len(p.Roles) == 0 {
		return []string{string(Run)}
	}
	out := make([]string, len(p.Roles))
	for i, r := range p.Roles {
		out[i] = string(r)
	}
	return out
}

// SeesAll reports whether p may read what others own.
func (p Principal) SeesAll() bool { return p.Has(Read) }

// Sees reports whether p may read something owner owns.
func (p Principal) Sees(owner string) bool { return p.Name == owner || p.SeesAll() }

// Acts reports whether p may change (cancel, resume) something owner owns:
// its own work with run, anyone's with admin.
func (p Principal) Acts(owner string) bool {
	return (p.Name == owner && p.Has(Run)) || p.Has(Admin)
}

// MayApprove reports whether p's approve role reaches an approval of op on
// connection. It does not judge who requested it or the connection's
// approvers: Decides does.
func (p Principal) MayApprove(connection, op string) bool {
	if !p.Has(Approve) {
		return false
	}
	if len(p.Approve) == 0 || p.Has(Admin) {
		return true
	}
	return matchAny(p.Approve, connection+"."+op)
}

// SeesApproval reports whether p may read an approval of op on connection
// that requester asked for: its own, those it may decide, or all with read.
func (p Principal) SeesApproval(requester, connection, op string) bool {
	return p.Sees(requester) || p.MayApprove(connection, op)
}

// MayAnswer reports whether p's approve role reaches the questions (MCP
// elicitations) a server of connection asks. A question speaks for the
// connection, not for one operation, so Approve globs reach it only when
// one covers every operation of the connection ("<connection glob>.*", or
// a glob without a dot that matches "<connection>.*", such as "*"). It
// does not judge who asked or the connection's answerers: the question
// queue does.
func (p Principal) MayAnswer(connection string) bool {
	if !p.Has(Approve) {
		return false
	}
	if len(p.Approve) == 0 || p.Has(Admin) {
		return true
	}
	for _, g := range p.Approve {
		conn, op, dotted := strings.Cut(g, ".")
		if !dotted {
			if ok, _ := path.Match(g, connection+".*"); ok {
				return true
			}
			continue
		}
		if ok, _ := path.Match(conn, connection); ok && op == "*" {
			return true
		}
	}
	return false
}

// SeesQuestion reports whether p may read a question a server of
// connection put to requester's execution: its own, those its approve
// role reaches, or all with read.
func (p Principal) SeesQuestion(requester, connection string) bool {
	return p.Sees(requester) || p.MayAnswer(connection)
}

// Named reports whether p is among approvers: by name, or by a role as
// "role:<name>". An empty list names everyone.
func (p Principal) Named(approvers []string) bool {
	if len(approvers) == 0 {
		return true
	}
	for _, a := range approvers {
		if a == p.Name {
			return true
		}
		if r, ok := cutRole(a); ok && p.Has(Role(r)) {
			return true
		}
	}
	return false
}

// MayPush reports whether p may push events into source.
func (p Principal) MayPush(source string) bool {
	return p.Has(Admin) || slices.Contains(p.Push, source)
}

func cutRole(s string) (string, bool) {
	const prefix = "role:"
	if len(s) > len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):], true
	}
	return "", false
}

// ValidApprover reports whether s can name an approver: a principal name
// or "role:<role>".
func ValidApprover(s string) bool {
	if r, ok := cutRole(s); ok {
		return ValidRole(r)
	}
	return s != "" && len(s) <= 64
}

func matchAny(globs []string, name string) bool {
	for _, g := range globs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}
