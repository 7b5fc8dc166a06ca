// Package config owns patchbay's settings: one typed Config built from the
// environment and the YAML config file, with Validate reporting every
// problem by its field path.
package config

import (
	"net/netip"
	"time"

	"github.com/patchbay-dev/patchbay/internal/authz"

	"gopkg.in/yaml.v3"
)

// docs/configuration-reference.md is generated from this package's source
// (Config's field comments, File's yaml tags and comments); a test in
// ./refdoc fails while the committed file differs from it.
//
//go:generate go run ./refdoc -o ../../docs/configuration-reference.md

// Config is everything the server needs to start.
//
// Each environment setting's comment says "NAME, default VALUE", either
// as "Field (NAME, default VALUE) does …" or as a line comment "NAME,
// default VALUE: what it is": docs/configuration-reference.md is
// generated from these comments (make generate, see ./refdoc), which
// refuses a setting without them.
type Config struct {
	Addr string // PATCHBAY_ADDR, default 127.0.0.1:8080: the listen address (the -addr flag overrides it)
	// RedisURL (REDIS_URL, default the embedded store) is the Redis that
	// holds all state: redis://, rediss://, unix://, redis+cluster:// or
	// redis+sentinel:// (see package store). The embedded store keeps
	// nothing across a restart.
	RedisURL string
	// RedisPrefix (PATCHBAY_REDIS_PREFIX, default "pb:") starts every key,
	// so that several deployments or test runs can share one Redis.
	RedisPrefix string
	// ConfigPath (PATCHBAY_CONFIG, default none) is the YAML (or JSON)
	// config file; without one there are no connections. The -config flag
	// overrides it.
	ConfigPath string
	// SecretKey (PATCHBAY_SECRET_KEY, default none) encrypts what is
	// stored in Redis: secrets PUT through the API, and OAuth and GitHub
	// App tokens. It is id:base64key,… (32-byte keys, the first current,
	// the rest still decrypt) or a passphrase of at least 16 bytes.
	// Without it secrets are read-only, and on a shared Redis the server
	// refuses to start with connections whose tokens it would store
	// (auth: oauth, auth: githubApp).
	SecretKey string
	// SecretsDir (PATCHBAY_SECRETS_DIR, default none) is a directory with
	// one file per secret, named as the secret.
	SecretsDir string
	// APIKeys (PATCHBAY_API_KEYS, default one made for this run and
	// printed) are comma separated, each plain or sha256:<64 hex digits>,
	// optionally followed by "@" and roles joined by "+" (ops-key@admin);
	// each is bound to the allowlist named default. The API is never
	// open: with no key here or in the config file, one is made.
	APIKeys []APIKey
	// AdminToken (PATCHBAY_ADMIN_TOKEN, default one made for this run and
	// printed) signs operators in to the admin UI.
	AdminToken string
	// PublicURL (PATCHBAY_PUBLIC_URL, default http://<PATCHBAY_ADDR>) is
	// where browsers reach this server, scheme and host: OAuth redirect
	// URIs are built on it.
	PublicURL string
	// PprofAddr (PATCHBAY_PPROF_ADDR, default off) serves net/http/pprof
	// on its own listener for profiling. Profiles show request data and
	// the endpoints can stall the process, so it must be a loopback
	// address; reach it from elsewhere through a tunnel.
	PprofAddr string
	// TraceURL (PATCHBAY_TRACE_URL, default none) links each execution in
	// the admin UI to its trace: a URL with {traceId} where the trace id
	// goes, such as https://jaeger.example.com/trace/{traceId}.
	TraceURL  string
	LogLevel  string // PATCHBAY_LOG_LEVEL, default info: the least level logged: debug, info, warn or error
	LogFormat string // PATCHBAY_LOG_FORMAT, default text: how log lines are written: text or json
	// Workers (PATCHBAY_WORKERS, default 32 per CPU, at most 256) is how
	// many executions this process runs at once (see DefaultWorkers).
	Workers   int
	Retention time.Duration // PATCHBAY_RETENTION, default 168h: how long finished executions are kept
	// ClaimTimeout (PATCHBAY_CLAIM_TIMEOUT, default 10s) is how long a
	// replica may hold an execution without renewing its claim before
	// another replica takes it over and resumes it from the ledger. The
	// claim is renewed every third of it, so a runner survives two missed
	// renewals (a GC pause, a Redis failover) before it is fenced; a
	// crashed runner's executions come back between two thirds of it and
	// all of it after the crash, plus up to a second until a worker looks
	// (see DefaultClaimTimeout).
	ClaimTimeout time.Duration
	// PoolReclaimAfter (PATCHBAY_POOL_RECLAIM_AFTER, default 2m) is how
	// long a pool lease may go unrenewed before it is reclaimed and its
	// server closed.
	PoolReclaimAfter time.Duration
	// ProfilesDir (PATCHBAY_PROFILES_DIR, default the config file's
	// profilesDir) is the directory of extra profile and binding files.
	ProfilesDir  string
	MaxBodyBytes int64 // PATCHBAY_MAX_BODY_BYTES, default 1 MiB: the largest request body
	// ShutdownGrace (PATCHBAY_SHUTDOWN_GRACE, default 30s) is how long a
	// SIGTERM waits for requests and executions in flight; the process
	// exits by then (plus 5 s to close connections) whatever still runs,
	// and another replica, or this one restarted, resumes what was cut.
	ShutdownGrace time.Duration
	// SchemaMaxNodes (PATCHBAY_SCHEMA_MAX_NODES, default 0, the harness's
	// 20,000) bounds an operation schema gate 2 compiles, in JSON values
	// once its repeated subschemas are shared; past it the call is refused
	// at gate 2.
	SchemaMaxNodes int
	// SchemaCompileTimeout (PATCHBAY_SCHEMA_COMPILE_TIMEOUT, default 0,
	// the harness's 10s) is how long a call waits for its operation's
	// schema to compile; past it the call is refused at gate 2.
	SchemaCompileTimeout time.Duration
	// StartTriggers starts trigger delivery and cron at boot
	// (PATCHBAY_START_TRIGGERS, default true); when false, POST
	// /v1/harness/start does.
	StartTriggers bool
	// Limits bound what one client can hold of the server: its time,
	// connections and failed credentials.
	Limits Limits
	File   File // the parsed config file
}

