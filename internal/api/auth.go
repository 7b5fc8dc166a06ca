package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/throttle"
)

// Key is one accepted API key: its SHA-256 digest and the principal it
// names (its roles and the allowlist bounding what its documents may use).
type Key struct {
	SHA256 [32]byte
	authz.Principal
}

const principalKey = "principal"

// principal is who the request was authenticated as.
func principal(c echo.Context) authz.Principal {
	k, _ := c.Get(principalKey).(Key)
	return k.Principal
}

// codeForbidden: the key is known but lacks the role or grant the route
// needs. Resources another key owns answer 404 instead, so that their
// existence is not disclosed.
const codeForbidden = "FORBIDDEN"

// need admits keys holding role r; others get 403.
func need(r authz.Role) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if !principal(c).Has(r) {
				return forbidden("this API key lacks the %s role", r)
			}
			return next(c)
		}
	}
}

func forbidden(format string, args ...any) *Problem {
	return problem(http.StatusForbidden, codeForbidden, fmt.Sprintf(format, args...))
}

// codeRateLimited: too many wrong API keys came from the client's address;
// every attempt from it is refused until Retry-After has passed.
const codeRateLimited = "RATE_LIMITED"

// guard counts wrong API keys per client address (see package throttle);
// a nil limiter counts nothing.
type guard struct {
	limiter *throttle.Limiter
	proxies throttle.Proxies
	logger  *slog.Logger
}

// requireAPIKey admits requests bearing one of keys. Every digest is
// compared in constant time, and all of them are always compared, so timing
// says nothing about which key came close. An address that has sent too
// many wrong keys is refused with 429 before its key is looked at, so that
// while it is blocked a guess tells it nothing; other addresses are not
// affected.
func requireAPIKey(keys []Key, g guard) echo.MiddlewareFunc {
	return requireCaller(keys, nil, g)
}

// TokenVerifier checks an OAuth access token from the configured issuer
// and names the principal it stands for; see package bearer.
type TokenVerifier interface {
	// Accepts reports whether token has a form the verifier checks (a
	// JWT; any token where it introspects), so that a mistyped API key
	// is not sent to the issuer.
	Accepts(token string) bool
	// Verify returns the token's principal, or why it was refused. An
	// error with an Unavailable method reporting true says the token
	// could not be checked at all (the issuer did not answer): the
	// request is 503, and not counted as a wrong credential.
	Verify(ctx context.Context, token string) (authz.Principal, error)
	// Challenge is the WWW-Authenticate of a 401: it points the client at
	// the Protected Resource Metadata (RFC 9728), where it learns which
	// authorization server issues the tokens.
	Challenge() string
}

// codeTokenUnverifiable: an access token could not be checked because the
// authorization server (its keys or its introspection endpoint) did not
// answer; a retry may succeed.
const codeTokenUnverifiable = "TOKEN_UNVERIFIABLE"

// requireCaller admits an API key, or where tokens is not nil an access
// token that tokens accepts. API keys are matched first; a bearer that is
// no key goes to tokens when it has a form tokens checks. A wrong token
// counts against the address as a wrong key does. The token is checked
// before the limiter is asked (checking may fetch the issuer's keys or
// ask its introspection endpoint, and the limiter holds one lock for
// every address); the limiter then refuses an address blocked meanwhile
// without saying whether the credential was right.
func requireCaller(keys []Key, tokens TokenVerifier, g guard) echo.MiddlewareFunc {
	unauthenticated := func(detail string) *Problem {
		p := problem(http.StatusUnauthorized, codeUnauthenticated, detail)
		if tokens != nil {
			p.challenge = tokens.Challenge()
		}
		return p
	}
	missing, wrong := "an API key is required: Authorization: Bearer <key>", "the API key is not valid"
	if tokens != nil {
		missing, wrong = "an API key or OAuth access token is required: Authorization: Bearer <key or token>", "the API key or access token is not valid"
	}
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			addr := g.proxies.Key(c.Request())
			if d := g.limiter.Blocked(addr); d > 0 {
				return rateLimited(d)
			}
			token, ok := bearer(c.Request().Header.Get(echo.HeaderAuthorization))
			if !ok {
				// No key is no guess: not counted.
				return unauthenticated(missing)
			}
			found, ok := matchKey(keys, token)
			if !ok && tokens != nil && tokens.Accepts(token) {
				p, err := tokens.Verify(c.Request().Context(), token)
				var u interface{ Unavailable() bool }
				switch {
				case err == nil:
					found, ok = Key{Principal: p}, true
				case errors.As(err, &u) && u.Unavailable():
					g.logger.Warn("access token not checked: the authorization server did not answer", "client", addr, "err", err)
					p := problem(http.StatusServiceUnavailable, codeTokenUnverifiable, "the access token could not be checked: the authorization server did not answer; retry later")
					p.retryAfter = retryDefault
					return p
				default:
					g.logger.Info("access token refused", "client", addr, "err", err)
				}
			}
			res := g.limiter.Attempt(addr, func() bool { return ok })
			if res.Refused > 0 {
				return rateLimited(res.Refused)
			}
			if res.Blocks > 0 {
				g.logger.Warn("wrong API keys: address blocked", "client", addr, "for", res.Blocks)
			}
			if !res.OK {
				return unauthenticated(wrong)
			}
			c.Set(principalKey, found)
			return next(c)
		}
	}
}

// matchKey finds the key whose digest is token's, comparing every digest
// in constant time.
func matchKey(keys []Key, token string) (Key, bool) {
	var found Key
	sum := sha256.Sum256([]byte(token))
	match := 0
	for _, k := range keys {
		eq := subtle.ConstantTimeCompare(sum[:], k.SHA256[:])
		if eq == 1 {
			found = k
		}
		match |= eq
	}
	return found, match == 1
}

// rateLimited is the 429 of a blocked address.
func rateLimited(d time.Duration) *Problem {
	s := throttle.RetryAfter(d)
	p := problem(http.StatusTooManyRequests, codeRateLimited,
		fmt.Sprintf("too many wrong API keys from this address; retry after %d seconds", s))
	p.retryAfter = s
	return p
}

func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}
