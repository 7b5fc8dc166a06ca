package config

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/netip"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/patchbay-dev/patchbay/internal/authz"
)

// Defaults of the environment settings.
const (
	DefaultAddr        = "127.0.0.1:8080"
	DefaultRedisPrefix = "pb:"
	DefaultLogLevel    = "info"
	DefaultLogFormat   = "text"
	// WorkersPerCPU sizes PATCHBAY_WORKERS by default: a worker mostly
	// waits (on Redis, on the connection it calls), and on two cores 64
	// workers ran 50% more three-call executions per second than 16, with
	// little more past that (docs/performance.md).
	WorkersPerCPU    = 32
	DefaultRetention = 168 * time.Hour
	// DefaultClaimTimeout brings a crashed runner's executions back within
	// about 11 s (the claim lapses 6.7–10 s after the crash, a worker
	// looks within a second), inside the ~15 s a caller waiting on an
	// execution should tolerate; renewals every 3.3 s cost one small
	// script per running execution. Much shorter and a replica stalled
	// by a GC pause or a Redis failover loses its runs to a takeover
	// (safe: fenced and resumed from the ledger, but wasted work and
	// re-sent calls).
	DefaultClaimTimeout = 10 * time.Second
	// DefaultPoolReclaimAfter is the pool lease reclaim window.
	DefaultPoolReclaimAfter = 2 * time.Minute
	DefaultMaxBodyBytes     = 1 << 20
	// DefaultShutdownGrace is how long a SIGTERM drains.
	DefaultShutdownGrace = 30 * time.Second

	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = time.Minute
	DefaultWriteTimeout      = time.Minute
	DefaultIdleTimeout       = 2 * time.Minute
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxConns          = 1024
	DefaultMaxConnsPerAddr   = 256
	DefaultAuthFailures      = 5
	DefaultAuthBackoff       = time.Second
	DefaultAuthBackoffMax    = 5 * time.Minute
	// The stream caps: see package eventstream for why these values.
	DefaultMaxStreams             = 512
	DefaultMaxStreamsPerPrincipal = 32
	// The /mcp bounds: a client is held about as long as an HTTP client
	// is commonly patient; a person's approval usually takes longer, and
	// the retry with the same call id (or a task) picks it up.
	DefaultMCPHold                 = 30 * time.Second
	DefaultQuestionHold            = 5 * time.Minute
	DefaultMCPSessionsPerPrincipal = 64
	DefaultMCPCallsPerPrincipal    = 16
	DefaultMCPSessionIdle          = 30 * time.Minute
)

// DefaultWorkers is PATCHBAY_WORKERS when unset: WorkersPerCPU for each
// CPU Go may use (GOMAXPROCS), at most MaxWorkers.
func DefaultWorkers() int {
	return min(WorkersPerCPU*runtime.GOMAXPROCS(0), MaxWorkers)
}

// LogLevels and LogFormats are the accepted values of PATCHBAY_LOG_LEVEL and
// PATCHBAY_LOG_FORMAT.
var (
	LogLevels  = []string{"debug", "info", "warn", "error"}
	LogFormats = []string{"text", "json"}
)

// Default returns a Config holding every default and no connections: what
// Load returns for an empty environment. Tests start from it.
func Default() *Config {
	return &Config{
		Addr:             DefaultAddr,
		RedisPrefix:      DefaultRedisPrefix,
		LogLevel:         DefaultLogLevel,
		LogFormat:        DefaultLogFormat,
		Workers:          DefaultWorkers(),
		Retention:        DefaultRetention,
		ClaimTimeout:     DefaultClaimTimeout,
		PoolReclaimAfter: DefaultPoolReclaimAfter,
		MaxBodyBytes:     DefaultMaxBodyBytes,
		ShutdownGrace:    DefaultShutdownGrace,
		StartTriggers:    true,
		Limits: Limits{
			ReadHeaderTimeout:  DefaultReadHeaderTimeout,
			ReadTimeout:        DefaultReadTimeout,
			WriteTimeout:       DefaultWriteTimeout,
			IdleTimeout:        DefaultIdleTimeout,
			MaxHeaderBytes:     DefaultMaxHeaderBytes,
			MaxConns:           DefaultMaxConns,
			MaxConnsPerAddress: DefaultMaxConnsPerAddr,
			AuthFailures:       DefaultAuthFailures,
			AuthBackoff:        DefaultAuthBackoff,
			AuthBackoffMax:     DefaultAuthBackoffMax,

			MaxStreams:             DefaultMaxStreams,
			MaxStreamsPerPrincipal: DefaultMaxStreamsPerPrincipal,

			MCPHold:                 DefaultMCPHold,
			QuestionHold:            DefaultQuestionHold,
			MCPSessionsPerPrincipal: DefaultMCPSessionsPerPrincipal,
			MCPCallsPerPrincipal:    DefaultMCPCallsPerPrincipal,
			MCPSessionIdle:          DefaultMCPSessionIdle,
		},
	}
}

