// Package web is patchbay's admin UI: templ components rendered by echo
// handlers under /admin, with htmx (vendored, embedded from web/static)
// for live and partial updates. Every page works without JavaScript:
// forms post, and the handler redirects back (POST/redirect/GET).
//
// Operators sign in with the admin token (PATCHBAY_ADMIN_TOKEN) and get a
// session kept in Redis (any replica serves it) behind an HttpOnly,
// SameSite=Lax cookie, Secure under https. The cookie's path is / rather
// than /admin because the OAuth sign-in routes (/oauth/{connection}/start
// and /oauth/callback, routes fixed by the design) must know who signs in; the JSON
// API never reads cookies. Beside them, the public Client ID Metadata
// Document (/oauth/client-metadata.json) is served here too, so that every
// route outside the JSON API is in this package's authorization matrix. A user may sign in with their API key instead:
// such a session has the key's roles (package authz) and sees what they
// allow, as the API does — their own executions and approvals with run,
// everything with read, the approvals they may decide with approve,
// allowlists and dead letters to change with admin. The live MCP clients
// of this process (/admin/mcp) are scoped as executions are: one's own
// principal's with run, everyone's with read. The connection pages
// are open to every session, so that each user can connect their own
// account to a per-user OAuth connection (see signin.go). Sessions
// record how and as whom the operator signed in (Session.Method and
// Subject) so an OIDC sign-in can be added beside the token without
// touching the pages. Every state-changing request carries the session's
// CSRF token (a hidden form field, or the X-CSRF-Token header htmx sends),
// compared in constant time; without it the request is refused with 403.
// Failed sign-ins are counted per client address (package throttle): past
// a few, the address is shown the sign-in page with 429 and Retry-After
// until its backoff lifts, whatever token it sends. The live streams (an
// execution's events, the pending approvals) count against the caps on
// open streams the server shares with the API (package eventstream).
//
// The UI changes nothing itself: allowlists are parsed with
// gates.ParseAllowlist and saved through gates.Allowlists, decisions
// go through gates.Approvals.Decide, cancel and resume through
// harness.Executions, redelivery through triggers.Service — the same
// calls, and so the same validation messages, as the JSON API. Values
// shown come from the harness already redacted; the UI shows no secret,
// API key or token.
package web

//go:generate go tool templ generate

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/eventstream"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/oauth"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/throttle"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/web/static"
)

// Options wire the admin UI to the rest of patchbay.
type Options struct {
	// AdminToken signs operators in. Required: the server generates one
	// when PATCHBAY_ADMIN_TOKEN is unset, so the UI is never open.
	AdminToken string
	// Store keeps the sessions (under its key prefix).
	Store      *store.Store
	Executions *harness.Executions
	Registry   *registry.Registry
	Allowlists *gates.Allowlists
	// Triggers supplies trigger and inbox figures, webhook deliveries and
	// dead letters; nil hides those parts.
	Triggers *triggers.Service
	// SessionTTL is how long a session lasts after sign-in. Default 12h.
	SessionTTL time.Duration
	// PollInterval is how often the live approvals stream looks for
	// changes. Default 1s.
	PollInterval time.Duration
	Logger       *slog.Logger
	// SignIns runs OAuth sign-ins to remote servers (/oauth/...); nil
	// leaves those routes out.
	SignIns SignIns
	// Users are the API keys that may sign in as themselves, to connect
	// their own accounts to per-user connections. Their sessions see the
	// overview and connection pages only.
	Users []User
	// Throttle counts failed sign-ins per client address and refuses an
	// address that makes too many (429) until its backoff lifts; nil
	// counts nothing. The server shares one with the API's key check, so
	// guesses on either count together.
	Throttle *throttle.Limiter
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client; without them the client is the TCP peer.
	TrustedProxies throttle.Proxies
	// TraceURL links an execution's page to its trace: {traceId} is
	// replaced by the execution's trace id. Empty: the id is shown
	// without a link.
	TraceURL string
	// Streams serves the live execution page's event stream and caps the
	// live streams (that one and the approvals list) per principal and
	// per process; nil: a Streams of its own with the defaults. The
	// server shares one with the API, so streams on either count
	// together.
	Streams *eventstream.Streams
	// MCP lists the live clients of this process's MCP face for the MCP
	// clients page (/admin/mcp); nil: the page says /mcp is not served.
	MCP MCPSessions
}

