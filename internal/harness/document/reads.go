package document

import (
	"strings"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// KindRead is a verify's subject when it is a profile read: Connection
// and Op (the read's name) say which.
const KindRead = "read"

// readSubject parses a verify's {"connection": c, "read": "<read>"}: c is
// a connection the document declares, and the read is one its profile
// has. The profile is the entry's ({"profile": …}) or what the connection
// speaks; a server the document brings is known only once attached, so
// its reads are checked when the verify runs. The node's Path is the
// verify's, so the allowlist names /read.
func (p *parser) readSubject(obj map[string]any, read, verifyID, path string) *Node {
	name, _ := obj["connection"].(string)
	sub := &Node{Kind: KindRead, ID: verifyID + "#read", Path: path, Connection: name, Op: read}
	switch {
	case name == "":
		p.fail(path+"/connection", fault.CodeValidationFailed, "is required with a read name: the connection whose profile read is judged")
		return nil
	case !p.declared[name]:
		p.fail(path+"/connection", fault.CodeValidationFailed, "connection %q is not declared in the document's connections", name)
		return nil
	}
	reads, known := p.readsFor(name)
	switch {
	case !known:
	case len(reads) == 0:
		p.fail(path+"/connection", fault.CodeValidationFailed, "connection %q speaks no profile with reads, so there is nothing named %q to read", name, read)
	case reads[read] == nil:
		p.fail(path+"/read", fault.CodeValidationFailed, "connection %q has no read %q (its profile reads: %s)", name, read, strings.Join(SortedKeys(reads), ", "))
	}
	return sub
}

// readsFor lists the reads a document's connection name offers, by its
// entry's profile or by what it (a handle: its pool) speaks; known is
// false when that cannot be told before the run.
func (p *parser) readsFor(name string) (reads map[string]*profiles.Read, known bool) {
	if prof := p.entryProfiles[name]; prof != nil {
		return prof.Reads, true
	}
	if _, ok := p.attachedSpecs[name]; ok {
		return nil, false
	}
	conn := name
	if h, ok := p.handles[name]; ok {
		conn = h.Pool
	}
	c, err := p.reg.Get(conn)
	if err != nil || (c.State() != connect.StateReady && len(c.Profiles()) == 0) {
		return nil, false
	}
	reads = map[string]*profiles.Read{}
	for rname, src := range ReadsOf(c) {
		reads[rname] = src.Read
	}
	return reads, true
}

// ReadSource is where one read of a connection comes from.
type ReadSource struct {
	Profile *profiles.Profile
	Read    *profiles.Read
	// Bound is the binding's way to take it; nil for a declaring server.
	Bound   *profiles.BoundRead
	Binding string
}

// ReadsOf lists, by read name, the reads of every profile conn speaks
// with a definition (the first profile wins a name two of them define).
func ReadsOf(conn *registry.Connection) map[string]ReadSource {
	b := conn.Binding()
	out := map[string]ReadSource{}
	for _, sp := range conn.Profiles() {
		if sp.Profile == nil {
			continue
		}
		for name, rd := range sp.Profile.Reads {
			if _, seen := out[name]; seen {
				continue
			}
			src := ReadSource{Profile: sp.Profile, Read: rd}
			if sp.Binding != "" && b != nil && b.Name == sp.Binding {
				src.Binding = b.Name
				src.Bound = b.Reads[name]
			}
			out[name] = src
		}
	}
	return out
}
