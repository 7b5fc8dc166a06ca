package oauth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode"

	"golang.org/x/oauth2"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/credhttp"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/seal"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// SharedPrincipal is the principal a shared (not per-user) connection's
// token is kept under: the operator's.
const SharedPrincipal = authz.OperatorName

// Paths under Options.PublicURL that the web layer serves.
const (
	CallbackPath       = "/oauth/callback"
	ClientMetadataPath = "/oauth/client-metadata.json"
)

// Timing and size limits.
const (
	// StateTTL is how long a sign-in may take from Begin to Complete.
	StateTTL = 10 * time.Minute
	// RefreshMargin: a token that expires within it is refreshed first.
	RefreshMargin = 60 * time.Second
	// lockTTL bounds how long one replica may hold a refresh; a replica
	// that dies mid-refresh delays the others by at most this.
	lockTTL = 30 * time.Second
	// challengeTTL is how long a recorded WWW-Authenticate challenge
	// guides the next sign-in.
	challengeTTL = time.Hour
	// maxDocument bounds every metadata and token document read.
	maxDocument = 1 << 20
	// maxPrincipal bounds a principal's name (it is part of Redis keys).
	maxPrincipal   = 256
	defaultTimeout = 30 * time.Second
)

// Options configure a Service. Nil fields take defaults.
type Options struct {
	// Store keeps states, client registrations and tokens (encrypted).
	Store *store.Store
	// Key is the 32-byte AES-256-GCM key tokens are encrypted under (see
	// KeyFromSecretKey); it is not used directly but through a key derived
	// for this package, so its ciphertexts never mix with the secret
	// store's.
	Key []byte
	// KeyID is stored beside every ciphertext so a later key change is
	// recognised; empty: a fingerprint of the derived key.
	KeyID string
	// PublicURL is where browsers reach patchbay (scheme, host, optional
	// path): the redirect URI is PublicURL+CallbackPath.
	PublicURL string
	// ClientMetadataURL is the client_id patchbay uses with authorization
	// servers that accept Client ID Metadata Documents; it must serve
	// ClientMetadata(). Empty: PublicURL+ClientMetadataPath. It is used only
	// when it is https.
	ClientMetadataURL string
	// HTTPClient sends discovery, registration, token and revocation
	// requests. Nil: a client with a 30 s timeout.
	HTTPClient *http.Client
	// Redactor learns every access token, refresh token and client secret
	// the service handles, so they are scrubbed from outputs and logs.
	Redactor interface{ Add(values ...string) }
	// Logger: nil is slog.Default().
	Logger *slog.Logger
	// Now: nil is time.Now.
	Now func() time.Time
}

// Connection is one connection that signs in with OAuth.
type Connection struct {
	Name string
	// ResourceURL is the MCP server's URL.
	ResourceURL string
	// ClientID and ClientSecret are a pre-registered client (optional).
	ClientID, ClientSecret string
	// ClientIssuer, when set, is the authorization server the
	// pre-registered client belongs to; at any other server patchbay
	// identifies itself as it would without one (credentials are never
	// presented to a server that did not issue them).
	ClientIssuer string
	// Scopes asked for; empty: the scope of the server's challenge, else
	// its scopes_supported (offline_access added when the authorization
	// server offers it).
	Scopes []string
	// PerUser keeps a token per principal; false keeps one shared token
	// under SharedPrincipal.
	PerUser bool
	// Issuer, when set, is the authorization server itself: discovery
	// reads its metadata directly instead of the resource's challenge and
	// RFC 9728 metadata, for APIs that publish none (Google's). Its
	// metadata is checked as any other (issuer, S256, https endpoints).
	Issuer string
	// AuthParams are added to the authorization request (Google issues a
	// refresh token only with access_type=offline).
	AuthParams map[string]string
}

// Account says who is signed in to a connection. It never holds a token.
type Account struct {
	Principal  string    `json:"principal"`
	Scopes     []string  `json:"scopes,omitempty"`
	ExpiresAt  time.Time `json:"expiresAt,omitzero"`
	SignedInAt time.Time `json:"signedInAt"`
}

// Errors of the service besides *FlowError.
var (
	// ErrUnknownConnection: the connection is not registered for OAuth.
	ErrUnknownConnection = errors.New("oauth: connection is not registered for OAuth")
	// ErrNotSignedIn: nobody (or not this principal) is signed in.
	ErrNotSignedIn = errors.New("oauth: not signed in")
	// ErrInsufficientScope: the server refuses for lack of a scope the
	// token already has, so signing in again would not help.
	ErrInsufficientScope = errors.New("oauth: the server wants a scope the token already has; signing in again would not help")
)

