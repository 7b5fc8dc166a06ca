package config

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// Pool limits.
const (
	// MaxPoolSize bounds pool.max: every slot may be a browser process.
	MaxPoolSize = 1024
	// MaxPoolWait bounds pool.waitMs.
	MaxPoolWait = time.Hour
	// DefaultPoolWait is how long a run waits for a lease when waitMs is
	// left out.
	DefaultPoolWait = time.Minute
)

// Pool makes an mcp connection a pool: every lease gets a fresh
// server of its own (a new process for stdio), provisioned with the
// lease's setup values, and closed when the lease ends or is reclaimed.
type Pool struct {
	// Max is the number of leases the pool hands out at once (1..1024).
	Max int `yaml:"max"`
	// WaitMs is how long a run waits for a free lease before it fails
	// with lease_timeout; 0 means DefaultPoolWait.
	WaitMs int `yaml:"waitMs"`
	// Setup describes the values a document may pass to the provider.
	Setup *PoolSetup `yaml:"setup"`
}

// PoolSetup is the setup contract of a pool. Setup values reach the server
// through ${setup.FIELD} in mcp.args, mcp.env (and mcp.url, mcp.headers for
// http servers); a value that is not a string is written as JSON.
type PoolSetup struct {
	// Schema is the JSON Schema (an object schema) setup values must
	// match. A property's default is used when a document leaves the
	// field out.
	Schema map[string]any `yaml:"schema"`
	// HostOnly names fields a document may never set (a command, a
	// path): their value is only the schema's default, from this file.
	HostOnly []string `yaml:"hostOnly"`
}

// Wait is the configured lease wait.
func (p *Pool) Wait() time.Duration {
	if p == nil || p.WaitMs <= 0 {
		return DefaultPoolWait
	}
	return time.Duration(p.WaitMs) * time.Millisecond
}

// Properties returns the setup schema's properties, by name.
func (s *PoolSetup) Properties() map[string]any {
	if s == nil {
		return nil
	}
	props, _ := s.Schema["properties"].(map[string]any)
	return props
}

func (p *Pool) validate(ps *problems, path string, c Connection) {
	if c.MCP == nil {
		ps.add(path, "a pool needs an mcp server (stdio or http) to provision")
	}
	if p.Max < 1 || p.Max > MaxPoolSize {
		ps.add(path+".max", "must be a whole number from 1 to %d", MaxPoolSize)
	}
	if p.WaitMs < 0 || time.Duration(p.WaitMs)*time.Millisecond > MaxPoolWait {
		ps.add(path+".waitMs", "must be from 0 to %d milliseconds", MaxPoolWait.Milliseconds())
	}
	s := p.Setup
	if s == nil {
		return
	}
	if t, ok := s.Schema["type"]; ok && t != "object" {
		ps.add(path+".setup.schema.type", "must be \"object\": setup values are an object of fields")
	}
	props := s.Properties()
	if _, ok := s.Schema["properties"]; ok && props == nil {
		ps.add(path+".setup.schema.properties", "must map field names to schemas")
	}
	for _, k := range slices.Sorted(maps.Keys(props)) {
		if _, ok := props[k].(map[string]any); !ok {
			ps.add(path+".setup.schema.properties."+k, "must be a schema (a mapping)")
		}
	}
	for i, f := range s.HostOnly {
		if _, ok := props[f]; !ok {
			ps.add(fmt.Sprintf("%s.setup.hostOnly[%d]", path, i), "%q is not a property of setup.schema", f)
		}
	}
}