// User is an API key that may sign in to the UI as its principal. Its
// session has the key's roles (see package authz), looked up on every
// request, so a change of roles or a removed key takes effect at once.
type User struct {
	SHA256 [32]byte
	authz.Principal
}

// ErrNoAdminToken is returned by Mount without Options.AdminToken.
var ErrNoAdminToken = errors.New("web: an admin token is required")

type handler struct {
	Options
	token    [32]byte
	sessions *sessions
}

// Mount adds the admin UI's routes under /admin to e.
func Mount(e *echo.Echo, o Options) error {
	if o.AdminToken == "" {
		return ErrNoAdminToken
	}
	if o.Store == nil || o.Executions == nil || o.Registry == nil || o.Allowlists == nil {
		return errors.New("web: Store, Executions, Registry and Allowlists are required")
	}
	if o.SessionTTL <= 0 {
		o.SessionTTL = 12 * time.Hour
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Streams == nil {
		o.Streams = eventstream.New(o.Executions, nil)
	}
	h := &handler{Options: o, token: sha256.Sum256([]byte(o.AdminToken)), sessions: &sessions{store: o.Store, ttl: o.SessionTTL}}

	assets, _ := fs.Sub(static.FS, ".")
	fileServer := http.StripPrefix("/admin/static/", http.FileServerFS(assets))
	e.GET("/admin/static/*", echo.WrapHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		fileServer.ServeHTTP(w, r)
	})))
	e.GET("/admin/sign-in", h.wrap(h.signInPage))
	e.POST("/admin/sign-in", h.wrap(h.signIn))

	// Each page says who may use it: anyone signed in (the operator, or
	// a user with an API key, who sees only their own work), or a role.
	// The operator (admin token) holds every role.
	anyone := func(f func(echo.Context) error) echo.HandlerFunc { return h.wrap(h.requireSession(f)) }
	need := func(r authz.Role, f func(echo.Context) error) echo.HandlerFunc {
		return h.wrap(h.requireSession(h.requireRole(r, f)))
	}
	e.GET("/admin", anyone(h.overview))
	e.GET("/admin/", anyone(h.overview))
	e.POST("/admin/sign-out", anyone(h.signOut))
	e.GET("/admin/connections/:name", anyone(h.connection))
	if o.SignIns != nil {
		e.GET(oauth.ClientMetadataPath, h.clientMetadata) // public
		e.GET("/oauth/:name/start", anyone(h.startSignIn))
		e.GET("/oauth/callback", anyone(h.finishSignIn))
		e.POST("/admin/connections/:name/disconnect", anyone(h.disconnect))
	}
	e.GET("/admin/allowlists", need(authz.Read, h.allowlists))
	e.GET("/admin/allowlists/new", need(authz.Admin, h.newAllowlist))
	e.POST("/admin/allowlists", need(authz.Admin, h.createAllowlist))
	e.GET("/admin/allowlists/:name", need(authz.Read, h.editAllowlist))
	e.POST("/admin/allowlists/:name", need(authz.Admin, h.saveAllowlist))
	e.GET("/admin/allowlists/:name/delete", need(authz.Admin, h.confirmDeleteAllowlist))
	e.POST("/admin/allowlists/:name/delete", need(authz.Admin, h.deleteAllowlist))
	// Approvals: each person sees those their own runs asked for and
	// those they may decide (all of them with read); deciding is checked
	// by gates.Approvals.DecideAs.
	e.GET("/admin/approvals", anyone(h.approvals))
	e.GET("/admin/approvals/pending", anyone(h.pendingFragment))
	e.GET("/admin/approvals/stream", anyone(h.approvalsStream))
	e.POST("/admin/approvals/:id/approve", anyone(h.approve))
	e.POST("/admin/approvals/:id/deny", anyone(h.deny))
	// Questions servers ask mid-call: seen and answered as approvals are
	// (their own runs' questions, those they may answer, all with read);
	// answering is checked by gates.Questions.
	e.GET("/admin/questions", anyone(h.questions))
	e.GET("/admin/questions/pending", anyone(h.questionsFragment))
	e.GET("/admin/questions/stream", anyone(h.questionsStream))
	e.POST("/admin/questions/:id/answer", anyone(h.answerQuestion))
	e.POST("/admin/questions/:id/decline", anyone(h.declineQuestion))
	e.POST("/admin/questions/:id/cancel", anyone(h.cancelQuestion))
	// Executions: one's own, or all with read; changing one takes its
	// owner (with run) or admin.
	e.GET("/admin/executions", anyone(h.executions))
	e.GET("/admin/executions/:id", anyone(h.execution))
	e.GET("/admin/executions/:id/body", anyone(h.executionBody))
	e.GET("/admin/executions/:id/stream", anyone(h.executionStream))
	e.POST("/admin/executions/:id/cancel", anyone(h.cancel))
	e.POST("/admin/executions/:id/resume", anyone(h.resume))
	// MCP clients: one's own principal's, or all with read.
	e.GET("/admin/mcp", anyone(h.mcpSessions))
	e.GET("/admin/deadletters", need(authz.Read, h.deadLetters))
	e.POST("/admin/deadletters/:id/redeliver", need(authz.Admin, h.redeliver))
	return nil
}

