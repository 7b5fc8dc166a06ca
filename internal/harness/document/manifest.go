package document

import (
	"fmt"

	"github.com/Masterminds/semver/v3"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// entry validates one manifest entry of a document: what the document says
// it needs of a connection.
func (p *parser) entry(name string, e map[string]any, at string) {
	p.checkFields(e, at, "profile", "expose", "extensions", "events", "from", "fresh", "setup", "mcp", "look")
	if v, ok := e["profile"]; ok {
		s, _ := v.(string)
		if prof := p.profileOf(name, e, s, at+"/profile"); prof != nil {
			if p.entryProfiles == nil {
				p.entryProfiles = map[string]*profiles.Profile{}
			}
			p.entryProfiles[name] = prof
		}
	}
	p.exposure(name, e, at)
	if v, ok := e["extensions"]; ok {
		exts, isObj := v.(map[string]any)
		if !isObj {
			p.fail(at+"/extensions", fault.CodeValidationFailed, "must map extension names to version ranges")
		}
		for _, ext := range SortedKeys(exts) {
			p.versionRange(exts[ext], at+"/extensions/"+fault.Escape(ext))
			p.fail(at+"/extensions/"+fault.Escape(ext), fault.CodeValidationFailed, "connection %q does not provide extension %q", name, ext)
		}
	}
	if v, ok := e["events"]; ok {
		events, isList := v.([]any)
		if !isList {
			p.fail(at+"/events", fault.CodeValidationFailed, "must be an array of event types")
		}
		for i, ev := range events {
			s, ok := ev.(string)
			if !ok || s == "" {
				p.fail(fmt.Sprintf("%s/events/%d", at, i), fault.CodeValidationFailed, "must be an event type")
				continue
			}
			if p.events == nil {
				p.events = map[string][]string{}
			}
			p.events[name] = append(p.events[name], s)
		}
	}
	_, from := e["from"]
	_, fresh := e["fresh"]
	_, setup := e["setup"]
	if m, ok := e["mcp"]; ok {
		p.attached(name, m, at)
		if from || fresh || setup {
			p.fail(at, fault.CodeValidationFailed, "an entry that brings its own server (mcp) takes no from, fresh or setup")
		}
		return
	}
	p.handle(name, e, at)
}

func (p *parser) versionRange(v any, at string) *semver.Constraints {
	s, _ := v.(string)
	c, err := semver.NewConstraint(s)
	if err != nil {
		p.fail(at, fault.CodeValidationFailed, "%q is not a version range: %v", s, err)
		return nil
	}
	return c
}

// AttachSpec is an MCP server a document brings itself. Header and env
// values name secrets, resolved only when the server is attached.
type AttachSpec struct {
	Name    string            `json:"name"`
	Type    string            `json:"type,omitempty"`
	URL     string            `json:"url,omitempty"`
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Headers map[string]string `json:"headers,omitempty"` // header → secret name
	Env     map[string]string `json:"env,omitempty"`     // variable → secret name
}

// Secrets lists the secret names the spec uses.
func (a AttachSpec) Secrets() []string {
	var out []string
	for _, m := range []map[string]string{a.Headers, a.Env} {
		for _, k := range SortedKeys(m) {
			out = append(out, m[k])
		}
	}
	return out
}

// attached validates an entry that brings its own MCP server: its key must
// equal mcp.name, it must not shadow a connection of the host, and its
// header and env values may only be secrets.
func (p *parser) attached(key string, v any, at string) {
	m, ok := v.(map[string]any)
	if !ok {
		p.fail(at+"/mcp", fault.CodeValidationFailed, "must be an object")
		return
	}
	at += "/mcp"
	p.checkFields(m, at, "name", "type", "url", "headers", "command", "args", "env")
	spec := AttachSpec{Name: key}
	if m["name"] != key {
		p.fail(at+"/name", fault.CodeValidationFailed, "must equal the entry's key %q", key)
	}
	if _, err := p.reg.Get(key); err == nil {
		p.fail(at+"/name", fault.CodeConnectionNameTaken, "the host already has a connection named %q", key)
	}
	spec.URL, _ = m["url"].(string)
	spec.Command, _ = m["command"].(string)
	spec.Type, _ = m["type"].(string)
	if (spec.URL == "") == (spec.Command == "") {
		p.fail(at, fault.CodeValidationFailed, "needs exactly one of url and command")
	}
	if args, ok := m["args"].([]any); ok {
		for i, a := range args {
			s, ok := a.(string)
			if !ok {
				p.fail(fmt.Sprintf("%s/args/%d", at, i), fault.CodeValidationFailed, "must be a string")
			}
			spec.Args = append(spec.Args, s)
		}
	}
	for _, field := range []string{"headers", "env"} {
		vals, _ := m[field].(map[string]any)
		for _, k := range SortedKeys(vals) {
			s, ok := vals[k].(map[string]any)
			name, isSecret := s["$secret"].(string)
			if !ok || !isSecret || len(s) != 1 || !secrets.ValidSecretName(name) {
				p.fail(at+"/"+field+"/"+fault.Escape(k), fault.CodeValidationFailed, "may only be a {\"$secret\": name}")
				continue
			}
			if field == "headers" {
				spec.Headers = setKey(spec.Headers, k, name)
			} else {
				spec.Env = setKey(spec.Env, k, name)
			}
		}
	}
	if p.attachedSpecs == nil {
		p.attachedSpecs = map[string]AttachSpec{}
	}
	p.attachedSpecs[key] = spec
}

func setKey(m map[string]string, k, v string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[k] = v
	return m
}
