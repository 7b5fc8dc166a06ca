// Package mcp owns patchbay's MCP provider: it implements connect.Provider
// and connect.Conn on mark3labs/mcp-go's client, for MCP servers run as a
// child process (stdio) and for remote servers (Streamable HTTP, and legacy
// HTTP+SSE).
//
// # Eras and transports
//
// Over stdio and Streamable HTTP a connection speaks protocol 2026-07-28
// first (mcp-go probes with server/discover, then sends stateless requests
// carrying _meta and, over HTTP, MCP-Protocol-Version, Mcp-Method, Mcp-Name
// and Mcp-Param-* headers) and falls back to the 2025 initialize handshake
// when the server does not speak it. Over HTTP, a server that refuses the
// initialize POST with a 4xx is a legacy HTTP+SSE server, the last
// fallback; type: sse selects it directly. The era an HTTP origin settled
// on is cached for the life of the process, so reconnects skip the probes
// (a failed connect forgets it). Errors are not downgrades: a 401, 403, 5xx
// or network failure while connecting fails the connection and never leads
// to a fallback (capture refuses the initialize mcp-go would send next).
//
// # What patchbay adds to mcp-go
//
//   - capture (capture.go) sits between mcp-go's client and its transport:
//     it keeps raw tool schemas (mcp-go's struct drops keywords), refuses
//     the downgrade above, and lets listings send an explicit, even empty,
//     cursor and read the raw page (mcp-go cannot tell an omitted
//     nextCursor from "").
//   - listPages (list.go) reads tools/list and resources/list to the end:
//     an empty cursor is a cursor; a page without its array, a repeated
//     cursor or more than 100 pages fails the connection. Duplicate tool
//     names fail it too; a tool whose inputSchema does not compile as JSON
//     Schema (santhosh-tekuri/jsonschema, remote $refs never fetched) stays
//     listed but every call to it fails with the reason.
//   - wire (wire.go) is the HTTP RoundTripper of each session: a bound on
//     every POST response body (maxResponseBytes, default 16 MiB), a bound
//     on each single event of a GET event stream (the legacy HTTP+SSE
//     stream, a 2025 session's listening stream), whose breach fails the
//     session with ErrResponseTooLarge instead of letting mcp-go's
//     unbounded line reader grow, the record of fatal statuses while
//     connecting, and what became of a request's SSE response stream.
//   - re-issuing (capture.send): over 2026-07-28 a response stream that
//     ends or breaks before the response cannot be resumed (mcp-go resumes
//     only 2025 streams that sent event ids, and reports the rest as an
//     anonymous error), so the request is sent again under a new JSON-RPC
//     id with the same params (and idempotency key), at most twice; the
//     third break fails the call with ErrStreamBroken. A cancelled or timed
//     out request, or an oversized response, is never re-issued.
//   - tenant sessions (session.go): mcp-go has one header set per
//     transport, so a call with per-call headers (connect.CallRequest
//     Headers: the credentials resolved for its principal) goes out on a
//     session of its own per distinct header set (the configured headers
//     overlaid by the call's, names case-insensitive), opened on first use
//     in the era the connection settled on (2026-07-28: server/discover
//     with no fallback; 2025 and SSE: initialize, so the tenant gets its
//     own Mcp-Session-Id) and reused after. A tenant never rides on
//     discovery's session or another tenant's. At most 64 are kept, the
//     least recently used closed (after its calls in flight end); Close
//     closes all. A tenant's failure (401, which also matches
//     connect.ErrNeedsSignIn, an expired session it cannot renew, the
//     network under it) fails that tenant's call only; a lost tenant
//     session is reopened on its next call. Per-call headers may not
//     replace the transport's own (Mcp-Session-Id, MCP-Protocol-Version,
//     Mcp-Method, Mcp-Name, Mcp-Param-*, Content-Type, Accept, Host …),
//     and over stdio a call with them is refused. A tenant's Streamable
//     HTTP session opens no GET stream, and its 2026-07-28 calls get their
//     Mcp-Param-* headers from the connection's listing (mcp-go mirrors
//     them only for tools its own client listed). Header values are never
//     logged nor shown; Info shows only the count of tenant sessions.
//   - process and guard (proc.go): patchbay starts the stdio child itself
//     (own process group, only PATH, HOME, the configured env and its
//     process tree's tag, SIGKILL on parent death on Linux) and hands
//     mcp-go its pipes through transport.NewIO, with stdout guarded: a line
//     longer than maxResponseBytes or one that is not JSON ends the
//     connection with that reason instead of being skipped or buffered
//     without bound. Close ends the child's whole tree within 6 s: its
//     group and every process internal/proctree finds by the tag, so a
//     browser the server started in a session of its own goes with it.
//     The tag is the one the connect's context carries (a pool records a
//     lease's tag before provisioning, to sweep after a crash), else fresh.
//   - calls over stdio (call.go) are sent by patchbay rather than by
//     mcp-go's CallTool, whose per-request JSON work (params encoded and
//     decoded twice to merge _meta and compute HTTP headers, results decoded
//     twice) is not needed there: the params are written once, with the
//     session's 2026-07-28 _meta encoded at connect, and the result decoded
//     once. The bytes on the wire are mcp-go's; the request still goes
//     through capture, questions through the client's elicitation handler
//     under the same bounds, and a call its caller gives up on is followed
//     by notifications/cancelled. HTTP sessions keep mcp-go's path.
//   - ToolIDs and ModelTools (toolid.go) name tools for models, and
//     Secrets (secrets.go) lists the values of an entry to scrub.
//
// # Results, server requests, lifecycle
//
// A call's value is the structuredContent when present, else the first
// text block, decoded when it is JSON; isError is a *connect.CallError
// with the text. The client declares elicitation (form and URL), which the
// call's Asker answers (see elicit.go), and no sampling or roots
// capability, so a server that asks for those gets an error; a ping is
// answered; an input_required result is answered at most three rounds. Calls
// carry patchbay's idempotency key in _meta["io.patchbay/idempotency-key"].
// A conn that loses its server (the child exits, its output is faulted, an
// SSE stream or the network goes away) closes Done; calls then fail fast
// with connect.ErrUnavailable and the registry reconnects it, which gives a
// new identity instance. A 2025 session the server expired (HTTP 404 on
// its Mcp-Session-Id), the connection's own or a tenant's, is
// re-initialized once and the call sent again; the identity keeps its
// URL-derived instance (see instanceOf) and moves to the next epoch.
// Expired again right after, the call fails
// with a clear error instead of looping; the next call tries once more.
//
// OAuth sign-in is internal/oauth's: this package sends the headers the
// harness resolved for a call, and the sign-in service's Transport sits
// under Options.HTTPClient for the connection's own session. Tenant
// sessions are keyed by their exact header values, so a refreshed token
// opens a new session and the old one waits for eviction (bounded by 64).
package mcp

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/credhttp"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/proctree"
	"github.com/patchbay-dev/patchbay/internal/profiles"
)

