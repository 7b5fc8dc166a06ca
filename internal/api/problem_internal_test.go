package api

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// TestTransientIs503: what a retry may fix (a connection or pool starting
// or reconnecting, Redis out of reach) is 503 with Retry-After and its
// code; what it cannot (a sign-in, a closed connection, a bad document) is
// 422 without one, even when a transient problem comes with it.
func TestTransientIs503(t *testing.T) {
	refused := func(codes ...fault.Code) error {
		ve := &fault.ValidationError{}
		for _, c := range codes {
			ve.Problems = append(ve.Problems, fault.FieldError{Path: "/workflow/root/op", Code: c, Message: "m"})
		}
		return ve
	}
	tests := []struct {
		name   string
		err    error
		status int
		code   string
		retry  int
	}{
		{"connection starting", refused(fault.CodeConnectionStarting), 503, "CONNECTION_STARTING", retryConnection},
		{"connection reconnecting", refused(fault.CodeConnectionUnavailable), 503, "CONNECTION_UNAVAILABLE", retryConnection},
		{"two connections starting", refused(fault.CodeConnectionStarting, fault.CodeConnectionUnavailable), 503, "CONNECTION_STARTING", retryConnection},
		{"needs a sign-in", refused(fault.CodeConnectionNeedsSignIn), 422, "CONNECTION_NEEDS_SIGN_IN", 0},
		{"closed", refused(fault.CodeConnectionClosed), 422, "CONNECTION_CLOSED", 0},
		{"starting and a bad operation", refused(fault.CodeConnectionStarting, fault.CodeOperationUnknown), 422, "CONNECTION_STARTING", 0},
		{"a harness error while starting", &fault.Error{Code: fault.CodeConnectionStarting, Message: "m"}, 503, "CONNECTION_STARTING", retryConnection},
		{"Redis refuses connections", fmt.Errorf("executions: submit: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), 503, codeStoreUnavailable, retryStore},
		{"Redis answers it is loading", fmt.Errorf("executions: submit: %w", redis.Error(loadingReply{})), 503, codeStoreUnavailable, retryStore},
		{"an internal error", fmt.Errorf("executions: submit: %w", errors.New("boom")), 500, codeInternal, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := toProblem(tt.err)
			if p.Status != tt.status || p.Code != tt.code || retryAfterOf(p) != tt.retry {
				t.Errorf("problem %d %s, Retry-After %d; want %d %s, %d", p.Status, p.Code, retryAfterOf(p), tt.status, tt.code, tt.retry)
			}
			if tt.status == http.StatusServiceUnavailable && retryAfterOf(p) == 0 {
				t.Error("a 503 without Retry-After")
			}
		})
	}
}

// loadingReply is the error reply of a Redis still loading its data.
type loadingReply struct{}

func (loadingReply) Error() string { return "LOADING Redis is loading the dataset in memory" }
func (loadingReply) RedisError()   {}
