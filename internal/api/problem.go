package api

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/eventstream"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// Problem is an RFC 9457 problem document with patchbay's stable code and
// per-field errors.
type Problem struct {
	Type   string             `json:"type"`
	Title  string             `json:"title"`
	Status int                `json:"status"`
	Detail string             `json:"detail,omitempty"`
	Code   string             `json:"code"`
	Errors []fault.FieldError `json:"errors,omitempty"`

	// retryAfter is the Retry-After of a problem a retry may fix, in
	// seconds; 0 means the default of its status (see retryAfterOf).
	retryAfter int
	// challenge is the WWW-Authenticate of a 401; "" is the default
	// (Bearer realm="patchbay").
	challenge string
}

func (p *Problem) Error() string { return p.Code + ": " + p.Detail }

// Codes the API adds to the harness's.
const (
	codeUnauthenticated    = "UNAUTHENTICATED"
	codeMalformedJSON      = "MALFORMED_JSON"
	codeUnsupportedMedia   = "UNSUPPORTED_MEDIA_TYPE"
	codeBodyTooLarge       = "BODY_TOO_LARGE"
	codeNotFound           = "NOT_FOUND"
	codeMethodNotAllowed   = "METHOD_NOT_ALLOWED"
	codeNotReady           = "NOT_READY"
	codeInternal           = "INTERNAL"
	codeInvalidCursor      = "INVALID_CURSOR"
	codeInvalidEventID     = "INVALID_EVENT_ID"
	codeExecutionNotFound  = string(fault.CodeExecutionNotFound)
	codeValidationFailed   = string(fault.CodeValidationFailed)
	codeConnectionNotFound = string(fault.CodeConnectionUnknown)
	codeStoreUnavailable   = "STORE_UNAVAILABLE" // also webhooks.CodeUnavailable
	codeTooManyStreams     = "TOO_MANY_STREAMS"
)

// Seconds a client is asked to wait (Retry-After) before retrying a 503:
// Redis failing over or restarting takes seconds; a connection starting
// takes as long as its server's start.
const (
	retryStore      = 2
	retryConnection = 5
	retryDefault    = 5
)

func problem(status int, code, detail string, errs ...fault.FieldError) *Problem {
	return &Problem{
		Type:   "urn:patchbay:problem:" + strings.ToLower(strings.ReplaceAll(code, "_", "-")),
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
		Code:   code,
		Errors: errs,
	}
}

// fieldProblem is a 422 naming one field.
func fieldProblem(code fault.Code, path, message string) *Problem {
	return problem(http.StatusUnprocessableEntity, string(code), path+": "+message,
		fault.FieldError{Path: path, Code: code, Message: message})
}

// errorHandler maps every error a handler returns to problem+json, once, at
// the edge. Details of 5xx errors are logged, never returned.
func errorHandler(logger *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		p := toProblem(err)
		switch {
		case p.Status >= 500 && p.Code == codeInternal:
			logger.Error("request failed", "request_id", requestID(c), "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
		case p.Code == codeStoreUnavailable:
			logger.Warn("request refused: Redis is unavailable", "request_id", requestID(c), "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
		}
		if p.Status == http.StatusUnauthorized {
			challenge := p.challenge
			if challenge == "" {
				challenge = `Bearer realm="patchbay"`
			}
			c.Response().Header().Set("WWW-Authenticate", challenge)
		}
		if s := retryAfterOf(p); s > 0 {
			c.Response().Header().Set("Retry-After", strconv.Itoa(s))
		}
		c.Response().Header().Set(echo.HeaderContentType, "application/problem+json")
		if c.Request().Method == http.MethodHead {
			_ = c.NoContent(p.Status)
			return
		}
		_ = c.JSON(p.Status, p)
	}
}

func toProblem(err error) *Problem {
	var (
		p  *Problem
		ve *fault.ValidationError
		he *fault.Error
		ee *echo.HTTPError
		le *eventstream.LimitError
	)
	if p := idempotencyProblem(err); p != nil {
		return p
	}
	switch {
	case errors.As(err, &p):
		return p
	case errors.As(err, &ve):
		status := http.StatusUnprocessableEntity
		if ve.Transient() {
			status = http.StatusServiceUnavailable
		}
		return problem(status, string(ve.Code()), ve.Error(), ve.Problems...)
	case errors.Is(err, harness.ErrInvalidEventID):
		return problem(http.StatusBadRequest, codeInvalidEventID, "Last-Event-ID (or after) must be an event id as the stream sent it, such as 1733225000000-0")
	case errors.Is(err, fault.ErrNotFound):
		return problem(http.StatusNotFound, codeExecutionNotFound, "no execution with that id")
	case errors.As(err, &le):
		p := problem(http.StatusTooManyRequests, codeTooManyStreams, le.Error())
		p.retryAfter = int(eventstream.RetryAfter / time.Second)
		return p
	case errors.As(err, &he):
		return problem(statusOf(he.Code), string(he.Code), he.Message)
	case errors.As(err, &ee):
		return echoProblem(ee)
	case store.Unavailable(err):
		return problem(http.StatusServiceUnavailable, codeStoreUnavailable, "the store (Redis) cannot be reached; retry later")
	}
	return problem(http.StatusInternalServerError, codeInternal, "internal error; see the server log")
}

// retryAfterOf is the Retry-After of p in seconds, or 0 for none: every
// 503 has one, so a client knows to retry it and when.
func retryAfterOf(p *Problem) int {
	switch {
	case p.retryAfter > 0:
		return p.retryAfter
	case p.Status != http.StatusServiceUnavailable:
		return 0
	case p.Code == codeStoreUnavailable:
		return retryStore
	case fault.Code(p.Code).Transient():
		return retryConnection
	}
	return retryDefault
}

func statusOf(code fault.Code) int {
	if code.Transient() {
		return http.StatusServiceUnavailable
	}
	switch code {
	case fault.CodeConnectionUnknown:
		return http.StatusNotFound
	case fault.CodeConnectionNameTaken:
		return http.StatusConflict
	}
	return http.StatusUnprocessableEntity
}

func echoProblem(ee *echo.HTTPError) *Problem {
	switch ee.Code {
	case http.StatusNotFound:
		return problem(ee.Code, codeNotFound, "no such route")
	case http.StatusMethodNotAllowed:
		return problem(ee.Code, codeMethodNotAllowed, "method not allowed on this route")
	case http.StatusRequestEntityTooLarge:
		return problem(ee.Code, codeBodyTooLarge, "request body is larger than the limit")
	case http.StatusUnsupportedMediaType:
		return problem(ee.Code, codeUnsupportedMedia, "request body must be application/json")
	}
	if ee.Code < 500 {
		return problem(ee.Code, "BAD_REQUEST", http.StatusText(ee.Code))
	}
	return problem(http.StatusInternalServerError, codeInternal, "internal error; see the server log")
}
