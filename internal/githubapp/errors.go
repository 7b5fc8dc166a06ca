package githubapp

import (
	"errors"
	"fmt"
	"time"
)

// Code says what went wrong, with the codes the reference documents.
type Code string

// The codes.
const (
	// NotInstalled: the App is not installed on the repository (or the
	// repository is not among the installation's).
	NotInstalled Code = "not_installed"
	// PermissionDenied: the App lacks a permission asked for, or GitHub
	// granted less than asked (fail closed).
	PermissionDenied Code = "permission_denied"
	// Unauthorized: GitHub rejected the App JWT (app id, key, clock).
	Unauthorized Code = "unauthorized"
	// RateLimited: a primary or secondary rate limit; RetryAfter says how
	// long to wait when GitHub said.
	RateLimited Code = "rate_limited"
	// Network: the request itself failed (DNS, connection, TLS, timeout).
	Network Code = "network"
	// InvalidKey: the private key could not be parsed.
	InvalidKey Code = "invalid_key"
	// InvalidRequest: owner, repo or permissions are malformed or missing.
	InvalidRequest Code = "invalid_request"
	// HTTP: any other error response, or a success missing what GitHub
	// documents.
	HTTP Code = "http"
)

// Error is every error this package returns about GitHub or the request.
// Its message never holds a token, a JWT or the key.
type Error struct {
	Code Code
	// Status is GitHub's HTTP status, 0 when there was no response.
	Status int
	// RetryAfter is how long GitHub asked to wait (rate_limited only; 0
	// when it did not say).
	RetryAfter time.Duration
	Message    string
	// Err is the cause (a network error), if any.
	Err error
}

func (e *Error) Error() string {
	msg := "githubapp: " + string(e.Code) + ": " + e.Message
	if e.Status != 0 {
		msg += fmt.Sprintf(" (HTTP %d)", e.Status)
	}
	if e.RetryAfter > 0 {
		msg += fmt.Sprintf(", retry after %s", e.RetryAfter)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// CodeOf returns the Code of err's *Error, or "" when it has none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
