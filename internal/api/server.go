// Package api serves patchbay's JSON API with echo: one file per resource,
// handlers that decode, validate, call the harness and respond, and one
// error handler that maps typed errors to application/problem+json.
//
// openapi.yaml at the repository root is the contract; a test drives every
// route and checks each real response against it.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"go.opentelemetry.io/otel/trace"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/eventstream"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/throttle"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/webhooks"
)

// Options wire the API to the rest of patchbay.
type Options struct {
	Executions *harness.Executions
	Registry   *registry.Registry
	// APIKeys are the accepted bearer keys.
	APIKeys []Key
	// Allowlists is the allowlist store managed under /v1/allowlists.
	Allowlists *gates.Allowlists
	// Questions is the queue of servers' questions (MCP elicitations)
	// served under /v1/questions; the engine provides it. The routes are
	// mounted either way, so the API's shape does not depend on wiring:
	// nil lists no questions and answers 404 QUESTION_NOT_FOUND for any
	// one.
	Questions *gates.Questions
	// Triggers serves sources, the harness start/status routes and the
	// dead letters; nil answers those routes with 503.
	Triggers *triggers.Service
	// Webhooks verifies /hooks/{connection}; nil answers 404 there.
	Webhooks *webhooks.Receiver
	// Secrets stores the values PUT /v1/secrets/{name} receives; nil (no
	// PATCHBAY_SECRET_KEY) answers that route with 501 SECRETS_READ_ONLY.
	Secrets secrets.SecretWriter
	// MaxBodyBytes bounds every request body. Default 1 MiB.
	MaxBodyBytes int64
	// Ready reports whether the server can take work (Redis reachable,
	// connections started); nil means always ready.
	Ready   func(ctx context.Context) error
	Metrics *Metrics
	Logger  *slog.Logger
	// Throttle counts wrong API keys per client address and blocks an
	// address that sends too many (429 RATE_LIMITED); nil counts nothing.
	// The server shares one with the admin UI's sign-in.
	Throttle *throttle.Limiter
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client; without them the client is the TCP peer. It is also
	// what echo's RealIP reports, for logs.
	TrustedProxies throttle.Proxies
	// Tracer starts a span per request (see trace.go); nil: none.
	Tracer trace.Tracer
	// Streams serves the event streams and caps how many are open (429
	// TOO_MANY_STREAMS past a cap); nil: a Streams of its own with the
	// defaults. The server shares one with the admin UI, so streams on
	// either count together.
	Streams *eventstream.Streams
	// MCP serves /mcp; nil: no MCP face (404 there).
	MCP MCPFace
	// MCPTokens, when set, lets /mcp callers present an OAuth access
	// token instead of an API key, and serves the Protected Resource
	// Metadata that says where to get one (whether or not MCP is set, so
	// the document does not depend on how the face is built); nil: API
	// keys only.
	MCPTokens MCPTokens
}

