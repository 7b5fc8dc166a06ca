package config

import (
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	pathpkg "path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// Problem is one thing wrong with the configuration. Path names where: an
// environment variable (PATCHBAY_WORKERS) or a dotted path into the config
// file (connections.demo.mcp.url, connections.demo.mcp.args[0]).
type Problem struct {
	Path    string
	Message string
}

func (p Problem) String() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// ValidationError holds every problem found, so a user can fix them all in
// one go instead of one per restart.
type ValidationError struct {
	Problems []Problem
}

// Error lists the problems one per line.
func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// problems collects Problems; the zero value is ready to use.
type problems []Problem

func (ps *problems) add(path, format string, args ...any) {
	*ps = append(*ps, Problem{Path: path, Message: fmt.Sprintf(format, args...)})
}

// err returns nil when there is nothing to report, so callers can return it
// directly without the typed-nil-in-interface trap.
func (ps problems) err() error {
	if len(ps) == 0 {
		return nil
	}
	out := slices.Clone([]Problem(ps))
	slices.SortStableFunc(out, func(a, b Problem) int { return strings.Compare(a.Path, b.Path) })
	return &ValidationError{Problems: out}
}

// nameRE is the connection-name rule; internal/harness's registry calls
// ValidName, so a name the config accepts is one the registry accepts.
var nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)

// ValidName reports whether s may name a connection: a letter, then letters,
// digits, '_' or '-', at most 64 characters in all.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// Limits of the numeric settings, exported so help text and tests can quote
// them.
const (
	MinWorkers      = 1
	MaxWorkers      = 256
	MinRetention    = time.Minute
	MinMaxBodyBytes = 1 << 10
	MaxMaxBodyBytes = 64 << 20
	// MinMaxResponseBytes is the smallest maxResponseBytes of an MCP entry.
	MinMaxResponseBytes = 1 << 10
)

// Kinds of connection entry.
const (
	KindMCP     = "mcp"
	KindOpenAPI = "openapi"
	KindSource  = "source"
	KindCron    = "cron"
)

// Validate checks every setting, including those that depend on each other,
// and returns nil or a *ValidationError listing every problem.
func (c *Config) Validate() error {
	var ps problems
	c.validateEnv(&ps)
	c.File.validate(&ps)
	c.validateMCP(&ps)
	return ps.err()
}

func (c *Config) validateEnv(ps *problems) {
	if err := checkHostPort(c.Addr); err != nil {
		ps.add("PATCHBAY_ADDR", "%v", err)
	}
	if c.PprofAddr != "" {
		if err := checkLoopback(c.PprofAddr); err != nil {
			ps.add("PATCHBAY_PPROF_ADDR", "%v", err)
		}
	}
	if c.PublicURL != "" {
		if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			ps.add("PATCHBAY_PUBLIC_URL", "must be an http or https URL such as https://patchbay.example.com, without credentials, query or fragment")
		}
	}
	if c.TraceURL != "" {
		if u, err := url.Parse(strings.ReplaceAll(c.TraceURL, "{traceId}", "0")); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.Contains(c.TraceURL, "{traceId}") {
			ps.add("PATCHBAY_TRACE_URL", "must be an http or https URL with {traceId} where the trace id goes, such as https://jaeger.example.com/trace/{traceId}")
		}
	}
	if c.RedisPrefix == "" {
		ps.add("PATCHBAY_REDIS_PREFIX", "must not be empty")
	} else if strings.ContainsAny(c.RedisPrefix, "{}*?[]\\ \t\r\n") {
		// Braces would turn the prefix into every key's hash tag (one
		// cluster slot for everything); glob characters break the SCANs
		// that clean a prefix up.
		ps.add("PATCHBAY_REDIS_PREFIX", "must not contain braces, glob characters (*?[]\\) or whitespace")
	}
	if !slices.Contains(LogLevels, c.LogLevel) {
		ps.add("PATCHBAY_LOG_LEVEL", "must be one of %s, not %q", strings.Join(LogLevels, ", "), c.LogLevel)
	}
	if !slices.Contains(LogFormats, c.LogFormat) {
		ps.add("PATCHBAY_LOG_FORMAT", "must be one of %s, not %q", strings.Join(LogFormats, ", "), c.LogFormat)
	}
	if c.Workers < MinWorkers || c.Workers > MaxWorkers {
		ps.add("PATCHBAY_WORKERS", "must be between %d and %d, not %d", MinWorkers, MaxWorkers, c.Workers)
	}
	if c.PoolReclaimAfter < 100*time.Millisecond || c.PoolReclaimAfter > 24*time.Hour {
		ps.add("PATCHBAY_POOL_RECLAIM_AFTER", "must be from 100ms to 24h, not %s", c.PoolReclaimAfter)
	}
	if c.ClaimTimeout < time.Second || c.ClaimTimeout > time.Hour {
		ps.add("PATCHBAY_CLAIM_TIMEOUT", "must be from 1s to 1h, not %s", c.ClaimTimeout)
	}
	if c.Retention < MinRetention {
		ps.add("PATCHBAY_RETENTION", "must be at least %s, not %s", MinRetention, c.Retention)
	}
	if c.MaxBodyBytes < MinMaxBodyBytes || c.MaxBodyBytes > MaxMaxBodyBytes {
		ps.add("PATCHBAY_MAX_BODY_BYTES", "must be between %d (1 KiB) and %d (64 MiB), not %d", MinMaxBodyBytes, MaxMaxBodyBytes, c.MaxBodyBytes)
	}
	if c.ShutdownGrace < 100*time.Millisecond || c.ShutdownGrace > 10*time.Minute {
		ps.add("PATCHBAY_SHUTDOWN_GRACE", "must be from 100ms to 10m, not %s", c.ShutdownGrace)
	}
	if c.SchemaMaxNodes < 0 || c.SchemaMaxNodes > 10_000_000 {
		ps.add("PATCHBAY_SCHEMA_MAX_NODES", "must be from 1 to 10000000 (0 or unset: 20000), not %d", c.SchemaMaxNodes)
	}
	if c.SchemaCompileTimeout < 0 || c.SchemaCompileTimeout > time.Hour {
		ps.add("PATCHBAY_SCHEMA_COMPILE_TIMEOUT", "must be at most 1h (0 or unset: 10s), not %s", c.SchemaCompileTimeout)
	}
	c.Limits.validate(ps)
}