// Load builds the Config from the environment and, when PATCHBAY_CONFIG
// names one, the config file, then validates it. getenv and readFile are
// os.Getenv and os.ReadFile in production and fakes in tests.
//
// An empty variable counts as unset (getenv cannot tell them apart), both
// for the settings and for ${env:NAME} in the file. On failure the error is
// a *ValidationError with every problem found: in the environment, in the
// file's syntax and field names, in ${…} references, and from Validate.
func Load(getenv func(string) string, readFile func(string) ([]byte, error)) (*Config, error) {
	c := Default()
	var ps problems
	c.loadEnv(getenv, &ps)
	if c.ConfigPath != "" {
		c.loadFile(getenv, readFile, &ps)
	}
	if dir := c.File.ProfilesDir; c.ProfilesDir == "" && dir != "" {
		// A directory named in the file is found beside it.
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(filepath.Dir(c.ConfigPath), dir)
		}
		c.ProfilesDir = dir
	}

	// A field that could not be read or substituted keeps its raw value;
	// Validate would only repeat the complaint, so keep the first one.
	reported := map[string]bool{}
	for _, p := range ps {
		reported[p.Path] = true
	}
	var ve *ValidationError
	if errors.As(c.Validate(), &ve) {
		for _, p := range ve.Problems {
			if !reported[p.Path] {
				ps = append(ps, p)
			}
		}
	}
	if err := ps.err(); err != nil {
		return nil, err
	}
	c.APIKeys = append(c.APIKeys, c.File.fileAPIKeys()...)
	if err := uniqueKeys(c.APIKeys); err != nil {
		return nil, err
	}
	return c, nil
}

// uniqueKeys refuses a key configured twice (in PATCHBAY_API_KEYS and the
// file, say): which name and roles it carried would depend on the order.
func uniqueKeys(keys []APIKey) error {
	var ps problems
	seen := map[[32]byte]string{}
	for _, k := range keys {
		if first, ok := seen[k.SHA256]; ok {
			ps.add("apiKeys", "keys %q and %q are the same key; give each key once", first, k.Name)
			continue
		}
		seen[k.SHA256] = k.Name
	}
	return ps.err()
}