// MetaIdempotencyKey is the _meta key a call's idempotency key is sent
// under, so a server can recognise a call patchbay re-sends after a crash.
const MetaIdempotencyKey = "io.patchbay/idempotency-key"

// MetaApproval is the _meta key under which a call that waited for a
// person carries the approval's id: a server that refused the target as
// guarded (a tool error with structuredContent {"code": "guarded"}) is
// sent the call again with it once approved.
const MetaApproval = "io.patchbay/approval"

// Defaults of config.MCP.
const (
	DefaultConnectTimeout   = 30 * time.Second
	DefaultRequestTimeout   = 60 * time.Second
	DefaultMaxResponseBytes = 16 << 20
)

// maxInputRounds bounds how often an input_required result is echoed.
const maxInputRounds = 3

// Eras a connection can settle on, as shown in Info()["era"].
const (
	EraModern = "2026-07-28" // stateless, server/discover
	EraLegacy = "2025"       // initialize handshake, sessions
	EraSSE    = "sse"        // legacy HTTP+SSE
)

// Options tunes a provider. A nil *Options, and every zero field, means the
// default.
type Options struct {
	// Logger receives the provider's and mcp-go's transport logs, tagged with
	// the connection name. Nil means slog.Default().
	Logger *slog.Logger
	// HTTPClient sends HTTP requests. It exists so a caller can add what the
	// connection needs on the wire (an OAuth token source, a proxy, a test
	// server's TLS roots). Nil means a new http.Client with no overall
	// timeout, since a response may stream for as long as a call runs; calls
	// are bounded by RequestTimeoutMs instead.
	HTTPClient *http.Client
	// Stderr receives a stdio server's stderr. Nil discards it. It is not
	// logged by default because a server may print what it was given,
	// secrets included.
	Stderr io.Writer
	// ClientVersion is sent as the client version. Empty means the main
	// module's version from the build info, or "dev".
	ClientVersion string
	// ProtocolVersion pins the preferred protocol version; a 2025 version
	// skips the 2026-07-28 probe. Empty means the newest. It exists for the
	// conformance client, which is told which revision to speak.
	ProtocolVersion string
	// Elicitation, when set, declares the elicitation capability and
	// answers elicitation requests. patchbay leaves it nil (a connection
	// never asks a user anything); it exists for the conformance client.
	Elicitation client.ElicitationHandler
	// ElicitationCapability is declared with Elicitation (for example to
	// announce applyDefaults).
	ElicitationCapability *mcp.ElicitationCapability
}

