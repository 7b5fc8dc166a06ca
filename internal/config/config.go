// Package config owns patchbay's settings: one typed Config built from the
// environment and the YAML config file, with Validate reporting every
// problem by its field path.
package config

import "time"

// Config is everything the server needs to start.
type Config struct {
	Addr         string        // PATCHBAY_ADDR, default 127.0.0.1:8080
	RedisURL     string        // REDIS_URL; empty means the embedded store
	RedisPrefix  string        // PATCHBAY_REDIS_PREFIX, default "pb:"
	ConfigPath   string        // PATCHBAY_CONFIG; empty means no connections
	SecretKey    string        // PATCHBAY_SECRET_KEY
	APIKeys      []APIKey      // PATCHBAY_API_KEYS, comma separated
	AdminToken   string        // PATCHBAY_ADMIN_TOKEN
	LogLevel     string        // PATCHBAY_LOG_LEVEL: debug|info|warn|error, default info
	LogFormat    string        // PATCHBAY_LOG_FORMAT: text|json, default text
	Workers      int           // PATCHBAY_WORKERS, default 4
	Retention    time.Duration // PATCHBAY_RETENTION, default 168h: how long finished executions are kept
	MaxBodyBytes int64         // PATCHBAY_MAX_BODY_BYTES, default 1 MiB
	File         File          // the parsed config file
}

// APIKey is one accepted API key. Keys are kept only as SHA-256 digests so a
// plain key given in the environment is not held in memory longer than load.
type APIKey struct {
	SHA256 [32]byte
}

// File is the YAML (or JSON) config file.
type File struct {
	Name        string                `yaml:"name"`
	Connections map[string]Connection `yaml:"connections"`
	Triggers    []map[string]any      `yaml:"triggers"`
}

// Connection is one entry under connections. Only mcp is supported so far;
// the other kinds are parsed so that they can be refused by name.
type Connection struct {
	MCP      *MCP           `yaml:"mcp"`
	Auth     any            `yaml:"auth"`
	Policy   map[string]any `yaml:"policy"`
	Pool     map[string]any `yaml:"pool"`
	Source   map[string]any `yaml:"source"`
	Webhooks map[string]any `yaml:"webhooks"`
	Cron     map[string]any `yaml:"cron"`
}

// MCP describes an MCP server reached over stdio (command) or Streamable
// HTTP (url).
type MCP struct {
	Name             string            `yaml:"name"`
	Type             string            `yaml:"type"` // stdio | http; inferred from command/url when empty
	Command          string            `yaml:"command"`
	Args             []string          `yaml:"args"`
	Env              map[string]string `yaml:"env"`
	Cwd              string            `yaml:"cwd"`
	URL              string            `yaml:"url"`
	Headers          map[string]string `yaml:"headers"`
	TimeoutMs        int               `yaml:"timeoutMs"`        // connect timeout, default 30000
	RequestTimeoutMs int               `yaml:"requestTimeoutMs"` // per call, default 60000
}

// Transport is the MCP transport the entry uses after inference.
func (m MCP) Transport() string {
	switch {
	case m.Type != "":
		return m.Type
	case m.URL != "":
		return "http"
	default:
		return "stdio"
	}
}