// New returns the HTTP handler of the API.
func New(o Options) *echo.Echo {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 1 << 20
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	if o.Streams == nil {
		o.Streams = eventstream.New(o.Executions, nil)
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = errorHandler(o.Logger)
	// echo's default RealIP believes X-Forwarded-For from anyone.
	e.IPExtractor = o.TrustedProxies.IP
	e.Use(middleware.RequestID())
	e.Use(storeWait)
	e.Use(tracing(o.Tracer))
	e.Use(requestLogger(o.Logger))
	e.Use(middleware.Recover())
	e.Use(o.Metrics.middleware)
	e.Use(middleware.BodyLimit(strconv.FormatInt(o.MaxBodyBytes, 10) + "B"))

	h := &handlers{Options: o}
	e.GET("/healthz", h.healthz)
	e.GET("/readyz", h.readyz)
	e.GET("/metrics", o.Metrics.handler())

	// The key is checked per route rather than as group middleware: echo
	// gives a group with middleware a catch-all route, which would turn a
	// wrong method (405) into a 404.
	//
	// Each route says who may use it: need(role) for role-gated routes;
	// the handlers of owned resources (executions, approvals, questions,
	// allowlists) answer 404 for what the key may not see (see package
	// authz).
	auth := requireAPIKey(o.APIKeys, guard{limiter: o.Throttle, proxies: o.TrustedProxies, logger: o.Logger})
	run, read, admin := need(authz.Run), need(authz.Read), need(authz.Admin)
	v1 := e.Group("/v1")
	v1.POST("/executions", h.createExecution, auth, run)
	v1.GET("/executions", h.listExecutions, auth)
	v1.GET("/executions/:id", h.getExecution, auth)
	v1.GET("/executions/:id/events", h.streamEvents, auth)
	v1.POST("/executions/:id/cancel", h.cancelExecution, auth)
	v1.POST("/executions/:id/resume", h.resumeExecution, auth)
	v1.GET("/connections", h.listConnections, auth)
	v1.GET("/connections/:name", h.getConnection, auth)
	v1.GET("/connections/:name/operations/*", h.getOperation, auth)
	v1.PUT("/secrets/:name", h.putSecret, auth, admin)
	// Triggers. /hooks authenticates by signature, not API key.
	e.POST("/hooks/:connection", h.receiveWebhook)
	v1.POST("/sources/:name/events", h.pushEvent, auth)
	v1.POST("/harness/start", h.startHarness, auth, admin)
	v1.GET("/harness/status", h.harnessStatus, auth, read)
	v1.GET("/deadletters", h.listDeadLetters, auth, read)
	v1.POST("/deadletters/:id/redeliver", h.redeliverDeadLetter, auth, admin)
	v1.GET("/allowlists", h.listAllowlists, auth)
	v1.GET("/allowlists/:name", h.getAllowlist, auth)
	v1.PUT("/allowlists/:name", h.putAllowlist, auth, admin)
	v1.DELETE("/allowlists/:name", h.deleteAllowlist, auth, admin)
	v1.GET("/allowlists/:name/describe", h.describeAllowlist, auth)
	v1.GET("/approvals", h.listApprovals, auth)
	v1.GET("/approvals/:id", h.getApproval, auth)
	v1.POST("/approvals/:id/approve", h.approve, auth)
	v1.POST("/approvals/:id/deny", h.deny, auth)
	v1.GET("/questions", h.listQuestions, auth)
	v1.GET("/questions/:id", h.getQuestion, auth)
	v1.POST("/questions/:id/answer", h.answerQuestion, auth)
	v1.POST("/questions/:id/decline", h.declineQuestion, auth)
	v1.POST("/questions/:id/cancel", h.cancelQuestion, auth)
	if o.MCPTokens != nil {
		// Public: where an MCP client learns which issuer's tokens /mcp
		// takes and what to ask them for.
		e.GET(mcpResourceMetadataPath, echo.WrapHandler(o.MCPTokens.MetadataHandler()))
	}
	if o.MCP != nil {
		var tokens TokenVerifier
		if o.MCPTokens != nil {
			tokens = o.MCPTokens
		}
		if o.Executions != nil {
			tokens = bridgeTokens{execs: o.Executions, next: tokens}
		}
		mountMCP(e, o.MCP, requireCaller(o.APIKeys, tokens, guard{limiter: o.Throttle, proxies: o.TrustedProxies, logger: o.Logger}))
	}
	return e
}

type handlers struct {
	Options
}

// storeWait bounds, once for the whole request, how long it waits on a
// Redis that does not answer (store.RequestWait): every route, and the
// admin UI mounted on the same server, answers 503 STORE_UNAVAILABLE within
// it when Redis freezes, however many reads it makes.
func storeWait(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx, end := store.WithRequestWait(c.Request().Context(), store.RequestWait)
		defer end()
		c.SetRequest(c.Request().WithContext(ctx))
		return next(c)
	}
}

func requestLogger(logger *slog.Logger) echo.MiddlewareFunc {
	return middleware.RequestLoggerWithConfig(middleware.RequestLoggerConfig{
		HandleError:  true,
		LogStatus:    true,
		LogMethod:    true,
		LogURIPath:   true,
		LogRequestID: true,
		LogLatency:   true,
		LogValuesFunc: func(c echo.Context, v middleware.RequestLoggerValues) error {
			level := slog.LevelInfo
			if v.Status >= 500 {
				level = slog.LevelError
			}
			logger.LogAttrs(c.Request().Context(), level, "request",
				slog.String("request_id", v.RequestID), slog.String("method", v.Method),
				slog.String("path", v.URIPath), slog.Int("status", v.Status), slog.Duration("latency", v.Latency))
			return nil
		},
	})
}

func requestID(c echo.Context) string {
	return c.Response().Header().Get(echo.HeaderXRequestID)
}

func (h *handlers) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (h *handlers) readyz(c echo.Context) error {
	if h.Ready != nil {
		if err := h.Ready(c.Request().Context()); err != nil {
			if store.Unavailable(err) {
				return err // STORE_UNAVAILABLE, as on every other route
			}
			return problem(http.StatusServiceUnavailable, codeNotReady, err.Error())
		}
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}