func (c *Config) loadEnv(getenv func(string) string, ps *problems) {
	str := func(name string, dst *string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	str("PATCHBAY_ADDR", &c.Addr)
	str("REDIS_URL", &c.RedisURL)
	str("PATCHBAY_REDIS_PREFIX", &c.RedisPrefix)
	str("PATCHBAY_CONFIG", &c.ConfigPath)
	str("PATCHBAY_SECRET_KEY", &c.SecretKey)
	str("PATCHBAY_SECRETS_DIR", &c.SecretsDir)
	str("PATCHBAY_ADMIN_TOKEN", &c.AdminToken)
	str("PATCHBAY_PUBLIC_URL", &c.PublicURL)
	str("PATCHBAY_PPROF_ADDR", &c.PprofAddr)
	str("PATCHBAY_TRACE_URL", &c.TraceURL)
	if v := strings.TrimSpace(getenv("PATCHBAY_START_TRIGGERS")); v != "" {
		if b, err := strconv.ParseBool(v); err != nil {
			ps.add("PATCHBAY_START_TRIGGERS", "must be true or false, not %q", v)
		} else {
			c.StartTriggers = b
		}
	}
	if v := strings.TrimSpace(getenv("PATCHBAY_LOG_LEVEL")); v != "" {
		c.LogLevel = strings.ToLower(v)
	}
	if v := strings.TrimSpace(getenv("PATCHBAY_LOG_FORMAT")); v != "" {
		c.LogFormat = strings.ToLower(v)
	}
	// On a parse failure the default stays, so Validate does not add a
	// second, confusing range problem for the same variable.
	if v := strings.TrimSpace(getenv("PATCHBAY_WORKERS")); v != "" {
		if n, err := strconv.Atoi(v); err != nil {
			ps.add("PATCHBAY_WORKERS", "must be a whole number, not %q", v)
		} else {
			c.Workers = n
		}
	}
	if v := strings.TrimSpace(getenv("PATCHBAY_CLAIM_TIMEOUT")); v != "" {
		if d, err := time.ParseDuration(v); err != nil {
			ps.add("PATCHBAY_CLAIM_TIMEOUT", "must be a Go duration such as 60s, not %q", v)
		} else {
			c.ClaimTimeout = d
		}
	}
	c.ProfilesDir = strings.TrimSpace(getenv("PATCHBAY_PROFILES_DIR"))
	if v := strings.TrimSpace(getenv("PATCHBAY_POOL_RECLAIM_AFTER")); v != "" {
		if d, err := time.ParseDuration(v); err != nil {
			ps.add("PATCHBAY_POOL_RECLAIM_AFTER", "must be a Go duration such as 2m, not %q", v)
		} else {
			c.PoolReclaimAfter = d
		}
	}
	if v := strings.TrimSpace(getenv("PATCHBAY_RETENTION")); v != "" {
		if d, err := time.ParseDuration(v); err != nil {
			ps.add("PATCHBAY_RETENTION", "must be a Go duration such as 168h or 30m, not %q", v)
		} else {
			c.Retention = d
		}
	}
	if v := strings.TrimSpace(getenv("PATCHBAY_MAX_BODY_BYTES")); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err != nil {
			ps.add("PATCHBAY_MAX_BODY_BYTES", "must be a whole number of bytes, not %q", v)
		} else {
			c.MaxBodyBytes = n
		}
	}
	if v := getenv("PATCHBAY_API_KEYS"); v != "" {
		c.APIKeys = parseAPIKeys(v, ps)
	}
	c.loadBoundsEnv(getenv, ps)
	c.Limits.loadEnv(getenv, ps)
}

// loadBoundsEnv reads the shutdown and gate-2 bounds.
func (c *Config) loadBoundsEnv(getenv func(string) string, ps *problems) {
	if v := strings.TrimSpace(getenv("PATCHBAY_SHUTDOWN_GRACE")); v != "" {
		if d, err := time.ParseDuration(v); err != nil {
			ps.add("PATCHBAY_SHUTDOWN_GRACE", "must be a Go duration such as 30s, not %q", v)
		} else {
			c.ShutdownGrace = d
		}
	}
	if v := strings.TrimSpace(getenv("PATCHBAY_SCHEMA_MAX_NODES")); v != "" {
		if n, err := strconv.Atoi(v); err != nil {
			ps.add("PATCHBAY_SCHEMA_MAX_NODES", "must be a whole number, not %q", v)
		} else {
			c.SchemaMaxNodes = n
		}
	}
	if v := strings.TrimSpace(getenv("PATCHBAY_SCHEMA_COMPILE_TIMEOUT")); v != "" {
		if d, err := time.ParseDuration(v); err != nil {
			ps.add("PATCHBAY_SCHEMA_COMPILE_TIMEOUT", "must be a Go duration such as 10s, not %q", v)
		} else {
			c.SchemaCompileTimeout = d
		}
	}
}