// Ranges of the request limits. The lower bounds of the timeouts are low
// so that tests can use short ones; zero is refused because it would mean
// no limit at all.
const (
	MinMaxHeaderBytes = 4 << 10
	MaxMaxHeaderBytes = 1 << 20
	MaxMaxConns       = 1 << 20
	MaxAuthFailures   = 1000
)

func (l Limits) validate(ps *problems) {
	for _, t := range []struct {
		name string
		d    time.Duration
	}{
		{"PATCHBAY_READ_HEADER_TIMEOUT", l.ReadHeaderTimeout},
		{"PATCHBAY_READ_TIMEOUT", l.ReadTimeout},
		{"PATCHBAY_WRITE_TIMEOUT", l.WriteTimeout},
		{"PATCHBAY_IDLE_TIMEOUT", l.IdleTimeout},
		{"PATCHBAY_AUTH_BACKOFF", l.AuthBackoff},
		{"PATCHBAY_AUTH_BACKOFF_MAX", l.AuthBackoffMax},
	} {
		if t.d < 10*time.Millisecond || t.d > 24*time.Hour {
			ps.add(t.name, "must be from 10ms to 24h, not %s", t.d)
		}
	}
	if l.ReadHeaderTimeout > l.ReadTimeout && l.ReadTimeout > 0 {
		ps.add("PATCHBAY_READ_HEADER_TIMEOUT", "must not be longer than PATCHBAY_READ_TIMEOUT (%s), which bounds the headers too", l.ReadTimeout)
	}
	if l.AuthBackoffMax < l.AuthBackoff && l.AuthBackoff > 0 {
		ps.add("PATCHBAY_AUTH_BACKOFF_MAX", "must not be shorter than PATCHBAY_AUTH_BACKOFF (%s)", l.AuthBackoff)
	}
	if l.MaxHeaderBytes < MinMaxHeaderBytes || l.MaxHeaderBytes > MaxMaxHeaderBytes {
		ps.add("PATCHBAY_MAX_HEADER_BYTES", "must be between %d (4 KiB) and %d (1 MiB), not %d", MinMaxHeaderBytes, MaxMaxHeaderBytes, l.MaxHeaderBytes)
	}
	if l.MaxConns < 1 || l.MaxConns > MaxMaxConns {
		ps.add("PATCHBAY_MAX_CONNS", "must be between 1 and %d, not %d", MaxMaxConns, l.MaxConns)
	}
	if l.MaxConnsPerAddress < 1 || l.MaxConnsPerAddress > l.MaxConns && l.MaxConns >= 1 {
		ps.add("PATCHBAY_MAX_CONNS_PER_ADDRESS", "must be between 1 and PATCHBAY_MAX_CONNS (%d), not %d", l.MaxConns, l.MaxConnsPerAddress)
	}
	if l.AuthFailures < 1 || l.AuthFailures > MaxAuthFailures {
		ps.add("PATCHBAY_AUTH_FAILURES", "must be between 1 and %d, not %d", MaxAuthFailures, l.AuthFailures)
	}
	if l.MaxStreams < 1 || l.MaxStreams > MaxMaxConns {
		ps.add("PATCHBAY_MAX_STREAMS", "must be between 1 and %d, not %d", MaxMaxConns, l.MaxStreams)
	}
	if l.MaxStreamsPerPrincipal < 1 || l.MaxStreamsPerPrincipal > l.MaxStreams && l.MaxStreams >= 1 {
		ps.add("PATCHBAY_MAX_STREAMS_PER_PRINCIPAL", "must be between 1 and PATCHBAY_MAX_STREAMS (%d), not %d", l.MaxStreams, l.MaxStreamsPerPrincipal)
	}
	if l.QuestionHold < time.Second || l.QuestionHold > 24*time.Hour {
		ps.add("PATCHBAY_QUESTION_HOLD", "must be from 1s to 24h, not %s", l.QuestionHold)
	}
	if l.MCPHold < 0 || l.MCPHold > 10*time.Minute {
		ps.add("PATCHBAY_MCP_HOLD", "must be from 0s to 10m, not %s", l.MCPHold)
	}
	if l.MCPSessionsPerPrincipal < 1 || l.MCPSessionsPerPrincipal > MaxMaxConns {
		ps.add("PATCHBAY_MCP_SESSIONS_PER_PRINCIPAL", "must be between 1 and %d, not %d", MaxMaxConns, l.MCPSessionsPerPrincipal)
	}
	if l.MCPCallsPerPrincipal < 1 || l.MCPCallsPerPrincipal > MaxMaxConns {
		ps.add("PATCHBAY_MCP_CALLS_PER_PRINCIPAL", "must be between 1 and %d, not %d", MaxMaxConns, l.MCPCallsPerPrincipal)
	}
	if l.MCPSessionIdle < time.Minute || l.MCPSessionIdle > 7*24*time.Hour {
		ps.add("PATCHBAY_MCP_SESSION_IDLE", "must be from 1m to 168h, not %s", l.MCPSessionIdle)
	}
}

