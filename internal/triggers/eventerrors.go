package triggers

import (
	"errors"
	"fmt"
	"time"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// codeInvalidParams is JSON-RPC's invalid params, which a server answers
// when the arguments or the cursor do not suit it.
const codeInvalidParams = -32602

// rpcError is an error a server answered a request with; the mcp
// provider's EventError is one. Declared here so triggers imports no
// transport.
type rpcError interface {
	error
	RPCCode() int
	RPCData() map[string]any
}

// refusalBackoff is the least wait after a refusal that polling again
// soon will not cure (access, quota, an option the server lacks).
const refusalBackoff = 30 * time.Second

// pollError turns a failed events/poll into the subscription's last
// error: what the server's error code means for the subscription, then
// the server's own words.
func pollError(err error) error {
	var re rpcError
	if !errors.As(err, &re) {
		return fmt.Errorf("events/poll: %w", err)
	}
	return fmt.Errorf("events/poll refused: %s [%w]", explainCode(re.RPCCode(), re.RPCData()), err)
}

// pollRetry is how long to wait after err before polling again.
func pollRetry(err error, retry time.Duration) time.Duration {
	var re rpcError
	if !errors.As(err, &re) {
		return retry
	}
	switch re.RPCCode() {
	case connect.EventCodeForbidden, connect.EventCodeResourceExhausted, connect.EventCodeUnsupported, connect.EventCodeCallback:
		return max(retry, refusalBackoff)
	}
	return retry
}

// staleList reports whether err says the event type is gone or changed
// (NotFound, or Unsupported with schema_changed): the connection's list of
// event types is then listed again, as the sketch asks of a client.
func staleList(err error) bool {
	var re rpcError
	if !errors.As(err, &re) {
		return false
	}
	return re.RPCCode() == connect.EventCodeNotFound || re.RPCCode() == connect.EventCodeUnsupported && re.RPCData()["reason"] == "schema_changed"
}

// explainCode says what a server's error code means for a subscription;
// data's fields (kind, limit, max, feature, value, reason) are quoted
// when the server gave them.
func explainCode(code int, data map[string]any) string {
	switch code {
	case codeInvalidParams:
		return "InvalidParams (-32602): the server refused the subscription's arguments or cursor" + detail(data, "reason")
	case connect.EventCodeNotFound:
		return "NotFound (-32011): the server no longer offers this event type" + detail(data, "kind") +
			"; its events are listed again, and polling resumes once it lists it again"
	case connect.EventCodeForbidden:
		return "Forbidden (-32012): the server does not permit this subscription to the connection's principal, or revoked its access" +
			detail(data, "reason") + "; retried every 30s"
	case connect.EventCodeResourceExhausted:
		return "ResourceExhausted (-32013): a limit of the server was reached" + detail(data, "limit", "max") + "; retried every 30s"
	case connect.EventCodeUnsupported:
		if data["reason"] == "schema_changed" {
			return "Unsupported (-32014): the event type changed incompatibly" + detail(data, "feature") +
				"; its events are listed again; a subscription under its new name or arguments may be needed"
		}
		return "Unsupported (-32014): the server does not support an option of this subscription" + detail(data, "feature", "value") + "; retried every 30s"
	case connect.EventCodeCallback:
		return "CallbackEndpointError (-32015): the server could not reach or verify patchbay's webhook endpoint" + detail(data, "reason") + "; retried every 30s"
	}
	return fmt.Sprintf("error %d", code)
}

// detail quotes data's named fields, each cut short: they are the
// server's words.
func detail(data map[string]any, keys ...string) string {
	out := ""
	for _, k := range keys {
		v, ok := data[k]
		if !ok {
			continue
		}
		if out != "" {
			out += ", "
		}
		out += k + " " + connect.Excerpt(fmt.Sprint(v), 100)
	}
	if out == "" {
		return ""
	}
	return " (" + out + ")"
}