// New returns the provider of the connection named name. Problems with spec
// (no command, no url, an unknown transport) are reported by Connect, so a
// bad entry shows up in that connection's status.
func New(name string, spec config.MCP, opts *Options) connect.Provider {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Logger = o.Logger.With("connection", name)
	if o.ClientVersion == "" {
		o.ClientVersion = buildVersion()
	}
	return &provider{name: name, spec: spec, opts: o}
}

type provider struct {
	name string
	spec config.MCP
	opts Options
}

// eras caches the era each HTTP origin settled on.
var eras sync.Map // origin string → era string

func (p *provider) errorf(format string, args ...any) error {
	return fmt.Errorf("mcp %s: "+format, append([]any{p.name}, args...)...)
}

// Connect starts the server or session and reads its manifest, all within
// spec.TimeoutMs. On failure everything it started is closed again.
func (p *provider) Connect(ctx context.Context) (connect.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, millis(p.spec.TimeoutMs, DefaultConnectTimeout))
	defer cancel()
	conn, err := p.connect(ctx)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s (timeoutMs): %w", millis(p.spec.TimeoutMs, DefaultConnectTimeout), err)
		}
		return nil, p.errorf("connect: %w", err)
	}
	return conn, nil
}

func (p *provider) connect(ctx context.Context) (*conn, error) {
	switch kind := p.spec.Transport(); kind {
	case "stdio":
		return p.dial(ctx, "stdio", p.stdio)
	case "http":
		origin := originOf(p.spec.URL)
		cached, _ := eras.Load(origin)
		if cached == EraSSE {
			c, err := p.dial(ctx, "sse", p.sse)
			if err != nil {
				eras.Delete(origin)
			}
			return c, err
		}
		c, err := p.dial(ctx, "http", p.streamable)
		if errors.Is(err, transport.ErrLegacySSEServer) {
			p.opts.Logger.Debug("mcp: initialize refused; trying legacy HTTP+SSE")
			c, err = p.dial(ctx, "sse", p.sse)
			if err != nil {
				err = fmt.Errorf("initialize over Streamable HTTP was refused with a 4xx, and legacy HTTP+SSE failed too: %w", err)
			}
		}
		if err != nil {
			eras.Delete(origin)
			return nil, err
		}
		eras.Store(origin, c.era)
		return c, nil
	case "sse":
		return p.dial(ctx, "sse", p.sse)
	default:
		return nil, fmt.Errorf("transport %q is not supported (stdio, http or sse)", kind)
	}
}