// checkLoopback accepts host:port whose host is a loopback address or
// localhost: the profiler is an admin tool with no authentication.
func checkLoopback(addr string) error {
	if err := checkHostPort(addr); err != nil {
		return err
	}
	host, _, _ := net.SplitHostPort(addr)
	if ip, err := netip.ParseAddr(host); (err == nil && ip.IsLoopback()) || host == "localhost" {
		return nil
	}
	return fmt.Errorf("must be a loopback address such as 127.0.0.1:6060 (the profiler has no authentication), not %q", addr)
}

// checkHostPort accepts host:port with an empty host (all interfaces) and a
// numeric port; port 0 asks the system for a free one, which tests use.
func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("must be host:port (such as 127.0.0.1:8080), not %q", addr)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port must be a number from 0 to 65535, not %q", port)
	}
	return nil
}

func (f *File) validate(ps *problems) {
	for _, name := range slices.Sorted(maps.Keys(f.Connections)) {
		f.Connections[name].validate(ps, name)
	}
	f.validateAPIKeys(ps)
	f.validateTriggers(ps)
	f.Inbox.validate(ps)
	f.validateModels(ps)
	f.validateAgents(ps)
}

func (c Connection) validate(ps *problems, name string) {
	path := "connections." + name
	if !ValidName(name) {
		ps.add(path, "name must be a letter followed by letters, digits, '_' or '-', at most 64 characters")
	}
	kinds := c.Kinds()
	switch len(kinds) {
	case 0:
		ps.add(path, "must have exactly one kind: mcp, openapi, drive, source or cron")
	case 1:
	default:
		ps.add(path, "must have exactly one kind, has %s", strings.Join(kinds, " and "))
	}
	if c.MCP != nil {
		c.MCP.validate(ps, path+".mcp", name)
	}
	if c.OpenAPI != nil {
		c.OpenAPI.validate(ps, path+".openapi")
	}
	switch {
	case c.Drive != nil:
		c.Drive.validate(ps, path+".drive")
		c.validateDriveAuth(ps, path+".auth")
	case c.Auth != nil:
		c.validateAuth(ps, path+".auth")
		if c.Auth.ServiceAccount != nil {
			ps.add(path+".auth.serviceAccount", "is only supported on a drive connection")
		}
	}
	if c.Pool != nil {
		c.Pool.validate(ps, path+".pool", c)
	}
	if c.Binding != "" && c.MCP == nil {
		ps.add(path+".binding", "maps an mcp server onto a profile; this entry has none")
	}
	c.validateEvents(ps, path)
	if c.Policy != nil {
		c.Policy.validate(ps, path+".policy")
	}
	switch c.Determinism {
	case "", "replayable", "costly", "unsafe":
	default:
		ps.add(path+".determinism", "must be replayable, costly or unsafe")
	}
}