// wrap renders any error a handler returns as an HTML page here, so the
// API's problem+json error handler never answers an admin page.
func (h *handler) wrap(f echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		c.Response().Header().Set("X-Frame-Options", "DENY")
		c.Response().Header().Set("X-Content-Type-Options", "nosniff")
		c.Response().Header().Set("Referrer-Policy", "same-origin")
		c.Response().Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
		err := f(c)
		if err == nil || c.Response().Committed {
			if err != nil {
				h.Logger.Warn("admin request failed after the response started", "path", c.Request().URL.Path, "err", err)
			}
			return nil
		}
		var nf *notFound
		if errors.As(err, &nf) {
			return h.render(c, http.StatusNotFound, errorPage(h.page(c, "Not found", ""), nf.what))
		}
		var rf *refused
		if errors.As(err, &rf) {
			return h.forbidden(c, rf.why)
		}
		var le *eventstream.LimitError
		if errors.As(err, &le) {
			// A live part of a page (its EventSource retries later).
			c.Response().Header().Set("Retry-After", strconv.Itoa(int(eventstream.RetryAfter/time.Second)))
			return h.render(c, http.StatusTooManyRequests, errorPage(h.page(c, "Too many live pages", ""), le.Error()))
		}
		var he *echo.HTTPError
		if errors.As(err, &he) && he.Code < 500 {
			return h.render(c, he.Code, errorPage(h.page(c, http.StatusText(he.Code), ""), http.StatusText(he.Code)))
		}
		if store.Unavailable(err) {
			// Not a bug: Redis is restarting or failing over. Say so, and
			// when to reload, as the API does.
			h.Logger.Warn("admin request refused: Redis is unavailable", "path", c.Request().URL.Path, "err", err)
			c.Response().Header().Set("Retry-After", "2")
			return h.render(c, http.StatusServiceUnavailable, errorPage(h.page(c, "Temporarily unavailable", ""), "The store (Redis) cannot be reached right now. Reload the page in a few seconds."))
		}
		h.Logger.Error("admin request failed", "path", c.Request().URL.Path, "err", err)
		return h.render(c, http.StatusInternalServerError, errorPage(h.page(c, "Something went wrong", ""), "The server could not complete this request; the details are in the server log."))
	}
}

type notFound struct{ what string }

func (n *notFound) Error() string { return n.what }

// refused is a request this session may not make, shown as a 403 page.
type refused struct{ why string }

func (r *refused) Error() string { return r.why }

func (h *handler) forbidden(c echo.Context, msg string) error {
	return h.render(c, http.StatusForbidden, errorPage(h.page(c, "Forbidden", ""), msg))
}

