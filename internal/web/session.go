package web

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/store"
)

// Cookie names. The session cookie is sent to /admin and to the OAuth
// sign-in routes (/oauth/...), which need to know who signs in; the JSON
// API under /v1 never reads it (it takes bearer keys only).
const (
	sessionCookie = "pb_admin"
	// preCSRFCookie carries the double-submit token of the sign-in form,
	// which has no session yet.
	preCSRFCookie = "pb_admin_signin"
	csrfField     = "_csrf"
	csrfHeader    = "X-CSRF-Token"
)

// Session is one signed-in person. Method and Subject say how and as
// whom they signed in: "token" and "admin" for the operator, "api-key"
// and the key's name for a user (who may only sign in to per-user
// connections for themselves); an OIDC sign-in would
// record "oidc" and the ID token's subject (and Email), and everything
// downstream (who approved, who changed an allowlist) reads Subject only.
type Session struct {
	Subject   string    `json:"subject"`
	Method    string    `json:"method"`
	Email     string    `json:"email,omitempty"`
	CSRF      string    `json:"csrf"`
	CreatedAt time.Time `json:"createdAt"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// sessions keeps sessions in Redis under the store's prefix, keyed by the
// SHA-256 of the cookie value, so reading Redis does not yield a cookie
// that signs anyone in. Any replica can read any session.
type sessions struct {
	store *store.Store
	ttl   time.Duration
}

func (s *sessions) key(id string) string {
	sum := sha256.Sum256([]byte(id))
	return s.store.Key("admin", "session", hex.EncodeToString(sum[:]))
}

// ErrNoSession: the cookie is missing, unknown or expired.
var ErrNoSession = errors.New("web: no session")

// create stores a new session and returns its cookie value.
func (s *sessions) create(ctx context.Context, subject, method string) (string, *Session, error) {
	id := randomToken()
	now := time.Now().UTC()
	sess := &Session{Subject: subject, Method: method, CSRF: randomToken(), CreatedAt: now, ExpiresAt: now.Add(s.ttl)}
	data, err := json.Marshal(sess)
	if err != nil {
		return "", nil, err
	}
	if err := s.store.Client.Set(ctx, s.key(id), data, s.ttl).Err(); err != nil {
		return "", nil, fmt.Errorf("web: store session: %w", err)
	}
	return id, sess, nil
}

func (s *sessions) get(ctx context.Context, id string) (*Session, error) {
	if id == "" {
		return nil, ErrNoSession
	}
	data, err := s.store.Client.Get(ctx, s.key(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, ErrNoSession
	}
	if err != nil {
		return nil, fmt.Errorf("web: read session: %w", err)
	}
	var sess Session
	if err := json.Unmarshal(data, &sess); err != nil || time.Now().After(sess.ExpiresAt) {
		return nil, ErrNoSession
	}
	return &sess, nil
}

func (s *sessions) delete(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	return s.store.Client.Del(ctx, s.key(id)).Err()
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tokenMatches compares a presented admin token with the configured one
// by digest, in constant time whatever their lengths.
func tokenMatches(presented string, want [32]byte) bool {
	sum := sha256.Sum256([]byte(presented))
	return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
}

func secureRequest(c echo.Context) bool { return c.Scheme() == "https" }

func setCookie(c echo.Context, name, value string, maxAge int) {
	path := "/admin"
	if name == sessionCookie {
		path = "/"
	}
	c.SetCookie(&http.Cookie{
		Name: name, Value: value, Path: path, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: secureRequest(c),
	})
}

// presentedCSRF is the token a state-changing request carries: the form
// field of a plain form post, or the header htmx sends.
func presentedCSRF(c echo.Context) string {
	if v := c.Request().Header.Get(csrfHeader); v != "" {
		return v
	}
	return c.FormValue(csrfField)
}

func csrfEqual(a, b string) bool {
	return a != "" && b != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

const sessionKey = "admin-session"

// Session methods.
const (
	methodToken  = "token"   // the admin token: an operator
	methodAPIKey = "api-key" // an API key: a user, who signs in to per-user connections
)

// Operator reports whether the session may use the whole admin UI.
func (s *Session) Operator() bool { return s.Method != methodAPIKey }

func sessionOf(c echo.Context) *Session {
	s, _ := c.Get(sessionKey).(*Session)
	return s
}

// requireSession admits signed-in operators. A page request without a
// session is sent to the sign-in page; an htmx request gets HX-Redirect.
// Every state-changing request must carry the session's CSRF token (and
// must not be cross-site by Sec-Fetch-Site), or it is refused with 403.
func (h *handler) requireSession(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		var id string
		if ck, err := c.Cookie(sessionCookie); err == nil {
			id = ck.Value
		}
		sess, err := h.sessions.get(c.Request().Context(), id)
		if errors.Is(err, ErrNoSession) {
			if !safeMethod(c.Request().Method) {
				return h.forbidden(c, "You are not signed in, or your session expired. Sign in and try again.")
			}
			target := "/admin/sign-in?next=" + urlQueryEscape(c.Request().URL.RequestURI())
			if c.Request().Header.Get("HX-Request") == "true" {
				c.Response().Header().Set("HX-Redirect", target)
				return c.NoContent(http.StatusUnauthorized)
			}
			return c.Redirect(http.StatusSeeOther, target)
		}
		if err != nil {
			return err
		}
		if !safeMethod(c.Request().Method) {
			if c.Request().Header.Get("Sec-Fetch-Site") == "cross-site" || !csrfEqual(presentedCSRF(c), sess.CSRF) {
				return h.forbidden(c, "This form is missing its security token or it does not match your session. Reload the page and try again.")
			}
		}
		c.Set(sessionKey, sess)
		c.Set(sessionIDKey, id)
		return next(c)
	}
}

const sessionIDKey = "admin-session-id"
