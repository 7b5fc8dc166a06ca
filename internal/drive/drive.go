package drive

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/credhttp"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// Google's endpoints and the defaults of the entry's optional settings.
const (
	DefaultAPIBaseURL     = "https://www.googleapis.com/drive/v3"
	DefaultUploadBaseURL  = "https://www.googleapis.com/upload/drive/v3"
	DefaultRootFolderID   = "root"
	DefaultRequestTimeout = 60 * time.Second
	// DefaultMaxFileBytes is Google's bound for a single-request
	// (multipart or media) upload, which is all this provider sends.
	DefaultMaxFileBytes = 5 << 20
	// DefaultScope is the narrowest scope that can still create and edit:
	// only files the app created or was given.
	DefaultScope = "https://www.googleapis.com/auth/drive.file"
	// FolderMIME is the MIME type Drive gives folders.
	FolderMIME = "application/vnd.google-apps.folder"
)

// SecretResolver resolves the ${secret:NAME} holding a service account's
// key; the harness's secret chain is one.
type SecretResolver interface {
	Resolve(ctx context.Context, name string) (string, error)
}

// Redactor learns values that must never be stored or shown.
type Redactor interface {
	Add(values ...string)
}

// Options are the provider's optional parts; nil means defaults.
type Options struct {
	// HTTPClient sends the Drive requests and the service account's token
	// requests; nil is a client of its own. Its redirects follow package
	// credhttp's rules: the entry's followRedirects for Drive requests,
	// same-origin for token requests.
	HTTPClient *http.Client
	Logger     *slog.Logger
	// ServiceAccount makes calls that carry no per-call credentials act
	// as the account; nil: every call must carry the caller's token
	// (connect.CallRequest.Headers, from the OAuth sign-in).
	ServiceAccount *config.ServiceAccount
	// Secrets resolves the service account's key at each token exchange,
	// so a key rotated through the API is used from the next one on.
	Secrets SecretResolver
	// Redactor is told the key and every access token before use.
	Redactor Redactor
}

// Provider opens the connection behind one drive entry.
type Provider struct {
	name string
	spec config.Drive
	opts Options
	sa   *serviceAccount
}

// New returns the provider of the entry called name.
func New(name string, spec config.Drive, opts *Options) *Provider {
	p := &Provider{name: name, spec: spec}
	if opts != nil {
		p.opts = *opts
	}
	if p.opts.HTTPClient == nil {
		p.opts.HTTPClient = &http.Client{}
	}
	if p.opts.Logger == nil {
		p.opts.Logger = slog.New(slog.DiscardHandler)
	}
	if p.opts.Redactor == nil {
		p.opts.Redactor = noRedactor{}
	}
	if p.opts.ServiceAccount != nil {
		// The assertion goes to the key's token_uri only.
		p.sa = newServiceAccount(*p.opts.ServiceAccount, p.opts.Secrets, p.opts.Redactor, credhttp.Client(p.opts.HTTPClient, credhttp.FollowSameOrigin))
	}
	return p
}

type noRedactor struct{}

func (noRedactor) Add(...string) {}

// Connect checks the entry's URLs and declares the tools. It makes no
// request: Drive has nothing to discover, and a per-user entry has no
// credential before a call brings one.
func (p *Provider) Connect(context.Context) (connect.Conn, error) {
	api, err := baseURL(p.spec.APIBaseURL, DefaultAPIBaseURL)
	if err != nil {
		return nil, fmt.Errorf("drive %s: apiBaseUrl: %w", p.name, err)
	}
	upload, err := baseURL(p.spec.UploadBaseURL, DefaultUploadBaseURL)
	if err != nil {
		return nil, fmt.Errorf("drive %s: uploadBaseUrl: %w", p.name, err)
	}
	mode, err := credhttp.ParseRedirects(p.spec.FollowRedirects)
	if err != nil {
		return nil, fmt.Errorf("drive %s: %w", p.name, err)
	}
	root := p.spec.RootFolderID
	if root == "" {
		root = DefaultRootFolderID
	}
	auth := "oauth"
	if p.sa != nil {
		auth = "serviceAccount"
	}
	c := &conn{
		provider: p, api: api, upload: upload, root: root, client: credhttp.Client(p.opts.HTTPClient, mode),
		manifest: connect.Manifest{Operations: operations()},
		identity: connect.Identity{Surface: "drive", Instance: api.String() + "#" + root, Epoch: 1},
		info: map[string]any{
			"apiBaseUrl": api.String(), "uploadBaseUrl": upload.String(), "rootFolderId": root, "auth": auth,
		},
	}
	return c, nil
}

func baseURL(raw, def string) (*url.URL, error) {
	if raw == "" {
		raw = def
	}
	u, err := url.Parse(strings.TrimSuffix(raw, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errors.New("must be an absolute http(s) URL")
	}
	return u, nil
}

func (p *Provider) timeout() time.Duration {
	if p.spec.RequestTimeoutMs > 0 {
		return time.Duration(p.spec.RequestTimeoutMs) * time.Millisecond
	}
	return DefaultRequestTimeout
}

func (p *Provider) maxFileBytes() int64 {
	if p.spec.MaxFileBytes > 0 {
		return p.spec.MaxFileBytes
	}
	return DefaultMaxFileBytes
}

// conn is the declared tools over one Drive; calls are independent
// requests, so there is no session to keep and nothing to close.
type conn struct {
	provider    *Provider
	api, upload *url.URL
	// client sends the calls, following redirects as the entry says.
	client   *http.Client
	root     string
	manifest connect.Manifest
	identity connect.Identity
	info     map[string]any
}

func (c *conn) Manifest() connect.Manifest { return c.manifest }
func (c *conn) Identity() connect.Identity { return c.identity }
func (c *conn) Info() map[string]any       { return maps.Clone(c.info) }
func (c *conn) Close() error               { return nil }

// Call runs one tool. Its arguments passed gate 2 against the tool's
// schema. Drive's own refusals (a missing file, an ambiguous path, a 403)
// are *connect.CallError; a transport failure or a missing credential is
// a plain error.
func (c *conn) Call(ctx context.Context, req connect.CallRequest) (any, error) {
	t, ok := toolByName[req.Op]
	if !ok {
		return nil, fmt.Errorf("%w: %s", connect.ErrUnknownOperation, req.Op)
	}
	p := c.provider
	ctx, cancel := context.WithTimeout(ctx, p.timeout())
	defer cancel()
	cl := &call{conn: c, op: req.Op, headers: req.Headers}
	out, err := t.run(ctx, cl, args(req.Args))
	if err != nil {
		var ce *connect.CallError
		if errors.As(err, &ce) || errors.Is(err, connect.ErrNeedsSignIn) {
			return nil, err
		}
		if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("drive %s: %s: no answer within %s: %w", p.name, req.Op, p.timeout(), err)
		}
		return nil, fmt.Errorf("drive %s: %s: %w", p.name, req.Op, err)
	}
	return out, nil
}