// render writes a component as an HTML response: the one way pages leave.
func (h *handler) render(c echo.Context, status int, comp templ.Component) error {
	c.Response().Header().Set(echo.HeaderContentType, echo.MIMETextHTMLCharsetUTF8)
	c.Response().Header().Set("Cache-Control", "no-store")
	c.Response().WriteHeader(status)
	return comp.Render(c.Request().Context(), c.Response())
}

// page is what the layout needs of every page.
type page struct {
	Title   string
	Nav     string
	CSRF    string
	Subject string
	// Operator: the admin token's session; false for a user signed in
	// with an API key.
	Operator bool
	// Who is the session's principal, whose roles decide what the
	// navigation offers.
	Who   authz.Principal
	Flash string
	Bad   bool
}

func (h *handler) page(c echo.Context, title, nav string) page {
	p := page{Title: title, Nav: nav}
	if s := sessionOf(c); s != nil {
		p.CSRF, p.Subject, p.Operator = s.CSRF, s.Subject, s.Operator()
		p.Who = h.principal(c)
	}
	if msg, ok := flashes[c.QueryParam("flash")]; ok {
		p.Flash = msg
	}
	if msg, ok := badFlashes[c.QueryParam("flash")]; ok {
		p.Flash, p.Bad = msg, true
	}
	return p
}

// Flash messages are chosen by key, so nothing from the query string is
// echoed into a page.
var flashes = map[string]string{
	"approved":    "Approved. The execution continues.",
	"denied":      "Denied. The step fails with steering_denied.",
	"saved":       "Allowlist saved.",
	"created":     "Allowlist created.",
	"deleted":     "Allowlist deleted.",
	"cancelled":   "Cancellation requested.",
	"resumed":     "Execution resumed.",
	"redelivered": "Dead letter put back in its inbox.",
	"signed-in":   "Signed in. The connection uses this account from now on.",
	"signed-out":  "Disconnected. The tokens were revoked where the server supports it, and deleted.",
}

var badFlashes = map[string]string{
	"decided":       "That approval was already decided by someone else.",
	"gone":          "That item no longer exists.",
	"not-resumable": "That execution cannot be resumed now (it is running, or finished).",
	"self":          "You asked for that call, so someone else must decide it.",
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// safeNext keeps a post-sign-in redirect inside /admin, or on an OAuth
// sign-in's start page (a Connect link followed before signing in).
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.IsAbs() || u.Host != "" || (len(next) > 1 && next[1] == '/') {
		return "/admin"
	}
	if !strings.HasPrefix(u.Path, "/admin") && !(strings.HasPrefix(u.Path, "/oauth/") && strings.HasSuffix(u.Path, "/start")) {
		return "/admin"
	}
	return u.RequestURI()
}

func (h *handler) signInPage(c echo.Context) error {
	if ck, err := c.Cookie(sessionCookie); err == nil {
		if _, err := h.sessions.get(c.Request().Context(), ck.Value); err == nil {
			return c.Redirect(http.StatusSeeOther, safeNext(c.QueryParam("next")))
		}
	}
	tok := randomToken()
	setCookie(c, preCSRFCookie, tok, 600)
	return h.render(c, http.StatusOK, signInPage(page{Title: "Sign in"}, tok, safeNext(c.QueryParam("next")), ""))
}