// dial builds one conn over the transport open makes, connects it and
// reads its manifest; on failure it closes what it started.
func (p *provider) dial(ctx context.Context, kind string, open func(*conn) (transport.Interface, error)) (*conn, error) {
	c := &conn{
		name:           p.name,
		kind:           kind,
		requestTimeout: millis(p.spec.RequestTimeoutMs, DefaultRequestTimeout),
		connectTimeout: millis(p.spec.TimeoutMs, DefaultConnectTimeout),
		limit:          p.maxResponse(),
		logger:         p.opts.Logger,
		identity:       connect.Identity{Surface: "mcp", Instance: instanceOf(kind, p.spec), Epoch: 1},
		done:           make(chan struct{}),
		invalid:        map[string]string{},
		tenants:        &tenants{max: maxTenants},
		configured:     p.spec.Headers,
		treeTag:        proctree.TagFrom(ctx),
		elicitor:       newElicitor(),
	}
	trans, err := open(c)
	if err != nil {
		return nil, err
	}
	legacyOnly := kind == "sse" || (p.opts.ProtocolVersion != "" && !mcp.IsModernProtocol(p.opts.ProtocolVersion))
	if kind == "http" {
		if era, _ := eras.Load(originOf(p.spec.URL)); era == EraLegacy {
			legacyOnly = true
		}
	}
	c.client = client.NewClient(trans, p.clientOptions(legacyOnly, p.opts.ProtocolVersion, c.elicitor)...)
	c.own = &session{client: c.client, capture: c.capture, wire: c.wire}
	c.client.OnNotification(c.taskWake.notified)
	c.client.OnNotification(c.refreshEvents)
	c.client.OnNotification(c.routeEvents)
	if kind != "stdio" {
		c.openTenant = func(ctx context.Context, headers map[string]string) (*session, error) {
			return p.openTenant(ctx, c, headers)
		}
	}
	if c.wire != nil {
		c.wire.startConnect()
	}
	err = c.connect(ctx, p.opts.ClientVersion)
	if c.wire != nil {
		if ferr := c.wire.fatalErr(); err != nil && ferr != nil && !errors.Is(err, ferr) {
			err = fmt.Errorf("%w (%w)", ferr, err)
		}
		c.wire.endConnect()
	}
	if err != nil {
		if cerr := c.Close(); cerr != nil {
			p.opts.Logger.Warn("mcp: close after failed connect", "err", cerr)
		}
		return nil, err
	}
	if kind == "sse" {
		c.client.OnConnectionLost(func(err error) { c.fail(fmt.Errorf("sse stream lost: %w", err)) })
	}
	if kind == "stdio" {
		handler, _ := p.elicitation(c.elicitor)
		if c.own.direct, err = newDirectCall(c.client, handler, clientInfo(p.opts.ClientVersion)); err != nil {
			if cerr := c.Close(); cerr != nil {
				p.opts.Logger.Warn("mcp: close after failed connect", "err", cerr)
			}
			return nil, err
		}
	}
	p.opts.Logger.Debug("mcp: connected", "transport", c.kind, "era", c.era, "operations", len(c.manifest.Operations),
		"protocolVersion", c.client.ProtocolVersion())
	return c, nil
}

// clientOptions are the mcp-go client options of one session.
func (p *provider) clientOptions(legacyOnly bool, version string, el *elicitor) []client.ClientOption {
	copts := []client.ClientOption{client.WithMaxInputRoundTrips(maxInputRounds)}
	if legacyOnly {
		copts = append(copts, client.WithLegacyProtocolOnly())
	}
	if version != "" {
		copts = append(copts, client.WithProtocolVersion(version))
	}
	// Every session declares the Tasks extension: a server may then answer
	// any call with a task, which the call waits on (see tasks.go).
	caps := mcp.ClientCapabilities{Extensions: map[string]any{ExtTasks: map[string]any{}}}
	handler, declared := p.elicitation(el)
	copts = append(copts, client.WithElicitationHandler(handler))
	caps.Elicitation = declared
	return append(copts, client.WithClientCapabilities(caps))
}

// elicitation is the elicitation handler of every session and the
// capability it declares: the configured one (the conformance client's),
// else el, which puts questions to the calls' Askers (elicit.go).
func (p *provider) elicitation(el *elicitor) (client.ElicitationHandler, *mcp.ElicitationCapability) {
	if p.opts.Elicitation != nil {
		return p.opts.Elicitation, p.opts.ElicitationCapability
	}
	return el, elicitationCapability()
}

