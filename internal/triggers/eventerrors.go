package triggers

import (
	"errors"
	"fmt"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
)

// pollParams are the knobs every events/poll sends (inbox settings, else
// their defaults): maxEvents bounds one ingest script, timeoutMs lets the
// server answer as soon as an event arrives instead of after nextPollMs,
// and maxAgeMs keeps a subscription resumed after a long stop from
// starting turns for stale events.
func pollParams(in *config.Inbox) harness.EventPoll {
	p := harness.EventPoll{MaxEvents: config.DefaultPollMaxEvents, Timeout: config.DefaultPollTimeout, MaxAge: config.DefaultPollMaxAge}
	if in == nil {
		return p
	}
	if in.PollMaxEvents > 0 {
		p.MaxEvents = in.PollMaxEvents
	}
	if in.PollTimeout > 0 {
		p.Timeout = in.PollTimeout
	}
	if in.PollMaxAge > 0 {
		p.MaxAge = in.PollMaxAge
	}
	return p
}

// Error codes of the MCP Events extension (design sketch, "Error Codes"),
// and JSON-RPC's invalid params, which a server answers when the
// arguments or the cursor do not suit it.
const (
	codeInvalidParams     = -32602
	codeNotFound          = -32011
	codeForbidden         = -32012
	codeResourceExhausted = -32013
	codeUnsupported       = -32014
	codeCallbackEndpoint  = -32015
)

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
	case codeForbidden, codeResourceExhausted, codeUnsupported, codeCallbackEndpoint:
		return max(retry, refusalBackoff)
	}
	return retry
}

// explainCode says what a server's error code means for a subscription;
// data's fields (kind, limit, max, feature, value, reason) are quoted
// when the server gave them.
func explainCode(code int, data map[string]any) string {
	switch code {
	case codeInvalidParams:
		return "InvalidParams (-32602): the server refused the subscription's arguments or cursor" + detail(data, "reason")
	case codeNotFound:
		return "NotFound (-32011): the server no longer offers this event type" + detail(data, "kind") +
			"; polling resumes once it lists it again"
	case codeForbidden:
		return "Forbidden (-32012): the server does not permit this subscription to the connection's principal, or revoked its access" +
			detail(data, "reason") + "; retried every 30s"
	case codeResourceExhausted:
		return "ResourceExhausted (-32013): a limit of the server was reached" + detail(data, "limit", "max") + "; retried every 30s"
	case codeUnsupported:
		if data["reason"] == "schema_changed" {
			return "Unsupported (-32014): the event type changed incompatibly" + detail(data, "feature") +
				"; a subscription under its new name or arguments is needed"
		}
		return "Unsupported (-32014): the server does not support an option of this subscription" + detail(data, "feature", "value") + "; retried every 30s"
	case codeCallbackEndpoint:
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
		out += k + " " + harness.Excerpt(fmt.Sprint(v), 100)
	}
	if out == "" {
		return ""
	}
	return " (" + out + ")"
}