// Limits are the request limits against slow or abusive clients. The
// timeouts are the http.Server's; SSE streams extend their write deadline
// on every write instead of being cut off (see cmd/server).
type Limits struct {
	// ReadHeaderTimeout (PATCHBAY_READ_HEADER_TIMEOUT, default 10s)
	// bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// ReadTimeout (PATCHBAY_READ_TIMEOUT, default 60s) bounds reading a
	// whole request, body included.
	ReadTimeout time.Duration
	// WriteTimeout (PATCHBAY_WRITE_TIMEOUT, default 60s) bounds writing a
	// response, counted from its first byte, so a client that stops
	// reading is let go; an event stream gets it afresh for every write.
	WriteTimeout time.Duration
	// IdleTimeout (PATCHBAY_IDLE_TIMEOUT, default 120s) closes a
	// keep-alive connection with no request in flight.
	IdleTimeout time.Duration
	// MaxHeaderBytes (PATCHBAY_MAX_HEADER_BYTES, default 64 KiB) bounds
	// a request's header block; larger is answered 431.
	MaxHeaderBytes int
	// MaxConns (PATCHBAY_MAX_CONNS, default 1024) caps open client
	// connections; further ones wait in the listen backlog.
	MaxConns int
	// MaxConnsPerAddress (PATCHBAY_MAX_CONNS_PER_ADDRESS, default 256)
	// caps the connections of one client address (an IPv6 client's /64),
	// so that one client cannot take all of MaxConns; further ones are
	// closed at once. Trusted proxies are exempt: every client behind
	// them shares their address.
	MaxConnsPerAddress int
	// TrustedProxies (PATCHBAY_TRUSTED_PROXIES, default none) are the
	// reverse proxies, as comma-separated CIDRs or addresses, whose
	// X-Forwarded-For names the client that failed credentials are
	// counted against; their connections are not capped per address.
	TrustedProxies []netip.Prefix
	// AuthFailures (PATCHBAY_AUTH_FAILURES, default 5) is how many wrong
	// API keys or admin tokens one address may send before it is blocked.
	AuthFailures int
	// AuthBackoff (PATCHBAY_AUTH_BACKOFF, default 1s) is the first block;
	// it doubles with every further failure up to AuthBackoffMax.
	AuthBackoff time.Duration
	// AuthBackoffMax (PATCHBAY_AUTH_BACKOFF_MAX, default 5m) is the
	// longest block.
	AuthBackoffMax time.Duration
	// MaxStreams (PATCHBAY_MAX_STREAMS, default 512) caps the event
	// streams open in this process: the API's execution events and the
	// admin UI's live pages together. Past it a stream is refused with
	// 429 and Retry-After.
	MaxStreams int
	// MaxStreamsPerPrincipal (PATCHBAY_MAX_STREAMS_PER_PRINCIPAL, default
	// 32) caps the event streams one API key or UI user holds open in
	// this process, so that one caller cannot take them all.
	MaxStreamsPerPrincipal int
	// QuestionHold (PATCHBAY_QUESTION_HOLD, default 5m) is how long a
	// call is held while a question its server asked waits for a person
	// (1s–24h); past it the question expires and the server is told so.
	QuestionHold time.Duration
	// MCPHold (PATCHBAY_MCP_HOLD, default 30s) is how long a /mcp
	// tools/call without a task is held, with progress notifications,
	// while its call waits for approval; then it is answered with a tool
	// error naming the approval (a retry with the same call id gets the
	// decided call's result).
	MCPHold time.Duration
	// MCPSessionsPerPrincipal (PATCHBAY_MCP_SESSIONS_PER_PRINCIPAL,
	// default 64) caps the /mcp sessions one caller holds open in this
	// process, generously: clients rarely end their sessions, which then
	// idle out. Past it the request is 429 with Retry-After.
	MCPSessionsPerPrincipal int
	// MCPCallsPerPrincipal (PATCHBAY_MCP_CALLS_PER_PRINCIPAL, default 16)
	// caps one caller's /mcp tools/call requests in flight in this
	// process; past it the request is 429 with Retry-After.
	MCPCallsPerPrincipal int
	// MCPSessionIdle (PATCHBAY_MCP_SESSION_IDLE, default 30m) ends a
	// 2025-era /mcp session unused for that long (and releases the pool
	// leases it holds).
	MCPSessionIdle time.Duration
}