// validateAuth checks auth: OAuth only, on an http or sse MCP server or an
// openapi entry, and never beside a configured Authorization header (two
// credentials for one server, and the static one would go wherever the
// OAuth one must not).
func (c Connection) validateAuth(ps *problems, path string) {
	a := c.Auth
	if a.word != "" && a.word != "oauth" {
		ps.add(path, "must be oauth or a mapping with oauth or githubApp (such as {oauth: {clientId: …}, perUser: true}), not %q", a.word)
		return
	}
	if a.GitHubApp != nil {
		c.validateGitHubApp(ps, path)
		return
	}
	if a.OAuth == nil {
		ps.add(path, "needs oauth or githubApp")
		return
	}
	switch {
	case c.OpenAPI != nil:
		c.OpenAPI.validateAuth(ps, path)
	case c.MCP == nil:
		ps.add(path, "is only supported on an mcp connection of type http or sse, or an openapi connection")
	case c.MCP.Transport() == "stdio":
		ps.add(path, "is not allowed for a stdio server: OAuth signs in to remote (http or sse) servers")
	default:
		noAuthorizationHeader(ps, path, "mcp", c.MCP.Headers)
	}
	o := a.OAuth
	if o.ClientSecret != "" && o.ClientID == "" {
		ps.add(path+".oauth.clientSecret", "needs clientId")
	}
	o.validateScopesAndIssuer(ps, path+".oauth")
}

// validateAuth checks what OAuth needs of an openapi entry: the API the
// token is for must be known before its document is read (sign-in
// discovery starts there), so a document read from a file needs baseUrl.
func (o *OpenAPI) validateAuth(ps *problems, path string) {
	noAuthorizationHeader(ps, path, "openapi", o.Headers)
	if o.BaseURL == "" && !strings.HasPrefix(o.URL, "http://") && !strings.HasPrefix(o.URL, "https://") {
		ps.add(path, "on an openapi connection whose document is a file needs openapi.baseUrl: the API the token is for")
	}
}

func noAuthorizationHeader(ps *problems, path, kind string, headers map[string]string) {
	for h := range headers {
		if strings.EqualFold(h, "Authorization") {
			ps.add(path, "cannot be combined with an Authorization header (%s.headers.%s): keep one of the two", kind, h)
		}
	}
}

func (p *Policy) validate(ps *problems, path string) {
	for field, globs := range map[string][]string{"approve": p.Approve, "deny": p.Deny, "allow": p.Allow} {
		for i, g := range globs {
			if _, err := pathpkg.Match(g, ""); err != nil || g == "" {
				ps.add(fmt.Sprintf("%s.%s[%d]", path, field, i), "%q is not a valid glob", g)
			}
		}
	}
	for i, a := range p.Approvers {
		if !authz.ValidApprover(a) {
			ps.add(fmt.Sprintf("%s.approvers[%d]", path, i), "%q must be a key's name or \"role:<role>\"", a)
		}
	}
	for i, a := range p.Answerers {
		if !authz.ValidApprover(a) {
			ps.add(fmt.Sprintf("%s.answerers[%d]", path, i), "%q must be a key's name or \"role:<role>\"", a)
		}
	}
	for i, m := range p.DeclineQuestions {
		if m != "form" && m != "url" {
			ps.add(fmt.Sprintf("%s.declineQuestions[%d]", path, i), "must be form or url, not %q", m)
		}
	}
}