// clientInfo is who patchbay says it is to a server.
func clientInfo(version string) mcp.Implementation {
	return mcp.Implementation{Name: "patchbay", Version: version}
}

// openTenant opens the session of one tenant (one distinct header set) of
// the live HTTP or SSE connection c, in the era c settled on: over
// 2026-07-28 a server/discover with the tenant's headers (no fallback to
// initialize: that would be a downgrade), else the initialize handshake at
// c's protocol version, which gives the tenant a Mcp-Session-Id of its
// own. A tenant's Streamable HTTP session opens no GET stream (so 64
// tenants do not hold 64 idle streams); server requests reach it on its
// POST responses. Its wire reports an oversized event to the session, not
// to the connection.
func (p *provider) openTenant(ctx context.Context, c *conn, headers map[string]string) (*session, error) {
	s := &session{tenant: true}
	s.wire = p.newWire(c.limit, func(err error) { s.lost.set(err) })
	var (
		trans transport.Interface
		err   error
	)
	switch c.kind {
	case "http":
		trans, s.capture, err = p.streamableTransport(s.wire, headers, false)
	case "sse":
		trans, s.capture, err = p.sseTransport(s.wire, headers, c.requestTimeout)
	default:
		return nil, fmt.Errorf("per-call headers cannot be sent over %s", c.kind)
	}
	if err != nil {
		return nil, err
	}
	modern := c.era == EraModern
	copts := p.clientOptions(!modern, c.client.ProtocolVersion(), c.elicitor)
	if modern {
		s.capture.modernOnly = true
		s.capture.tools = c.tools
		copts = append(copts, client.WithDiscoverTimeout(-1)) // bounded by ctx
	}
	s.client = client.NewClient(trans, copts...)
	s.client.OnNotification(c.taskWake.notified)
	s.wire.startConnect()
	err = s.client.Start(context.WithoutCancel(ctx))
	if err == nil {
		_, err = s.client.Initialize(ctx, mcp.InitializeRequest{
			Params: mcp.InitializeParams{ClientInfo: mcp.Implementation{Name: "patchbay", Version: p.opts.ClientVersion}},
		})
	}
	if ferr := s.wire.fatalErr(); err != nil && ferr != nil && !errors.Is(err, ferr) {
		err = fmt.Errorf("%w (%w)", ferr, err)
	}
	s.wire.endConnect()
	if err != nil {
		s.close()
		return nil, err
	}
	if c.kind == "sse" {
		s.client.OnConnectionLost(func(err error) { s.lost.set(fmt.Errorf("sse stream lost: %w", err)) })
	}
	if modern {
		s.capture.reissue.Store(true)
	}
	return s, nil
}

func (p *provider) maxResponse() int64 {
	if p.spec.MaxResponseBytes > 0 {
		return p.spec.MaxResponseBytes
	}
	return DefaultMaxResponseBytes
}

func (p *provider) stdio(c *conn) (transport.Interface, error) {
	if p.spec.Command == "" {
		return nil, errors.New("stdio needs a command")
	}
	tag := c.treeTag
	if tag == "" {
		tag = proctree.NewTag()
	}
	c.proc = &process{dir: p.spec.Cwd, tag: tag}
	stdin, stdout, err := c.proc.start(p.spec.Command, p.spec.Args, childEnv(p.spec.Env), p.opts.Stderr)
	if err != nil {
		return nil, err
	}
	out := guard(stdout, c.limit, c.fail)
	go func() {
		<-c.proc.exited
		if c.closed.Load() {
			return
		}
		if c.proc.err != nil {
			c.fail(fmt.Errorf("server process exited: %w", c.proc.err))
		} else {
			c.fail(errors.New("server process exited"))
		}
	}()
	t := transport.NewIO(out, stdin, nil)
	c.capture = &capture{Interface: t}
	return c.capture, nil
}

// newWire is the wire of one session; fault hears of an oversized event on
// its event stream.
func (p *provider) newWire(limit int64, fault func(error)) *wire {
	rt := http.RoundTripper(nil)
	if p.opts.HTTPClient != nil {
		rt = p.opts.HTTPClient.Transport
	}
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &wire{base: rt, limit: limit, fault: fault}
}

