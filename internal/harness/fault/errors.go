// Package fault holds what every part of the engine and every caller of it
// uses to say what went wrong: the error codes of a refused request (Code,
// Error, FieldError, ValidationError, ErrNotFound), the failure kinds and
// gate numbers of a failed execution or step, the refusal at a gate
// (Denied), JSON Pointer escaping for the paths that name a field, and the
// check for numbers JSON cannot hold. It imports nothing of patchbay, so the
// providers, the API and the engine's parts can all use it.
package fault

import (
	"errors"
	"fmt"
	"strings"
)

// Code is a stable, documented error code; the API returns it verbatim.
type Code string

// Error codes of the harness.
const (
	CodeConnectionInvalid     Code = "CONNECTION_INVALID"
	CodeConnectionUnknown     Code = "CONNECTION_UNKNOWN"
	CodeConnectionNameTaken   Code = "CONNECTION_NAME_TAKEN"
	CodeOperationUnknown      Code = "OPERATION_UNKNOWN"
	CodeValidationFailed      Code = "VALIDATION_FAILED"
	CodeNumberOutOfRange      Code = "NUMBER_OUT_OF_RANGE"
	CodeExpressionInvalid     Code = "EXPRESSION_INVALID"
	CodeStepIDDuplicate       Code = "STEP_ID_DUPLICATE"
	CodeNotSupported          Code = "NOT_SUPPORTED"
	CodeExecutionNotFound     Code = "EXECUTION_NOT_FOUND"
	CodeConnectionUnavailable Code = "CONNECTION_UNAVAILABLE"
	CodeConnectionStarting    Code = "CONNECTION_STARTING"
	CodeConnectionNeedsSignIn Code = "CONNECTION_NEEDS_SIGN_IN"
	CodeConnectionClosed      Code = "CONNECTION_CLOSED"
)

// Transient reports whether a problem with this code goes away by itself:
// the connection is starting, or was lost and is being reconnected. The API
// answers such a refusal 503 with Retry-After, so clients retry it; every
// other code needs a change to the request or the deployment.
func (c Code) Transient() bool {
	return c == CodeConnectionStarting || c == CodeConnectionUnavailable
}

// NotReady reports whether the code says a connection was not ready
// (starting, reconnecting, waiting for a sign-in, or closed by a shutdown):
// a trigger's turn refused so is delivered again rather than dead-lettered.
func (c Code) NotReady() bool {
	return c.Transient() || c == CodeConnectionNeedsSignIn || c == CodeConnectionClosed
}

// Error is a harness error with a stable code, matched with errors.As.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// FieldError is one problem at one place of a request, named by its JSON
// Pointer (RFC 6901) from the request body's root.
type FieldError struct {
	Path    string `json:"path"`
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

// ValidationError holds every problem found in a document, so a caller can
// fix them all at once.
type ValidationError struct {
	Problems []FieldError
}

func (e *ValidationError) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.Path + ": " + p.Message
	}
	return "invalid request: " + strings.Join(lines, "; ")
}

// Code is the code of the first problem: a document with an unknown
// connection answers CONNECTION_UNKNOWN, not a generic code.
func (e *ValidationError) Code() Code {
	if len(e.Problems) == 0 {
		return CodeValidationFailed
	}
	return e.Problems[0].Code
}

// Transient reports whether every problem is transient (Code.Transient):
// the same request may then succeed later. One permanent problem makes the
// whole refusal permanent, since a retry would meet it again.
func (e *ValidationError) Transient() bool {
	for _, p := range e.Problems {
		if !p.Code.Transient() {
			return false
		}
	}
	return len(e.Problems) > 0
}

// ErrNotFound is returned when an execution does not exist (or has expired).
var ErrNotFound = errors.New("not found")