// loadEnv reads the request limits. As above, a value that does not parse
// leaves the default, so only one problem is reported for it.
func (l *Limits) loadEnv(getenv func(string) string, ps *problems) {
	dur := func(name string, dst *time.Duration) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			if d, err := time.ParseDuration(v); err != nil {
				ps.add(name, "must be a Go duration such as 30s, not %q", v)
			} else {
				*dst = d
			}
		}
	}
	num := func(name string, dst *int) {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			if n, err := strconv.Atoi(v); err != nil {
				ps.add(name, "must be a whole number, not %q", v)
			} else {
				*dst = n
			}
		}
	}
	dur("PATCHBAY_READ_HEADER_TIMEOUT", &l.ReadHeaderTimeout)
	dur("PATCHBAY_READ_TIMEOUT", &l.ReadTimeout)
	dur("PATCHBAY_WRITE_TIMEOUT", &l.WriteTimeout)
	dur("PATCHBAY_IDLE_TIMEOUT", &l.IdleTimeout)
	num("PATCHBAY_MAX_HEADER_BYTES", &l.MaxHeaderBytes)
	num("PATCHBAY_MAX_CONNS", &l.MaxConns)
	num("PATCHBAY_MAX_CONNS_PER_ADDRESS", &l.MaxConnsPerAddress)
	num("PATCHBAY_AUTH_FAILURES", &l.AuthFailures)
	dur("PATCHBAY_AUTH_BACKOFF", &l.AuthBackoff)
	dur("PATCHBAY_AUTH_BACKOFF_MAX", &l.AuthBackoffMax)
	num("PATCHBAY_MAX_STREAMS", &l.MaxStreams)
	num("PATCHBAY_MAX_STREAMS_PER_PRINCIPAL", &l.MaxStreamsPerPrincipal)
	dur("PATCHBAY_MCP_HOLD", &l.MCPHold)
	dur("PATCHBAY_QUESTION_HOLD", &l.QuestionHold)
	num("PATCHBAY_MCP_SESSIONS_PER_PRINCIPAL", &l.MCPSessionsPerPrincipal)
	num("PATCHBAY_MCP_CALLS_PER_PRINCIPAL", &l.MCPCallsPerPrincipal)
	dur("PATCHBAY_MCP_SESSION_IDLE", &l.MCPSessionIdle)
	if v := getenv("PATCHBAY_TRUSTED_PROXIES"); strings.TrimSpace(v) != "" {
		l.TrustedProxies = parseProxies(v, ps)
	}
}