func (f *File) validateAPIKeys(ps *problems) {
	// A key's name is its principal: two keys with one name, or a key
	// with the name of one of patchbay's own principals, would own and
	// read each other's work.
	first := map[string]int{}
	for i, k := range f.APIKeys {
		path := fmt.Sprintf("apiKeys[%d]", i)
		if k.Name == "" {
			ps.add(path+".name", "is required")
		} else if j, ok := first[k.Name]; ok {
			ps.add(path+".name", "%q is also the name of apiKeys[%d]; each key needs a name of its own", k.Name, j)
		} else {
			first[k.Name] = i
			checkKeyName(ps, path+".name", k.Name)
		}
		if (k.Key == "") == (k.SHA256 == "") {
			ps.add(path, "needs exactly one of key and sha256")
		}
		if k.SHA256 != "" {
			if b, err := hex.DecodeString(k.SHA256); err != nil || len(b) != 32 {
				ps.add(path+".sha256", "must be 64 hex digits")
			}
		}
		if k.Allowlist == "" {
			ps.add(path+".allowlist", "is required: the allowlist that bounds this key")
		}
		for j, r := range k.Roles {
			if !authz.ValidRole(r) {
				ps.add(fmt.Sprintf("%s.roles[%d]", path, j), "%q is not a role name (run, read, approve, admin, or your own: lowercase letters, digits, '_', '-')", r)
			}
		}
		for j, g := range k.Approve {
			if _, err := pathpkg.Match(g, ""); err != nil || g == "" {
				ps.add(fmt.Sprintf("%s.approve[%d]", path, j), "%q is not a valid glob over \"<connection>.<operation>\"", g)
			}
		}
		for j, src := range k.Push {
			if c, ok := f.Connections[src]; !ok || c.Source == nil {
				ps.add(fmt.Sprintf("%s.push[%d]", path, j), "%q is not a source connection of this file", src)
			}
		}
	}
}

// checkKeyName refuses a name patchbay keeps for a principal of its own,
// naming the key of PATCHBAY_API_KEYS that an env-<n> name stands for.
func checkKeyName(ps *problems, path, name string) {
	why := authz.Reserved(name)
	if why == "" {
		return
	}
	if n, err := strconv.Atoi(strings.TrimPrefix(name, "env-")); err == nil && n > 0 && authz.EnvKeyName(n-1) == name {
		ps.add(path, "%q is reserved: it is the name of PATCHBAY_API_KEYS[%d] (keys given there are named env-<n>)", name, n-1)
		return
	}
	ps.add(path, "%q is reserved: %s", name, why)
}

// Kinds lists the kinds the entry declares (mcp, openapi, drive, source, cron),
// in that order. A valid entry has exactly one.
func (c Connection) Kinds() []string {
	var kinds []string
	if c.MCP != nil {
		kinds = append(kinds, KindMCP)
	}
	if c.OpenAPI != nil {
		kinds = append(kinds, KindOpenAPI)
	}
	if c.Drive != nil {
		kinds = append(kinds, KindDrive)
	}
	if c.Source != nil {
		kinds = append(kinds, KindSource)
	}
	if c.Cron != nil {
		kinds = append(kinds, KindCron)
	}
	return kinds
}

// Kind is the entry's single kind, or "" when it has none or several.
func (c Connection) Kind() string {
	if k := c.Kinds(); len(k) == 1 {
		return k[0]
	}
	return ""
}

func (m *MCP) validate(ps *problems, path, key string) {
	if m.Name != "" && m.Name != key {
		ps.add(path+".name", "must equal the connection's key %q (or be left out), not %q", key, m.Name)
	}
	if m.TimeoutMs < 0 {
		ps.add(path+".timeoutMs", "must not be negative")
	}
	for i, sub := range m.Subscribe {
		if !ValidEventType(sub.Event) {
			ps.add(fmt.Sprintf("%s.subscribe[%d].event", path, i), "must be an event type")
		}
	}
	if m.RequestTimeoutMs < 0 {
		ps.add(path+".requestTimeoutMs", "must not be negative")
	}
	if m.MaxResponseBytes < 0 {
		ps.add(path+".maxResponseBytes", "must not be negative")
	} else if m.MaxResponseBytes > 0 && m.MaxResponseBytes < MinMaxResponseBytes {
		ps.add(path+".maxResponseBytes", "must be at least %d (1 KiB), not %d", MinMaxResponseBytes, m.MaxResponseBytes)
	}
	// Values below may have come from ${env:…}, so messages never quote
	// them: a token in a URL or header must not reach a log.
	switch m.Type {
	case "", "stdio", "http", "sse":
	default:
		ps.add(path+".type", "must be stdio, http or sse (or left out), not %q", m.Type)
		return
	}
	if m.Type == "" && m.Command != "" && m.URL != "" {
		ps.add(path, "has both command (stdio) and url (http); keep one, or set type")
		return
	}
	switch m.Transport() {
	case "stdio":
		if strings.TrimSpace(m.Command) == "" {
			ps.add(path+".command", "is required for a stdio server")
		}
		if m.URL != "" {
			ps.add(path+".url", "is not allowed for a stdio server")
		}
		if len(m.Headers) > 0 {
			ps.add(path+".headers", "are not allowed for a stdio server")
		}
		for _, k := range slices.Sorted(maps.Keys(m.Env)) {
			if k == "" || strings.ContainsAny(k, "=\x00") {
				ps.add(path+".env."+k, "is not a valid environment variable name")
			}
		}
	case "http", "sse":
		if m.URL == "" {
			ps.add(path+".url", "is required for an http server")
		} else if u, err := url.Parse(m.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			ps.add(path+".url", "must be an absolute http:// or https:// URL")
		}
		if m.Command != "" {
			ps.add(path+".command", "is not allowed for an http server")
		}
		if len(m.Args) > 0 {
			ps.add(path+".args", "are not allowed for an http server")
		}
		if len(m.Env) > 0 {
			ps.add(path+".env", "is not allowed for an http server")
		}
		if m.Cwd != "" {
			ps.add(path+".cwd", "is not allowed for an http server")
		}
		validateHeaders(ps, path+".headers", m.Headers)
	}
}

