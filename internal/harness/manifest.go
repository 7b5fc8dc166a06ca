package harness

import (
	"fmt"
	"strings"

	"github.com/Masterminds/semver/v3"
)

// Profiles installed in this build, by name. None yet: profiles (typed
// operation sets such as browser@1) come with the pools work, so a document
// naming one fails validation with the reason.
var profiles = map[string]*semver.Version{}

// entry validates one manifest entry of a document: what the document says
// it needs of a connection.
func (p *parser) entry(name string, e map[string]any, at string) {
	p.checkFields(e, at, "profile", "extensions", "events", "from", "fresh", "setup", "mcp")
	if v, ok := e["profile"]; ok {
		p.profile(v, at+"/profile")
	}
	if v, ok := e["extensions"]; ok {
		exts, isObj := v.(map[string]any)
		if !isObj {
			p.fail(at+"/extensions", CodeValidationFailed, "must map extension names to version ranges")
		}
		for _, ext := range sortedKeys(exts) {
			p.versionRange(exts[ext], at+"/extensions/"+escape(ext))
			p.fail(at+"/extensions/"+escape(ext), CodeValidationFailed, "connection %q does not provide extension %q", name, ext)
		}
	}
	if v, ok := e["events"]; ok {
		events, isList := v.([]any)
		if !isList {
			p.fail(at+"/events", CodeValidationFailed, "must be an array of event types")
		}
		for i, ev := range events {
			s, ok := ev.(string)
			if !ok || s == "" {
				p.fail(fmt.Sprintf("%s/events/%d", at, i), CodeValidationFailed, "must be an event type")
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
			p.fail(at, CodeValidationFailed, "an entry that brings its own server (mcp) takes no from, fresh or setup")
		}
		return
	}
	if fresh {
		if f := e["fresh"]; f != "path" && f != "execution" {
			p.fail(at+"/fresh", CodeValidationFailed, "must be \"path\" or \"execution\"")
		}
	}
	if setup {
		if _, ok := e["setup"].(map[string]any); !ok {
			p.fail(at+"/setup", CodeValidationFailed, "must be an object of setup values")
		}
	}
	if from || fresh || setup {
		p.fail(at, CodeNotSupported, "pooled connections (from, fresh, setup) are not yet supported")
	}
}

func (p *parser) profile(v any, at string) {
	s, ok := v.(string)
	nameRange := strings.SplitN(s, "@", 2)
	if !ok || len(nameRange) != 2 || nameRange[0] == "" {
		p.fail(at, CodeValidationFailed, "must be \"<profile>@<version range>\", e.g. \"browser@^1.2\"")
		return
	}
	c := p.versionRange(nameRange[1], at)
	installed, known := profiles[nameRange[0]]
	switch {
	case !known:
		p.fail(at, CodeValidationFailed, "unknown profile %q", nameRange[0])
	case c != nil && !c.Check(installed):
		p.fail(at, CodeValidationFailed, "profile %s is version %s, outside %s", nameRange[0], installed, nameRange[1])
	}
}

func (p *parser) versionRange(v any, at string) *semver.Constraints {
	s, _ := v.(string)
	c, err := semver.NewConstraint(s)
	if err != nil {
		p.fail(at, CodeValidationFailed, "%q is not a version range: %v", s, err)
		return nil
	}
	return c
}

// attached validates an entry that brings its own MCP server. Its key must
// equal mcp.name and its header and environment values may only be
// secrets. Running such servers is not built yet, so a valid one is still
// refused as not supported.
func (p *parser) attached(key string, v any, at string) {
	m, ok := v.(map[string]any)
	if !ok {
		p.fail(at+"/mcp", CodeValidationFailed, "must be an object")
		return
	}
	at += "/mcp"
	p.checkFields(m, at, "name", "type", "url", "headers", "command", "args", "env")
	if m["name"] != key {
		p.fail(at+"/name", CodeValidationFailed, "must equal the entry's key %q", key)
	}
	_, hasURL := m["url"]
	_, hasCmd := m["command"]
	if hasURL == hasCmd {
		p.fail(at, CodeValidationFailed, "needs exactly one of url and command")
	}
	for _, field := range []string{"headers", "env"} {
		vals, _ := m[field].(map[string]any)
		for _, k := range sortedKeys(vals) {
			s, ok := vals[k].(map[string]any)
			if _, isSecret := s["$secret"]; !ok || !isSecret || len(s) != 1 {
				p.fail(at+"/"+field+"/"+escape(k), CodeValidationFailed, "may only be a {\"$secret\": name}")
			}
		}
	}
	p.fail(at, CodeNotSupported, "servers attached by a document are not yet supported")
}
