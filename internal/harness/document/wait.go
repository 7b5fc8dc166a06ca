package document

import (
	"slices"
	"strconv"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// KindWait waits for an event of a connection.
const KindWait = "wait"

// Wait limits.
const (
	defaultWaitTimeout = time.Minute
	maxWaitTimeout     = 24 * time.Hour
)

func (p *parser) wait(obj map[string]any, at string) *Node {
	p.checkFields(obj, at, "kind", "id", "connection", "event", "filter", "around", "timeoutMs")
	n := &Node{Kind: KindWait, ID: p.id(obj["id"], at), Path: at}
	n.Connection, _ = obj["connection"].(string)
	n.Event, _ = obj["event"].(string)
	switch _, err := p.reg.Get(n.Connection); {
	case n.Connection == "":
		p.fail(at+"/connection", fault.CodeValidationFailed, "is required and must be a connection name")
	case err != nil:
		p.fail(at+"/connection", fault.CodeConnectionUnknown, "no connection named %q", n.Connection)
	case !p.declared[n.Connection]:
		p.fail(at+"/connection", fault.CodeValidationFailed, "connection %q is not declared in the document's connections", n.Connection)
	}
	if n.Event == "" {
		p.fail(at+"/event", fault.CodeValidationFailed, "is required and must be an event type")
	} else if p.declared[n.Connection] && !MatchAny(p.events[n.Connection], n.Event) {
		p.fail(at+"/event", fault.CodeValidationFailed, "event %q is not declared in the events of connection %q's entry", n.Event, n.Connection)
	} else if c, err := p.reg.Get(n.Connection); err == nil && len(c.EventTypes()) > 0 {
		// A server that lists its events (MCP events/list) is held to
		// them; one that lists none (a source, a webhook) is not.
		if !slices.ContainsFunc(c.EventTypes(), func(t connect.EventType) bool { return t.Name == n.Event }) {
			p.fail(at+"/event", fault.CodeValidationFailed, "connection %q's server offers no event %q", n.Connection, n.Event)
		}
	}
	n.Timeout = p.millis(obj, "timeoutMs", at, defaultWaitTimeout, maxWaitTimeout)
	if f, ok := obj["filter"]; ok {
		if e, ok := p.expression(f, at+"/filter").(*expression); ok {
			n.Filter = e
		}
	}
	if a, ok := obj["around"]; ok {
		steps, isArray := a.([]any)
		if !isArray {
			steps = []any{a}
		}
		seq := &Node{Kind: KindSequence, ID: n.ID + "/around", Path: at + "/around"}
		for i, s := range steps {
			stepAt := at + "/around"
			if isArray {
				stepAt += "/" + strconv.Itoa(i)
			}
			if child := p.node(s, stepAt); child != nil {
				seq.Steps = append(seq.Steps, child)
			}
		}
		n.Around = seq
	}
	p.done[n.ID] = true
	return n
}