func validateHeaders(ps *problems, path string, headers map[string]string) {
	seen := map[string]string{}
	for _, h := range slices.Sorted(maps.Keys(headers)) {
		hp := path + "." + h
		if !validHeaderName(h) {
			ps.add(hp, "is not a valid HTTP header name")
			continue
		}
		if first, dup := seen[strings.ToLower(h)]; dup {
			ps.add(hp, "repeats header %q (header names are case-insensitive)", first)
			continue
		}
		seen[strings.ToLower(h)] = h
		if strings.ContainsAny(headers[h], "\r\n\x00") {
			ps.add(hp, "value must not contain line breaks or NUL")
		}
	}
}

// validate checks an openapi entry. As for mcp, messages never quote the
// URLs or header values: they may hold tokens from ${env:…}.
func (o *OpenAPI) validate(ps *problems, path string) {
	switch {
	case strings.TrimSpace(o.URL) == "":
		ps.add(path+".url", "is required: the OpenAPI document's http(s) URL or file path")
	case strings.Contains(o.URL, "://"):
		if u, err := url.Parse(o.URL); err != nil || !(u.Scheme == "file" || (u.Scheme == "http" || u.Scheme == "https") && u.Host != "") {
			ps.add(path+".url", "must be an absolute http:// or https:// URL, a file:// URL or a file path")
		}
	}
	if o.BaseURL != "" {
		if u, err := url.Parse(o.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			ps.add(path+".baseUrl", "must be an absolute http:// or https:// URL")
		}
	}
	validateHeaders(ps, path+".headers", o.Headers)
	validateInclude(ps, path+".include", o.Include)
	if o.TimeoutMs < 0 {
		ps.add(path+".timeoutMs", "must not be negative")
	}
	if o.RequestTimeoutMs < 0 {
		ps.add(path+".requestTimeoutMs", "must not be negative")
	}
	if o.MaxResponseBytes < 0 {
		ps.add(path+".maxResponseBytes", "must not be negative")
	} else if o.MaxResponseBytes > 0 && o.MaxResponseBytes < MinMaxResponseBytes {
		ps.add(path+".maxResponseBytes", "must be at least %d (1 KiB), not %d", MinMaxResponseBytes, o.MaxResponseBytes)
	}
	for _, b := range []struct {
		field string
		v     int64
	}{{"maxSchemaNodes", o.MaxSchemaNodes}, {"maxSchemaBytes", o.MaxSchemaBytes},
		{"maxManifestBytes", o.MaxManifestBytes}, {"maxOperations", int64(o.MaxOperations)}} {
		if b.v < 0 {
			ps.add(path+"."+b.field, "must not be negative (0 means the default)")
		}
	}
	validateRedirects(ps, path+".followRedirects", o.FollowRedirects)
}

// validateRedirects checks a followRedirects value.
func validateRedirects(ps *problems, path, v string) {
	if _, err := credhttp.ParseRedirects(v); err != nil {
		ps.add(path, "must be none, same-origin (the default) or any, not %q", v)
	}
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune("!#$%&'*+-.^_`|~", r):
		default:
			return false
		}
	}
	return true
}
