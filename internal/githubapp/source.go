package githubapp

import (
	"context"
	"crypto/rsa"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
	"github.com/patchbay-dev/patchbay/internal/seal"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// DefaultAPIBaseURL is github.com's REST API.
const DefaultAPIBaseURL = "https://api.github.com"

const (
	defaultTimeout   = 30 * time.Second
	defaultUserAgent = "patchbay"
	// sealPurpose and sealLabel give this package's ciphertexts a key and
	// additional data of their own (see package seal).
	sealPurpose = "patchbay github app tokens v1"
	sealLabel   = "patchbay githubapp\x00"
)

// Options configure a Source.
type Options struct {
	// AppID is the App's id (or client id): the App JWT's iss.
	AppID string
	// PrivateKey is the App's private key in any form ParsePrivateKey
	// reads. It is only parsed, never stored or shown.
	PrivateKey string
	// APIBaseURL is the REST API root: DefaultAPIBaseURL when empty,
	// https://<host>/api/v3 for GitHub Enterprise Server.
	APIBaseURL string
	// UserAgent is sent on every request GitHub sees ("patchbay" when
	// empty; GitHub refuses requests without one).
	UserAgent string
	// HTTPClient talks to GitHub (a 30-second-timeout client when nil);
	// its redirects follow credhttp.FollowSameOrigin.
	HTTPClient *http.Client
	// Store holds the token cache and the exchange lock (required).
	Store *store.Store
	// Key is the 32-byte key tokens are encrypted under in Redis
	// (PATCHBAY_SECRET_KEY's current key); KeyID names it (derived from
	// the key when empty).
	Key   []byte
	KeyID string
	// Redactor learns the private key, and every installation token and
	// App JWT this Source mints or reads back from the cache (required;
	// the harness's *SecretRedactor fits).
	Redactor interface{ Add(values ...string) }
	// Now is the clock (time.Now when nil); tests move it.
	Now func() time.Time
}

// Source mints and caches installation tokens for one GitHub App on one
// GitHub. It is safe for concurrent use; replicas sharing a Store share
// its cache and its exchanges.
type Source struct {
	appID     string
	key       *rsa.PrivateKey
	apiBase   string
	userAgent string
	http      *http.Client
	store     *store.Store
	box       *seal.Box
	redactor  interface{ Add(values ...string) }
	now       func() time.Time
	flights   singleflight.Group
}

// New checks o, parses the key and returns a Source. A key that does not
// parse is an invalid_key Error.
func New(o Options) (*Source, error) {
	if strings.TrimSpace(o.AppID) == "" {
		return nil, errorf(InvalidRequest, "appId is required")
	}
	if o.Store == nil || o.Redactor == nil {
		return nil, errors.New("githubapp: Options.Store and Options.Redactor are required")
	}
	// The key is a secret too, in the form it was given.
	o.Redactor.Add(o.PrivateKey)
	key, err := ParsePrivateKey(o.PrivateKey)
	if err != nil {
		return nil, err
	}
	base, err := apiBase(o.APIBaseURL)
	if err != nil {
		return nil, err
	}
	box, err := seal.New(o.Key, o.KeyID, sealPurpose, sealLabel)
	if err != nil {
		return nil, errors.New("githubapp: Options.Key: " + err.Error() + " (PATCHBAY_SECRET_KEY is required for GitHub App tokens)")
	}
	s := &Source{
		appID: strings.TrimSpace(o.AppID), key: key, apiBase: base, userAgent: o.UserAgent,
		http: o.HTTPClient, store: o.Store, box: box, redactor: o.Redactor, now: o.Now,
	}
	if s.userAgent == "" {
		s.userAgent = defaultUserAgent
	}
	if s.http == nil {
		s.http = &http.Client{Timeout: defaultTimeout}
	}
	// The App JWT goes to the API's origin only: a redirect elsewhere,
	// or of the exchange's POST, is not followed.
	s.http = credhttp.Client(s.http, credhttp.FollowSameOrigin)
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// apiBase checks the configured API root and drops a trailing slash.
func apiBase(v string) (string, error) {
	if v == "" {
		return DefaultAPIBaseURL, nil
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", errorf(InvalidRequest, "apiBaseUrl must be an absolute http(s) URL without credentials, query or fragment")
	}
	return strings.TrimRight(v, "/"), nil
}

// APIBaseURL is the REST API root tokens are minted at (and good for).
func (s *Source) APIBaseURL() string { return s.apiBase }

// Token returns an installation token for the scope: from the cache while
// it has more than RefreshBefore left, else from one exchange that every
// concurrent caller of every replica for the same scope shares. The token
// is registered with the redactor before it is returned.
func (s *Source) Token(ctx context.Context, scope Scope) (string, error) {
	sc, err := scope.normalize()
	if err != nil {
		return "", err
	}
	id := sc.cacheID(s.apiBase, s.appID)
	if tok, ok, err := s.cached(ctx, id); err != nil || ok {
		return tok, err
	}
	// The flight outlives a caller that gives up, so the others are not
	// cancelled with it; it is bounded by a wait for another replica's
	// exchange and one of its own.
	ch := s.flights.DoChan(id, func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*lockTTL)
		defer cancel()
		return s.mint(fctx, sc, id)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return "", r.Err
		}
		return r.Val.(string), nil
	case <-ctx.Done():
		return "", &Error{Code: Network, Message: "waiting for an installation token", Err: ctx.Err()}
	}
}

// Invalidate drops the cached token for the scope if it is still
// rejected (the one GitHub answered 401 to), so the next Token mints a
// fresh one. A token another replica has already replaced stays.
func (s *Source) Invalidate(ctx context.Context, scope Scope, rejected string) error {
	sc, err := scope.normalize()
	if err != nil {
		return err
	}
	return s.drop(ctx, sc.cacheID(s.apiBase, s.appID), rejected)
}

// Do calls fn with a token for the scope; when fn reports that GitHub
// answered 401 (the token was revoked before its expiry), the token is
// invalidated and fn is called once more with a fresh one. It returns
// fn's last status and error.
func (s *Source) Do(ctx context.Context, scope Scope, fn func(token string) (status int, err error)) (int, error) {
	tok, err := s.Token(ctx, scope)
	if err != nil {
		return 0, err
	}
	status, err := fn(tok)
	if status != http.StatusUnauthorized {
		return status, err
	}
	if err := s.Invalidate(ctx, scope, tok); err != nil {
		return status, err
	}
	if tok, err = s.Token(ctx, scope); err != nil {
		return 0, err
	}
	return fn(tok)
}