// parseProxies reads comma-separated CIDRs; a bare address stands for
// itself alone.
func parseProxies(v string, ps *problems) []netip.Prefix {
	var out []netip.Prefix
	for i, raw := range strings.Split(v, ",") {
		s := strings.TrimSpace(raw)
		if s == "" {
			continue
		}
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		if a, err := netip.ParseAddr(s); err == nil {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		ps.add(fmt.Sprintf("PATCHBAY_TRUSTED_PROXIES[%d]", i), "must be a CIDR such as 10.0.0.0/8 or an IP address, not %q", s)
	}
	return out
}

// parseAPIKeys reads the comma-separated list. Empty entries (a trailing
// comma) are skipped; no message quotes a key.
func parseAPIKeys(v string, ps *problems) []APIKey {
	var keys []APIKey
	for i, raw := range strings.Split(v, ",") {
		k := strings.TrimSpace(raw)
		if k == "" {
			continue
		}
		field := fmt.Sprintf("PATCHBAY_API_KEYS[%d]", i)
		k, roles, ok := envKeyRoles(k, field, ps)
		if !ok {
			continue
		}
		var key APIKey
		if digest, hashed := strings.CutPrefix(k, "sha256:"); hashed {
			b, err := hex.DecodeString(digest)
			if err != nil || len(b) != sha256.Size {
				ps.add(field, "sha256: must be followed by 64 hex digits")
				continue
			}
			copy(key.SHA256[:], b)
		} else {
			key = HashAPIKey(k)
		}
		key.Name, key.Allowlist, key.Roles = authz.EnvKeyName(i), DefaultAllowlist, roles
		keys = append(keys, key)
	}
	return keys
}

// envKeyRoles splits "<key>@<role>+<role>" into the key and its roles; a
// key without "@" has none (so run). Push grants and approve globs need the
// config file: they name its connections.
func envKeyRoles(k, field string, ps *problems) (string, []authz.Role, bool) {
	i := strings.LastIndexByte(k, '@')
	if i < 0 {
		return k, nil, true
	}
	var roles []authz.Role
	for _, r := range strings.Split(k[i+1:], "+") {
		if !authz.ValidRole(r) {
			ps.add(field, "%q after '@' is not a role name (run, read, approve, admin, or your own: lowercase letters, digits, '_', '-')", r)
			return "", nil, false
		}
		roles = append(roles, authz.Role(r))
	}
	if k[:i] == "" {
		ps.add(field, "has roles but no key before '@'")
		return "", nil, false
	}
	return k[:i], roles, true
}

// DefaultAllowlist bounds the keys given in PATCHBAY_API_KEYS.
const DefaultAllowlist = "default"

// fileAPIKeys turns the file's keys into APIKeys; Validate has checked them.
func (f *File) fileAPIKeys() []APIKey {
	var keys []APIKey
	for _, k := range f.APIKeys {
		key := APIKey{Name: k.Name, Allowlist: k.Allowlist, Approve: k.Approve, Push: k.Push}
		for _, r := range k.Roles {
			key.Roles = append(key.Roles, authz.Role(r))
		}
		if k.Key != "" {
			key.SHA256 = sha256.Sum256([]byte(k.Key))
		} else if b, err := hex.DecodeString(k.SHA256); err == nil && len(b) == 32 {
			copy(key.SHA256[:], b)
		}
		keys = append(keys, key)
	}
	return keys
}

// HashAPIKey returns the stored form of a plain API key.
func HashAPIKey(plain string) APIKey {
	return APIKey{SHA256: sha256.Sum256([]byte(plain))}
}

// MatchAPIKey reports whether plain is one of the accepted API keys. It
// compares every digest in constant time, so timing tells nothing about
// which key, if any, came close.
func (c *Config) MatchAPIKey(plain string) bool {
	sum := sha256.Sum256([]byte(plain))
	ok := 0
	for _, k := range c.APIKeys {
		ok |= subtle.ConstantTimeCompare(sum[:], k.SHA256[:])
	}
	return ok == 1
}

// SlogLevel is LogLevel as a slog.Level (info for anything unknown, which
// Validate has already refused).
func (c *Config) SlogLevel() slog.Level {
	switch c.LogLevel {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}

// LogHandler returns the slog handler that LogFormat and LogLevel ask for,
// writing to w.
func (c *Config) LogHandler(w io.Writer) slog.Handler {
	opts := &slog.HandlerOptions{Level: c.SlogLevel()}
	if c.LogFormat == "json" {
		return slog.NewJSONHandler(w, opts)
	}
	return slog.NewTextHandler(w, opts)
}

// loadFile reads, parses and substitutes the config file into c.File.
// Problems in the file carry paths relative to the file (connections.…);
// problems with the file as a whole are reported at PATCHBAY_CONFIG.
func (c *Config) loadFile(getenv func(string) string, readFile func(string) ([]byte, error), ps *problems) {
	data, err := readFile(c.ConfigPath)
	if err != nil {
		ps.add("PATCHBAY_CONFIG", "cannot read the config file: %v", err)
		return
	}
	f, ok := parseFile(data, c.ConfigPath, ps)
	if !ok {
		return
	}
	f.substitute(getenv, ps)
	f.substituteModels(getenv, ps)
	f.substituteAgents(getenv, ps)
	f.substituteWebhookSecrets(getenv, ps)
	f.substituteMCP(getenv, ps)
	f.loadWorkflows(c.ConfigPath, readFile, ps)
	c.File = f
}

// parseFile decodes the YAML (or JSON) file with unknown fields refused.
// The file is also read as a node tree and checked against File's shape,
// which gives every unknown field, duplicate key and mistyped value its
// path; the decoder's own messages carry only a line number.
func parseFile(data []byte, name string, ps *problems) (File, bool) {
	var f File
	var doc yaml.Node
	nodes := yaml.NewDecoder(bytes.NewReader(data))
	if err := nodes.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return f, true // an empty file: no connections
		}
		ps.add("PATCHBAY_CONFIG", "cannot parse %s: %v", name, err)
		return f, false
	}
	var extra yaml.Node
	if err := nodes.Decode(&extra); !errors.Is(err, io.EOF) {
		ps.add("PATCHBAY_CONFIG", "%s must hold exactly one YAML document", name)
		return f, false
	}

	var shape problems
	ck := checker{ps: &shape, budget: maxCheckNodes}
	ck.walk(&doc, fileType, "")

	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(&f)
	var te *yaml.TypeError
	switch {
	case err == nil:
	case errors.As(err, &te):
		// The shape check saw the same things with paths; fall back to
		// the decoder's words only if it somehow saw nothing.
		if len(shape) == 0 {
			for _, msg := range te.Errors {
				ps.add("PATCHBAY_CONFIG", "%s: %s", name, msg)
			}
		}
	default:
		ps.add("PATCHBAY_CONFIG", "cannot parse %s: %v", name, err)
		return f, false
	}
	*ps = append(*ps, shape...)
	return f, true
}