func (h *handler) signIn(c echo.Context) error {
	pre, err := c.Cookie(preCSRFCookie)
	if err != nil || !csrfEqual(c.FormValue(csrfField), pre.Value) {
		return h.forbidden(c, "The sign-in form expired or is missing its security token. Open the sign-in page again.")
	}
	next := safeNext(c.FormValue("next"))
	addr := h.TrustedProxies.Key(c.Request())
	token := c.FormValue("token")
	var subject, method string
	check := func() bool {
		subject, method = authz.OperatorName, methodToken
		if !tokenMatches(token, h.token) {
			subject, method = h.user(token)
		}
		return subject != ""
	}
	// An address that has failed too often is refused before its token
	// is looked at: while it is blocked, a guess tells it nothing.
	// Attempts are judged under the limiter, so parallel guesses count
	// one by one.
	res := h.Throttle.Attempt(addr, check)
	if res.Refused > 0 {
		return h.blocked(c, next, res.Refused)
	}
	if res.Blocks > 0 {
		h.Logger.Warn("failed sign-ins: address blocked", "client", addr, "for", res.Blocks)
	}
	if !res.OK {
		h.Logger.Warn("admin sign-in refused: wrong token", "remote", c.RealIP())
		return h.signInAgain(c, http.StatusUnauthorized, next, "That admin token is not valid.")
	}
	id, _, err := h.sessions.create(c.Request().Context(), subject, method)
	if err != nil {
		return err
	}
	setCookie(c, preCSRFCookie, "", -1)
	setCookie(c, sessionCookie, id, int(h.SessionTTL/time.Second))
	h.Logger.Info("signed in", "method", method, "subject", subject, "remote", c.RealIP())
	return c.Redirect(http.StatusSeeOther, next)
}

// blocked is the sign-in page of an address blocked for d.
func (h *handler) blocked(c echo.Context, next string, d time.Duration) error {
	s := throttle.RetryAfter(d)
	c.Response().Header().Set("Retry-After", strconv.Itoa(s))
	return h.signInAgain(c, http.StatusTooManyRequests, next,
		fmt.Sprintf("Too many failed sign-ins from your address. Try again in %d seconds.", s))
}

// signInAgain shows the sign-in form again with why the last attempt
// failed, and a fresh form token.
func (h *handler) signInAgain(c echo.Context, status int, next, why string) error {
	tok := randomToken()
	setCookie(c, preCSRFCookie, tok, 600)
	return h.render(c, status, signInPage(page{Title: "Sign in"}, tok, next, why))
}

func (h *handler) signOut(c echo.Context) error {
	id, _ := c.Get(sessionIDKey).(string)
	if err := h.sessions.delete(c.Request().Context(), id); err != nil {
		return err
	}
	setCookie(c, sessionCookie, "", -1)
	return c.Redirect(http.StatusSeeOther, "/admin/sign-in")
}

// user is the principal an API key signs in as, or "" when it is no
// user's key. Every digest is compared, in constant time.
func (h *handler) user(presented string) (subject, method string) {
	for _, u := range h.Users {
		if tokenMatches(presented, u.SHA256) {
			subject, method = u.Name, methodAPIKey
		}
	}
	return subject, method
}

// principal is who the session acts as: the operator holds every role;
// a user has their API key's roles, read afresh from the configured keys
// (a key no longer configured holds none).
func (h *handler) principal(c echo.Context) authz.Principal {
	s := sessionOf(c)
	if s == nil {
		return authz.Principal{Roles: []authz.Role{noRoles}}
	}
	if s.Operator() {
		return authz.Operator(s.Subject)
	}
	for _, u := range h.Users {
		if u.Name == s.Subject {
			return u.Principal
		}
	}
	return authz.Principal{Name: s.Subject, Roles: []authz.Role{noRoles}}
}

// noRoles is held by a session whose key is gone: a role that grants
// nothing, so that it does not fall back to run.
const noRoles authz.Role = "none"

// requireRole admits sessions whose principal holds r; others get a 403
// page saying which role the page needs.
func (h *handler) requireRole(r authz.Role, next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !h.principal(c).Has(r) {
			return h.forbidden(c, "This page needs the "+string(r)+" role, which your sign-in does not have.")
		}
		return next(c)
	}
}

// shows reports whether the navigation offers the page nav to p.Who.
func (p page) shows(nav string) bool {
	switch nav {
	case "allowlists", "deadletters":
		return p.Who.Has(authz.Read)
	case "approvals":
		return p.Who.Has(authz.Read) || p.Who.Has(authz.Approve)
	case "executions", "mcp":
		return p.Who.Has(authz.Read) || p.Who.Has(authz.Run)
	}
	return true
}

// by names the operator in records (allowlist history, decisions).
func by(c echo.Context) string {
	if s := sessionOf(c); s != nil {
		return s.Subject
	}
	return authz.OperatorName
}

func bg(c echo.Context) context.Context { return c.Request().Context() }