// httpClient is the configured HTTP client with w as its transport. It
// follows redirects only within the connection's origin: the connection's
// headers carry its credentials (an API key, a user's token), and net/http
// forwards every header but Authorization and cookies to another host, a
// POST's body too on 307 and 308.
func (p *provider) httpClient(w *wire) *http.Client {
	var hc http.Client
	if p.opts.HTTPClient != nil {
		hc = *p.opts.HTTPClient
	}
	hc.Transport = w
	return credhttp.KeepOrigin(&hc)
}

func (p *provider) streamable(c *conn) (transport.Interface, error) {
	c.wire = p.newWire(c.limit, c.fail)
	trans, capt, err := p.streamableTransport(c.wire, p.spec.Headers, true)
	c.capture = capt
	return trans, err
}

// streamableTransport is a Streamable HTTP transport sending headers; with
// listen, a 2025 session also opens the GET stream for the server's own
// requests.
func (p *provider) streamableTransport(w *wire, headers map[string]string, listen bool) (transport.Interface, *capture, error) {
	if p.spec.URL == "" {
		return nil, nil, errors.New("http needs a url")
	}
	opts := []transport.StreamableHTTPCOption{
		transport.WithHTTPBasicClient(p.httpClient(w)),
		transport.WithHTTPHeaders(headers),
		transport.WithHTTPLogger(slog.New(quietHandler{p.opts.Logger.Handler()})),
	}
	if listen {
		opts = append(opts, transport.WithContinuousListening())
	}
	t, err := transport.NewStreamableHTTP(p.spec.URL, opts...)
	if err != nil {
		// The URL may carry credentials, so it is not repeated here.
		return nil, nil, errors.New("invalid url")
	}
	capt := &capture{Interface: t, wire: w}
	return &httpCapture{capture: capt, http: t}, capt, nil
}

func (p *provider) sse(c *conn) (transport.Interface, error) {
	c.wire = p.newWire(c.limit, c.fail)
	trans, capt, err := p.sseTransport(c.wire, p.spec.Headers, c.requestTimeout)
	c.capture = capt
	return trans, err
}

// sseTransport is a legacy HTTP+SSE transport sending headers.
func (p *provider) sseTransport(w *wire, headers map[string]string, requestTimeout time.Duration) (transport.Interface, *capture, error) {
	if p.spec.URL == "" {
		return nil, nil, errors.New("sse needs a url")
	}
	t, err := transport.NewSSE(p.spec.URL,
		transport.WithHTTPClient(p.httpClient(w)),
		transport.WithHeaders(headers),
		transport.WithSSELogger(p.opts.Logger),
		transport.WithResponseTimeout(requestTimeout),
	)
	if err != nil {
		return nil, nil, errors.New("invalid url")
	}
	capt := &capture{Interface: t, wire: w}
	return &httpCapture{capture: capt, http: t}, capt, nil
}

// quietHandler turns mcp-go's error for a server without the optional GET
// stream (most 2025 servers) into a debug record: it is not a fault.
type quietHandler struct{ slog.Handler }

func (q quietHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError && r.Message == "server does not support listening" {
		r.Level = slog.LevelDebug
		if !q.Handler.Enabled(ctx, r.Level) {
			return nil
		}
	}
	return q.Handler.Handle(ctx, r)
}

func (q quietHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return quietHandler{q.Handler.WithAttrs(a)}
}
func (q quietHandler) WithGroup(n string) slog.Handler { return quietHandler{q.Handler.WithGroup(n)} }

// originOf is scheme://host of u, the key of the era cache.
func originOf(u string) string {
	pu, err := url.Parse(u)
	if err != nil {
		return u
	}
	return pu.Scheme + "://" + pu.Host + pu.Path
}