// refRE finds ${kind:NAME} references in file strings.
var (
	refRE     = regexp.MustCompile(`\$\{([A-Za-z]+):([^}]*)\}`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// substitute replaces ${env:NAME} in the MCP and OpenAPI string fields and the OAuth
// client credentials that may hold them. It runs on the typed File, so each problem has its field's path.
// ${secret:NAME} is recognised only to be refused until the secret store
// exists: silently passing the literal text on would be worse.
func (f *File) substitute(getenv func(string) string, ps *problems) {
	for i := range f.APIKeys {
		f.APIKeys[i].Key = substituteString(f.APIKeys[i].Key, fmt.Sprintf("apiKeys[%d].key", i), getenv, ps)
	}
	for _, name := range slices.Sorted(maps.Keys(f.Connections)) {
		if a := f.Connections[name].Auth; a != nil && a.OAuth != nil {
			path := "connections." + name + ".auth.oauth"
			a.OAuth.ClientID = substituteString(a.OAuth.ClientID, path+".clientId", getenv, ps)
			a.OAuth.ClientSecret = substituteString(a.OAuth.ClientSecret, path+".clientSecret", getenv, ps)
		}
		if a := f.Connections[name].Auth; a != nil && a.GitHubApp != nil {
			a.GitHubApp.substitute("connections."+name+".auth.githubApp", getenv, ps)
		}
		if o := f.Connections[name].OpenAPI; o != nil {
			path := "connections." + name + ".openapi"
			o.URL = substituteString(o.URL, path+".url", getenv, ps)
			o.BaseURL = substituteString(o.BaseURL, path+".baseUrl", getenv, ps)
			for _, k := range slices.Sorted(maps.Keys(o.Headers)) {
				o.Headers[k] = substituteKeepingSecrets(o.Headers[k], path+".headers."+k, getenv, ps)
			}
		}
		m := f.Connections[name].MCP
		if m == nil {
			continue
		}
		path := "connections." + name + ".mcp"
		sub := func(p, s string) string { return substituteString(s, p, getenv, ps) }
		m.Command = sub(path+".command", m.Command)
		for i := range m.Args {
			m.Args[i] = sub(fmt.Sprintf("%s.args[%d]", path, i), m.Args[i])
		}
		for _, k := range slices.Sorted(maps.Keys(m.Env)) {
			m.Env[k] = sub(path+".env."+k, m.Env[k])
		}
		m.Cwd = sub(path+".cwd", m.Cwd)
		m.URL = sub(path+".url", m.URL)
		for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
			m.Headers[k] = sub(path+".headers."+k, m.Headers[k])
		}
	}
}

// substituteKeepingSecrets replaces ${env:NAME} as substituteString does
// but keeps every ${secret:NAME} with a valid name for the provider to
// resolve at each call, so a secret's value never sits in the config and a
// rotated one takes effect without a restart.
func substituteKeepingSecrets(s, path string, getenv func(string) string, ps *problems) string {
	if !strings.Contains(s, "${") {
		return s
	}
	return refRE.ReplaceAllStringFunc(s, func(ref string) string {
		if m := refRE.FindStringSubmatch(ref); m[1] == "secret" {
			if !secretNameRE.MatchString(m[2]) || m[2] == "." || m[2] == ".." {
				ps.add(path, "${secret:%s}: not a valid secret name (letters, digits, '.', '_', '-')", m[2])
			}
			return ref
		}
		return substituteString(ref, path, getenv, ps)
	})
}

// secretNameRE is the secret-name rule of internal/harness
// (ValidSecretName), which config cannot import.
var secretNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

func substituteString(s, path string, getenv func(string) string, ps *problems) string {
	if !strings.Contains(s, "${") {
		return s
	}
	return refRE.ReplaceAllStringFunc(s, func(ref string) string {
		m := refRE.FindStringSubmatch(ref)
		kind, name := m[1], m[2]
		switch kind {
		case "env":
			if !envNameRE.MatchString(name) {
				ps.add(path, "${env:%s}: not a valid environment variable name", name)
				return ref
			}
			v := getenv(name)
			if v == "" {
				ps.add(path, "${env:%s}: environment variable %s is not set", name, name)
				return ref
			}
			return v
		case "secret":
			ps.add(path, "${secret:%s}: secrets are not supported yet; use ${env:NAME}", name)
			return ref
		default:
			ps.add(path, "${%s:%s}: unknown reference kind %q; use ${env:NAME}", kind, name, kind)
			return ref
		}
	})
}