// FlowError kinds.
const (
	KindDenied       = "denied"
	KindState        = "state"
	KindIssuer       = "issuer"
	KindExchange     = "exchange"
	KindDiscovery    = "discovery"
	KindRegistration = "registration"
)

// FlowError is a sign-in that cannot go on, as Begin and Complete return
// it: Kind for code, Message for people (what happened and what to do). It
// never quotes a token or secret.
type FlowError struct {
	Kind    string
	Message string
}

func (e *FlowError) Error() string { return "oauth sign-in (" + e.Kind + "): " + e.Message }

func flowErr(kind, format string, args ...any) *FlowError {
	return &FlowError{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// Service runs OAuth sign-ins and hands out tokens. It is safe for
// concurrent use, and several replicas may share one Store.
type Service struct {
	store       *store.Store
	box         *seal.Box
	publicURL   string
	redirectURI string
	metadataURL string
	http        *http.Client
	redactor    interface{ Add(values ...string) }
	log         *slog.Logger
	now         func() time.Time

	mu    sync.RWMutex
	conns map[string]Connection
}

// New checks o and returns a Service.
func New(o Options) (*Service, error) {
	if o.Store == nil {
		return nil, errors.New("oauth: Options.Store is required")
	}
	box, err := newBox(o.Key, o.KeyID)
	if err != nil {
		return nil, err
	}
	pub, err := url.Parse(o.PublicURL)
	if err != nil || (pub.Scheme != "http" && pub.Scheme != "https") || pub.Host == "" || pub.RawQuery != "" || pub.Fragment != "" || pub.User != nil {
		return nil, errors.New("oauth: Options.PublicURL must be an absolute http or https URL without query, fragment or credentials")
	}
	base := strings.TrimSuffix(o.PublicURL, "/")
	s := &Service{
		store:       o.Store,
		box:         box,
		publicURL:   base,
		redirectURI: base + CallbackPath,
		metadataURL: o.ClientMetadataURL,
		http:        o.HTTPClient,
		redactor:    o.Redactor,
		log:         o.Logger,
		now:         o.Now,
		conns:       map[string]Connection{},
	}
	if s.metadataURL == "" {
		s.metadataURL = base + ClientMetadataPath
	}
	if s.http == nil {
		s.http = &http.Client{Timeout: defaultTimeout}
	}
	if s.redactor == nil {
		s.redactor = secrets.NewSecretRedactor()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// Register adds (or replaces) a connection that signs in with OAuth. Its
// client secret is registered for redaction at once.
func (s *Service) Register(c Connection) {
	s.mu.Lock()
	s.conns[c.Name] = c
	s.mu.Unlock()
	s.redactor.Add(c.ClientSecret)
}

// RedirectURI is where authorization servers send the browser back to.
func (s *Service) RedirectURI() string { return s.redirectURI }

// Registered reports whether the connection is registered for OAuth, and
// whether it keeps a token per user.
func (s *Service) Registered(connection string) (registered, perUser bool) {
	c, ok := s.connection(connection)
	return ok, c.PerUser
}

func (s *Service) connection(name string) (Connection, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	c, ok := s.conns[name]
	return c, ok
}

func (s *Service) mustConnection(name string) (Connection, error) {
	c, ok := s.connection(name)
	if !ok {
		return Connection{}, fmt.Errorf("%w: %q", ErrUnknownConnection, name)
	}
	return c, nil
}

// principalKey is whose token a call for principal uses: its own on a
// per-user connection, the shared one otherwise.
func principalKey(c Connection, principal string) (string, error) {
	if !c.PerUser {
		return SharedPrincipal, nil
	}
	if principal == "" {
		return "", fmt.Errorf("oauth: %s keeps a token per user and the call has no principal: %w", c.Name, connect.ErrNeedsSignIn)
	}
	if len(principal) > maxPrincipal || strings.IndexFunc(principal, unicode.IsControl) >= 0 {
		return "", fmt.Errorf("oauth: principal is longer than %d bytes or holds control characters", maxPrincipal)
	}
	return principal, nil
}

// needsSignIn wraps connect.ErrNeedsSignIn with what is missing.
func needsSignIn(connection, principal, why string) error {
	return fmt.Errorf("oauth: %s (principal %q): %s: %w", connection, principal, why, connect.ErrNeedsSignIn)
}

// withClient is ctx with the client of token requests: the code and the
// client's secret go to the token endpoint's origin only, and its POST is
// never redirected (see credhttp).
func (s *Service) withClient(ctx context.Context) context.Context {
	return context.WithValue(ctx, oauth2.HTTPClient, credhttp.Client(s.http, credhttp.FollowSameOrigin))
}