// APIKey is one accepted API key. Keys are kept only as SHA-256 digests so a
// plain key given in the environment is not held in memory longer than load.
type APIKey struct {
	SHA256 [32]byte
	// Name identifies the key's holder as the principal in approvals and
	// audit records ("env-1" for keys from PATCHBAY_API_KEYS).
	Name string
	// Allowlist names the allowlist that bounds what documents sent with
	// this key may use ("default" for keys from PATCHBAY_API_KEYS).
	Allowlist string
	// Roles say what the key may do beyond running its own work (see
	// package authz); none means run. Keys from PATCHBAY_API_KEYS have
	// the roles written after "@" ("ops-key@admin"), else none.
	Roles []authz.Role
	// Approve limits the approve role to "<connection>.<operation>" globs.
	Approve []string
	// Push names the sources the key may push events into.
	Push []string
}

// FileAPIKey is an API key declared in the config file, bound to a named
// allowlist. Exactly one of Key (plain, usually ${env:...}) and SHA256 (64
// hex digits) is given.
type FileAPIKey struct {
	// Name is the key's principal: unique among all keys, and none of
	// the names authz.Reserved keeps (env-<n> are the names of
	// PATCHBAY_API_KEYS's keys).
	Name string `yaml:"name"`
	// Key is the plain key, usually ${env:NAME}; SHA256 is instead its
	// SHA-256 in 64 hex digits, so that the file holds no key at all.
	Key    string `yaml:"key"`
	SHA256 string `yaml:"sha256"`
	// Allowlist names the allowlist that bounds what documents sent with
	// this key may use.
	Allowlist string `yaml:"allowlist"`
	// Roles say what the key may do beyond running its own work (run,
	// read, approve, admin, or roles of your own); none means run.
	Roles []string `yaml:"roles"`
	// Approve limits the approve role to "<connection>.<operation>" globs.
	Approve []string `yaml:"approve"`
	// Push names the sources the key may push events into.
	Push []string `yaml:"push"`
}