// childEnv is the environment of a stdio server: PATH and HOME from
// patchbay's own environment, then the configured env (which wins). The rest
// of patchbay's environment is not passed on, because it holds patchbay's
// own secrets (PATCHBAY_SECRET_KEY, REDIS_URL, API keys) that a third-party
// server has no business seeing; PATH and HOME are what commands such as npx
// or uvx need to be found and to find their caches.
func childEnv(configured map[string]string) []string {
	var env []string
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	keys := make([]string, 0, len(configured))
	for k := range configured {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+configured[k])
	}
	return env
}

// connect runs the handshake (or discovery) and reads the manifest.
func (c *conn) connect(ctx context.Context, clientVersion string) error {
	// The transport keeps Start's context for the life of the connection
	// (server-to-client requests are refused once it ends), so it must not
	// be the connect timeout.
	if err := c.client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	init, err := c.client.Initialize(ctx, mcp.InitializeRequest{
		Params: mcp.InitializeParams{ClientInfo: clientInfo(clientVersion)},
	})
	if err != nil {
		if f := c.fault.get(); f != nil {
			return fmt.Errorf("initialize: %w", f)
		}
		return fmt.Errorf("initialize: %w", err)
	}
	c.server = init.ServerInfo
	switch {
	case c.kind == "sse":
		c.era = EraSSE
	case mcp.IsModernProtocol(c.client.ProtocolVersion()):
		c.era = EraModern
		if c.wire != nil {
			c.capture.reissue.Store(true)
		}
	default:
		c.era = EraLegacy
	}

	ops, invalid, err := c.listTools(ctx)
	if err != nil {
		return fmt.Errorf("list tools: %w", err)
	}
	declared, err := declaredProfiles(init.Capabilities.Experimental)
	if err != nil {
		return err
	}
	c.manifest = connect.Manifest{Operations: ops, Profiles: declared, Events: c.loadEvents(ctx)}
	c.invalid = invalid
	if init.Capabilities.Resources != nil {
		n, err := c.listResources(ctx)
		if err != nil {
			return fmt.Errorf("list resources: %w", err)
		}
		c.resources = n
	}
	return nil
}

func (c *conn) operation(t mcp.Tool) connect.Operation {
	a := t.Annotations
	title := a.Title
	if title == "" {
		title = t.Title
	}
	return connect.Operation{
		Name:        t.Name,
		Description: t.Description,
		InputSchema: c.schema(t),
		Annotations: connect.Annotations{
			Title:           title,
			ReadOnlyHint:    a.ReadOnlyHint,
			DestructiveHint: a.DestructiveHint,
			IdempotentHint:  a.IdempotentHint,
			OpenWorldHint:   a.OpenWorldHint,
		},
	}
}

// millis turns a config value in milliseconds into a duration, with def for
// zero or less.
func millis(ms int, def time.Duration) time.Duration {
	if ms <= 0 {
		return def
	}
	return time.Duration(ms) * time.Millisecond
}

func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// instanceOf names the thing a connection drives. A stdio server is a
// child process of this replica: each connect starts a new one, whose
// state starts empty, so each gets a fresh instance. A remote server is the
// same server whichever replica or session reaches it, so its instance is
// derived from its URL (without credentials): a replica that takes an
// execution over keeps its recorded results.
func instanceOf(kind string, spec config.MCP) string {
	if kind == "stdio" {
		return rand.Text()
	}
	u, err := url.Parse(spec.URL)
	if err != nil {
		return rand.Text()
	}
	sum := sha256.Sum256([]byte(u.Scheme + "://" + u.Host + u.Path))
	return "url-" + hex.EncodeToString(sum[:10])
}

// declaredProfiles reads the profiles a server declares it speaks from
// its experimental capabilities: {"io.patchbay/profiles": {"chat":
// "1.0.0"}}. A malformed declaration fails the connect, since what the
// server claims cannot be checked.
func declaredProfiles(experimental map[string]any) (map[string]string, error) {
	raw, ok := experimental[profiles.DeclarationKey]
	if !ok {
		return nil, nil
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("capability %s must map profile names to versions", profiles.DeclarationKey)
	}
	out := make(map[string]string, len(m))
	for name, v := range m {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("capability %s: profile %s must have a version string", profiles.DeclarationKey, name)
		}
		out[name] = s
	}
	return out, nil
}
