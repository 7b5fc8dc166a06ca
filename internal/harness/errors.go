package harness

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
	CodeExpressionInvalid     Code = "EXPRESSION_INVALID"
	CodeStepIDDuplicate       Code = "STEP_ID_DUPLICATE"
	CodeNotSupported          Code = "NOT_SUPPORTED"
	CodeExecutionNotFound     Code = "EXECUTION_NOT_FOUND"
	CodeConnectionUnavailable Code = "CONNECTION_UNAVAILABLE"
)

// Error is a harness error with a stable code, matched with errors.As.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

func errorf(code Code, format string, args ...any) *Error {
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
	return "invalid workflow: " + strings.Join(lines, "; ")
}

// Code is the code of the first problem: a document with an unknown
// connection answers CONNECTION_UNKNOWN, not a generic code.
func (e *ValidationError) Code() Code {
	if len(e.Problems) == 0 {
		return CodeValidationFailed
	}
	return e.Problems[0].Code
}

// ErrNotFound is returned when an execution does not exist (or has expired).
var ErrNotFound = errors.New("not found")