// Policy is a connection's call policy: operations matching a deny glob are
// refused, those matching an approve glob wait for a person's approval.
type Policy struct {
	// Approve and Deny are globs over the connection's operation names
	// (chat.post, admin.*).
	Approve []string `yaml:"approve"`
	Deny    []string `yaml:"deny"`
	// Allow lets operations a profile marks guarded run without approval.
	Allow []string `yaml:"allow"`
	// Approvers, when given, are the only ones who may decide this
	// connection's approvals: principal names, or "role:<role>".
	Approvers []string `yaml:"approvers"`
	// Answerers, when given, are the only ones who may answer the
	// questions this connection's server asks, as approvers.
	Answerers []string `yaml:"answerers"`
	// DeclineQuestions lists question modes (form, url) declined without
	// asking anyone.
	DeclineQuestions []string `yaml:"declineQuestions"`
}

// File is the YAML (or JSON) config file.
type File struct {
	// Name labels the configuration for the people who read it (such as
	// ops).
	Name string `yaml:"name"`
	// Connections are what executions call and where events come from,
	// by name: each an MCP server, an OpenAPI API, a Drive, a source or
	// a cron (see Connection).
	Connections map[string]Connection `yaml:"connections"`
	// Triggers start executions on the connections' events.
	Triggers []Trigger `yaml:"triggers"`
	// Inbox tunes how events reach the triggers; nil: the defaults.
	Inbox *Inbox `yaml:"inbox"`
	// APIKeys are API keys beside PATCHBAY_API_KEYS, each with its own
	// name, allowlist and roles.
	APIKeys []FileAPIKey `yaml:"apiKeys"`
	// Allowlists seed the allowlists in Redis at start: one that already
	// exists there (edited through the API) is left as it is. Each is an
	// allowlist document as PUT /v1/allowlists/{name} takes it.
	Allowlists map[string]map[string]any `yaml:"allowlists"`
	// Models are the model providers model nodes select by name (see
	// models.go).
	Models map[string]ModelProvider `yaml:"models"`
	// ProfilesDir is a directory of extra profile and binding files
	// (package profiles); PATCHBAY_PROFILES_DIR, when set, wins. A bad
	// file there stops the server at start, naming its path.
	ProfilesDir string `yaml:"profilesDir"`
	// MCP configures /mcp, patchbay's own MCP face (see mcp.go).
	MCP MCPSection `yaml:"mcp"`
	// Agents are the coding agents acp-agent nodes run (see agents.go).
	Agents map[string]Agent `yaml:"agents"`
}

