// Package mcp owns patchbay's MCP provider: it implements harness.Provider
// and harness.Conn on mark3labs/mcp-go's client, for MCP servers run as a
// child process (stdio) and for remote servers (Streamable HTTP).
//
// Connecting starts the transport, initializes (client name "patchbay"),
// and reads every page of tools/list into the manifest, keeping each tool's
// inputSchema as the raw JSON the server sent. Each connect gets a fresh
// identity instance, since a new process or session may have lost whatever
// the previous one held. Calls carry patchbay's idempotency key in
// _meta["io.patchbay/idempotency-key"].
//
// A stdio server runs in its own process group with only PATH, HOME and its
// configured env, and the whole group is killed on Close; on Linux the child
// also gets SIGKILL if patchbay dies. The protocol era is whatever mcp-go
// negotiates (the 2026-07-28 stateless core when the server has it, else the
// initialize handshake); the MCP issue completes eras, fallbacks, SSE and
// OAuth sign-in later.
package mcp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
)

// MetaIdempotencyKey is the _meta key a call's idempotency key is sent
// under, so a server can recognise a call patchbay re-sends after a crash.
const MetaIdempotencyKey = "io.patchbay/idempotency-key"

// Defaults for the timeouts of config.MCP.
const (
	DefaultConnectTimeout = 30 * time.Second
	DefaultRequestTimeout = 60 * time.Second
)

// maxToolPages bounds tools/list, so a server that never stops paging fails
// the connect at once rather than at its timeout.
const maxToolPages = 100

// Options tunes a provider. A nil *Options, and every zero field, means the
// default.
type Options struct {
	// Logger receives the provider's and mcp-go's transport logs, tagged with
	// the connection name. Nil means slog.Default().
	Logger *slog.Logger
	// HTTPClient sends Streamable HTTP requests. It exists so a caller can
	// add what the connection needs on the wire (an OAuth token source, a
	// proxy, a test server's TLS roots). Nil means a new http.Client with no
	// overall timeout, since a response may stream for as long as a call
	// runs; calls are bounded by RequestTimeoutMs instead.
	HTTPClient *http.Client
	// Stderr receives a stdio server's stderr. Nil discards it (mcp-go still
	// drains it so the child never blocks). It is not logged by default
	// because a server may print what it was given, secrets included.
	Stderr io.Writer
	// ClientVersion is sent as the client version in the handshake. Empty
	// means the main module's version from the build info, or "dev".
	ClientVersion string
}

// New returns the provider of the connection named name. Problems with spec
// (no command, no url, an unknown transport) are reported by Connect, so a
// bad entry shows up in that connection's status.
func New(name string, spec config.MCP, opts *Options) harness.Provider {
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

func (p *provider) errorf(format string, args ...any) error {
	return fmt.Errorf("mcp %s: "+format, append([]any{p.name}, args...)...)
}

// Connect starts the server or session and reads its manifest, all within
// spec.TimeoutMs. On failure everything it started is closed again.
func (p *provider) Connect(ctx context.Context) (harness.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, millis(p.spec.TimeoutMs, DefaultConnectTimeout))
	defer cancel()

	c := &conn{
		name:           p.name,
		kind:           p.spec.Transport(),
		requestTimeout: millis(p.spec.RequestTimeoutMs, DefaultRequestTimeout),
		logger:         p.opts.Logger,
		identity:       harness.Identity{Surface: "mcp", Instance: rand.Text(), Epoch: 1},
	}
	var (
		trans transport.Interface
		err   error
	)
	switch c.kind {
	case "stdio":
		trans, err = p.stdio(c)
	case "http":
		trans, err = p.http(c)
	default:
		err = fmt.Errorf("transport %q is not supported (stdio or http)", c.kind)
	}
	if err != nil {
		return nil, p.errorf("connect: %w", err)
	}
	c.client = client.NewClient(trans)

	if err := c.connect(ctx, p.opts.ClientVersion); err != nil {
		if cerr := c.Close(); cerr != nil {
			p.opts.Logger.Warn("mcp: close after failed connect", "err", cerr)
		}
		return nil, p.errorf("connect: %w", err)
	}
	p.opts.Logger.Debug("mcp: connected", "transport", c.kind, "operations", len(c.manifest.Operations),
		"protocolVersion", c.client.ProtocolVersion())
	return c, nil
}