// Connection is one entry under connections: exactly one of mcp, openapi,
// drive, source and cron.
type Connection struct {
	// MCP makes the entry an MCP server (see MCP).
	MCP *MCP `yaml:"mcp"`
	// OpenAPI makes the entry a REST API described by an OpenAPI 3
	// document (see OpenAPI).
	OpenAPI *OpenAPI `yaml:"openapi"`
	// Auth is the credential an http or sse MCP server or an OpenAPI API
	// needs (an OAuth sign-in, or GitHub App tokens), nil for none. See
	// Auth.
	Auth *Auth `yaml:"auth"`
	// Policy says which of the entry's operations are refused and which
	// wait for a person's approval (see Policy).
	Policy *Policy `yaml:"policy"`
	// RequiresPrincipal marks a connection that acts as a user: its
	// operations are hidden from executions that have no principal.
	RequiresPrincipal bool `yaml:"requiresPrincipal"`
	// Determinism: replayable | costly | unsafe (default), what a resumed
	// execution does with results recorded before this connection's
	// server was replaced.
	Determinism string `yaml:"determinism"`
	// Pool makes an mcp entry a pool of fresh servers (see pools.go).
	Pool *Pool `yaml:"pool"`
	// Source makes the entry an event source that host code pushes to
	// (see Source).
	Source *Source `yaml:"source"`
	// Webhooks takes the entry's events as signed webhooks from their
	// senders, at /hooks/<name> (see Webhooks).
	Webhooks *Webhooks `yaml:"webhooks"`
	// Cron makes the entry a schedule whose one event, tick, comes at
	// each scheduled time (see Cron).
	Cron *Cron `yaml:"cron"`
	// Drive makes the entry a Google Drive provider (see Drive).
	Drive *Drive `yaml:"drive"`
	// Binding maps an mcp server that declares no profile onto one: the
	// name of a binding file (package profiles), such as
	// playwright-browser. Checked against the profile catalog at start.
	Binding string `yaml:"binding"`
}

// MCP describes an MCP server reached over stdio (command) or Streamable
// HTTP (url).
type MCP struct {
	// Name, when given, must be the connection's own name.
	Name string `yaml:"name"`
	Type string `yaml:"type"` // stdio | http | sse; inferred from command/url when empty
	// Command, Args, Env and Cwd start a stdio server; ${env:NAME} may
	// stand in them (and a pool's ${setup.FIELD} in args and env).
	Command string            `yaml:"command"`
	Args    []string          `yaml:"args"`
	Env     map[string]string `yaml:"env"`
	Cwd     string            `yaml:"cwd"`
	// URL and Headers reach an http or sse server; ${env:NAME} may stand
	// in them.
	URL              string            `yaml:"url"`
	Headers          map[string]string `yaml:"headers"`
	TimeoutMs        int               `yaml:"timeoutMs"`        // connect timeout, default 30000
	RequestTimeoutMs int               `yaml:"requestTimeoutMs"` // per call, default 60000
	// MaxResponseBytes bounds one message from the server (a stdio line or
	// an HTTP response body), default 16 MiB, so a runaway server cannot
	// exhaust patchbay's memory.
	MaxResponseBytes int64 `yaml:"maxResponseBytes"`
	// Subscribe lists server events (MCP Events extension) patchbay
	// subscribes to even when no trigger names them, so that wait nodes
	// see them. A trigger on the connection subscribes to its own event.
	Subscribe []EventSubscription `yaml:"subscribe"`
}

// EventSubscription is one subscription to a server's event type: the
// event and the arguments the server filters it by (validated against the
// event's inputSchema once the server has listed it).
type EventSubscription struct {
	// Event is the server's event type.
	Event string `yaml:"event"`
	// Arguments filter it on the server's side.
	Arguments map[string]any `yaml:"arguments"`
}

// OpenAPI describes a REST API by its OpenAPI 3.0 or 3.1 document: every
// operation of the document (or those Include selects) becomes an
// operation of the connection.
type OpenAPI struct {
	// URL is where the document is: an http(s) URL, or a file path
	// (relative to the working directory) or file:// URL.
	URL string `yaml:"url"`
	// BaseURL is where requests go; default the document's servers[0].url,
	// else the document's origin.
	BaseURL string `yaml:"baseUrl"`
	// Headers go with every call (an API key, say). They go with the
	// document request only as DocAuth says.
	Headers map[string]string `yaml:"headers"`
	// Include selects operations by operationId or tag, or by an
	// expression (see Include); empty means all.
	Include []Include `yaml:"include"`
	// DocAuth says whether Headers go with the document request: true
	// always, false never, unset only when BaseURL is set and has the
	// same origin as URL (documents often live on another host, and
	// credentials belong to the API's origin).
	DocAuth *bool `yaml:"docAuth"`
	// TimeoutMs bounds loading the document, default 30000;
	// RequestTimeoutMs bounds one call, default 60000.
	TimeoutMs        int `yaml:"timeoutMs"`
	RequestTimeoutMs int `yaml:"requestTimeoutMs"`
	// MaxResponseBytes bounds the document (fetched or read from a file)
	// and every response body, default 16 MiB.
	MaxResponseBytes int64 `yaml:"maxResponseBytes"`
	// FollowRedirects says which redirects a call follows: none,
	// same-origin (the default: GET and HEAD within the base URL's
	// origin) or any (GET and HEAD elsewhere too, without credentials).
	// See package credhttp.
	FollowRedirects string `yaml:"followRedirects"`
	// MaxSchemaNodes and MaxSchemaBytes bound one operation's input schema
	// in JSON values and bytes (defaults 10,000 and 1 MiB): refs are
	// inlined less deep to fit, and an operation that does not fit even
	// so fails the connection. MaxManifestBytes bounds all operations
	// together (default 32 MiB) and MaxOperations their number (default
	// 5,000). Inlined refs multiply, so these bound what a small
	// document can make the server build.
	MaxSchemaNodes   int64 `yaml:"maxSchemaNodes"`
	MaxSchemaBytes   int64 `yaml:"maxSchemaBytes"`
	MaxManifestBytes int64 `yaml:"maxManifestBytes"`
	MaxOperations    int   `yaml:"maxOperations"`
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

// Auth is a connection's credential. In the file it is either the word
// oauth (`auth: oauth`) or a mapping
// `auth: {oauth: {clientId, clientSecret, scopes}, perUser: true}` or
// `auth: {githubApp: {appId, privateKey, owner, repo, permissions}}` or,
// on a drive entry, `auth: {serviceAccount: {key}}`.
type Auth struct {
	// OAuth is set for an OAuth connection (both forms).
	OAuth *OAuth `yaml:"oauth"`
	// PerUser keeps each principal's own tokens; false keeps one shared
	// token, the operator's.
	PerUser bool `yaml:"perUser"`
	// GitHubApp is set for a connection whose calls carry GitHub App
	// installation tokens (see GitHubApp).
	GitHubApp *GitHubApp `yaml:"githubApp"`
	// ServiceAccount makes a drive entry act as a Google service account
	// instead of signing in with OAuth (see ServiceAccount).
	ServiceAccount *ServiceAccount `yaml:"serviceAccount"`

	word string // the scalar form as written, checked by Validate
}

// OAuth holds the optional pre-registered client of an OAuth connection.
// Without ClientID, patchbay identifies itself by a Client ID Metadata
// Document or registers dynamically.
type OAuth struct {
	// ClientID and ClientSecret are the pre-registered client, usually
	// ${env:NAME}.
	ClientID     string `yaml:"clientId"`
	ClientSecret string `yaml:"clientSecret" json:"-"`
	// Scopes are asked for at sign-in.
	Scopes []string `yaml:"scopes"`
	// Issuer names the authorization server, for APIs that publish no
	// protected resource metadata to discover it from (Google's; a drive
	// entry defaults to https://accounts.google.com).
	Issuer string `yaml:"issuer"`
}

// UnmarshalYAML reads both forms of auth. A word other than oauth is
// kept for Validate, which reports it with its path.
func (a *Auth) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*a = Auth{word: n.Value}
		if n.Value == "oauth" {
			a.OAuth = &OAuth{}
		}
		return nil
	}
	type plain Auth // without this method
	var p plain
	// A type error leaves the rest decoded, as the decoder does for
	// other fields, so Validate does not add a second complaint.
	err := n.Decode(&p)
	*a = Auth(p)
	return err
}

// acceptsScalar tells the shape check that a plain word may stand in for
// the mapping.
func (*Auth) acceptsScalar() {}