func (p *provider) stdio(c *conn) (transport.Interface, error) {
	if p.spec.Command == "" {
		return nil, errors.New("stdio needs a command")
	}
	c.proc = &process{dir: p.spec.Cwd}
	opts := []transport.StdioOption{
		transport.WithCommandFunc(c.proc.command),
		transport.WithCommandLogger(p.opts.Logger),
	}
	if p.opts.Stderr != nil {
		opts = append(opts, transport.WithCommandStderrWriter(p.opts.Stderr))
	}
	t := transport.NewStdioWithOptions(p.spec.Command, childEnv(p.spec.Env), p.spec.Args, opts...)
	c.capture = &capture{Interface: t}
	return c.capture, nil
}

func (p *provider) http(c *conn) (transport.Interface, error) {
	if p.spec.URL == "" {
		return nil, errors.New("http needs a url")
	}
	hc := p.opts.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	t, err := transport.NewStreamableHTTP(p.spec.URL,
		transport.WithHTTPBasicClient(hc),
		transport.WithHTTPHeaders(p.spec.Headers),
		transport.WithHTTPLogger(p.opts.Logger),
	)
	if err != nil {
		// The URL may carry credentials, so it is not repeated here.
		return nil, errors.New("invalid url")
	}
	c.capture = &capture{Interface: t}
	return &httpCapture{capture: c.capture, http: t}, nil
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

// connect runs the handshake and reads the manifest.
func (c *conn) connect(ctx context.Context, clientVersion string) error {
	// The transport keeps Start's context for the life of the connection
	// (server-to-client requests are refused once it ends), so it must not
	// be the connect timeout.
	if err := c.client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	init, err := c.client.Initialize(ctx, mcp.InitializeRequest{
		Params: mcp.InitializeParams{
			ClientInfo: mcp.Implementation{Name: "patchbay", Version: clientVersion},
		},
	})
	if err != nil {
		return fmt.Errorf("initialize: %w", err)
	}
	c.server = init.ServerInfo

	ops, err := c.listTools(ctx)
	if err != nil {
		return fmt.Errorf("list tools: %w", err)
	}
	c.manifest = harness.Manifest{Operations: ops}
	return nil
}

// listTools follows nextCursor to the last page. mcp-go's ListTools does the
// same but without a page limit.
func (c *conn) listTools(ctx context.Context) ([]harness.Operation, error) {
	var (
		ops  []harness.Operation
		req  mcp.ListToolsRequest
		seen = map[mcp.Cursor]bool{"": true}
	)
	for page := 1; ; page++ {
		if page > maxToolPages {
			return nil, fmt.Errorf("more than %d pages", maxToolPages)
		}
		res, err := c.client.ListToolsByPage(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("page %d: %w", page, err)
		}
		for _, t := range res.Tools {
			ops = append(ops, c.operation(t))
		}
		next := res.NextCursor
		if next == "" {
			return ops, nil
		}
		if seen[next] {
			return nil, fmt.Errorf("page %d repeats cursor %q", page, next)
		}
		seen[next] = true
		req.Params.Cursor = next
	}
}

func (c *conn) operation(t mcp.Tool) harness.Operation {
	a := t.Annotations
	title := a.Title
	if title == "" {
		title = t.Title
	}
	return harness.Operation{
		Name:        t.Name,
		Description: t.Description,
		InputSchema: c.schema(t),
		Annotations: harness.Annotations{
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
