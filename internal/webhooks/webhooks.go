// Package webhooks owns the /hooks/{connection} receiver: Standard Webhooks
// signature verification (the official library, on the raw body bytes,
// against every configured secret so secrets can be rotated), the
// timestamp tolerance (five minutes either way, checked here), and the
// mapping of each delivery to an answer. Accepted events go to the durable
// inbox of internal/triggers, which drops a repeated webhook-id or event id
// and counts and logs every delivery, rejected ones included.
//
// The same route takes the webhook deliveries of MCP server events
// (events/subscribe of the MCP Events extension) for a connection whose
// subscriptions triggers delivers by webhook: a delivery is verified with
// the secrets of the subscription it is for (see triggers.HookCandidates),
// and a verification request is answered 200 with its challenge echoed.
//
// Answers: 204 accepted, 200 duplicate, 400 malformed, 401 bad signature
// or timestamp, 404 no such webhook connection, 413 body too large, 503
// when Redis cannot take it (so the sender retries). Never a 500 for bad
// input.
package webhooks

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

// Tolerance is how far a webhook-timestamp may be from now, either way.
const Tolerance = 5 * time.Minute

// DefaultMaxBodyBytes bounds a delivery's body unless the connection says
// otherwise.
const DefaultMaxBodyBytes = 1 << 20

// Codes of the problems the receiver answers with.
const (
	CodeMalformed        = "WEBHOOK_MALFORMED"
	CodeBadSignature     = "WEBHOOK_SIGNATURE_INVALID"
	CodeBadTimestamp     = "WEBHOOK_TIMESTAMP_INVALID"
	CodeInvalidEvent     = "VALIDATION_FAILED"
	CodeUnknown          = "CONNECTION_UNKNOWN"
	CodeBodyTooLarge     = "BODY_TOO_LARGE"
	CodeUnavailable      = "STORE_UNAVAILABLE" // the API's code for Redis out of reach; the sender retries a 503
	reasonMissingHeaders = "missing webhook-id, webhook-timestamp or webhook-signature"
)

// Options configure a Receiver; nil means defaults.
type Options struct {
	// Now is the clock the timestamp is checked against; tests inject
	// one to replay the spec's vectors.
	Now func() time.Time
}

// Receiver verifies and ingests webhooks.
type Receiver struct {
	svc   *triggers.Service
	hooks map[string]*hook
	now   func() time.Time
}

type hook struct {
	verifiers []*standardwebhooks.Webhook
	maxBody   int64
}

// New builds a Receiver for every connection with webhooks in conns.
func New(conns map[string]config.Connection, svc *triggers.Service, opts *Options) (*Receiver, error) {
	r := &Receiver{svc: svc, hooks: map[string]*hook{}, now: time.Now}
	if opts != nil && opts.Now != nil {
		r.now = opts.Now
	}
	for _, name := range slices.Sorted(maps.Keys(conns)) {
		w := conns[name].Webhooks
		if w == nil {
			continue
		}
		h := &hook{maxBody: DefaultMaxBodyBytes}
		if w.MaxBodyBytes > 0 {
			h.maxBody = w.MaxBodyBytes
		}
		for i, secret := range w.Secrets {
			// Checked at config load; checked again so a Receiver
			// built by hand cannot hold a weak key. The error never
			// quotes the secret.
			if _, err := config.WebhookKey(secret); err != nil {
				return nil, fmt.Errorf("webhooks: connection %s: secrets[%d]: %v", name, i, err)
			}
			v, err := standardwebhooks.NewWebhook(secret)
			if err != nil {
				return nil, fmt.Errorf("webhooks: connection %s: secrets[%d] is not usable", name, i)
			}
			h.verifiers = append(h.verifiers, v)
		}
		if len(h.verifiers) == 0 {
			return nil, fmt.Errorf("webhooks: connection %s has no secrets", name)
		}
		if !svc.HasSource(name) {
			return nil, fmt.Errorf("webhooks: connection %s is not known to the trigger service", name)
		}
		r.hooks[name] = h
	}
	return r, nil
}

// Outcome is the answer to one delivery.
type Outcome struct {
	Status int
	// Code and Detail describe a refusal (Status >= 400).
	Code     string
	Detail   string
	Problems []triggers.FieldProblem
	// Event is the accepted or duplicate event.
	Event *triggers.Event
	// Challenge is a verification request's nonce, echoed with 200.
	Challenge string
}

// Has reports whether connection takes webhooks: configured ones, or
// deliveries of its MCP server's events.
func (r *Receiver) Has(connection string) bool {
	return r.hooks[connection] != nil || r.svc.TakesServerHooks(connection)
}

// MaxBodyBytes is the body limit of connection's webhooks.
func (r *Receiver) MaxBodyBytes(connection string) int64 {
	if h := r.hooks[connection]; h != nil {
		return h.maxBody
	}
	return DefaultMaxBodyBytes
}

// TooLarge records a delivery whose body was over the limit.
func (r *Receiver) TooLarge(ctx context.Context, connection string, header http.Header) Outcome {
	return r.reject(ctx, connection, header, Outcome{Status: http.StatusRequestEntityTooLarge, Code: CodeBodyTooLarge,
		Detail: fmt.Sprintf("the body is larger than %d bytes", r.MaxBodyBytes(connection))})
}

// Receive verifies one delivery and ingests its event. body is the raw
// request body, exactly as signed.
func (r *Receiver) Receive(ctx context.Context, connection string, header http.Header, body []byte) Outcome {
	h := r.hooks[connection]
	if h == nil {
		if r.svc.TakesServerHooks(connection) {
			return r.receiveServer(ctx, connection, header, body)
		}
		return Outcome{Status: http.StatusNotFound, Code: CodeUnknown, Detail: fmt.Sprintf("no connection %q takes webhooks", connection)}
	}
	id, now, refused := r.checkHeaders(ctx, connection, header)
	if refused != nil {
		return *refused
	}
	// Any configured secret may have signed it: during a rotation the
	// sender may sign with the old or the new one.
	if o := r.verify(ctx, connection, header, body, h.verifiers); o != nil {
		return *o
	}
	ev, err := triggers.DecodeEvent(body, id)
	if err != nil {
		return r.refuseEvent(ctx, connection, header, err)
	}
	ev.ReceivedAt = now.UTC()
	res, err := r.svc.Emit(ctx, connection, ev, triggers.Via{Kind: "webhook", WebhookID: id})
	if err != nil {
		return r.refuseEvent(ctx, connection, header, err)
	}
	ev.Connection = connection
	if res.Duplicate {
		return Outcome{Status: http.StatusOK, Event: &ev}
	}
	return Outcome{Status: http.StatusNoContent, Event: &ev}
}

// checkHeaders checks the Standard Webhooks headers and the timestamp; it
// returns the webhook-id and the time of receipt, or the refusal.
func (r *Receiver) checkHeaders(ctx context.Context, connection string, header http.Header) (string, time.Time, *Outcome) {
	refuse := func(o Outcome) (string, time.Time, *Outcome) {
		o = r.reject(ctx, connection, header, o)
		return "", time.Time{}, &o
	}
	id := header.Get(standardwebhooks.HeaderWebhookID)
	ts := header.Get(standardwebhooks.HeaderWebhookTimestamp)
	sig := header.Get(standardwebhooks.HeaderWebhookSignature)
	if id == "" || ts == "" || sig == "" {
		return refuse(Outcome{Status: http.StatusBadRequest, Code: CodeMalformed, Detail: reasonMissingHeaders})
	}
	if !triggers.ValidEventID(id) {
		return refuse(Outcome{Status: http.StatusBadRequest, Code: CodeMalformed,
			Detail: fmt.Sprintf("webhook-id must be 1 to %d printable characters", triggers.MaxEventIDLen)})
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return refuse(Outcome{Status: http.StatusBadRequest, Code: CodeMalformed, Detail: "webhook-timestamp must be whole seconds since the Unix epoch"})
	}
	now := r.now()
	if skew := now.Sub(time.Unix(sec, 0)); skew > Tolerance || skew < -Tolerance {
		return refuse(Outcome{Status: http.StatusUnauthorized, Code: CodeBadTimestamp,
			Detail: fmt.Sprintf("webhook-timestamp is %s from the server's clock; at most %s either way is accepted", skew.Round(time.Second).Abs(), Tolerance)})
	}
	return id, now, nil
}

// verify refuses a delivery that none of verifiers signed.
func (r *Receiver) verify(ctx context.Context, connection string, header http.Header, body []byte, verifiers []*standardwebhooks.Webhook) *Outcome {
	ok, err := signedByAny(header, body, verifiers)
	if err != nil {
		o := r.reject(ctx, connection, header, Outcome{Status: http.StatusBadRequest, Code: CodeMalformed, Detail: "the webhook headers cannot be read"})
		return &o
	}
	if !ok {
		o := r.reject(ctx, connection, header, Outcome{Status: http.StatusUnauthorized, Code: CodeBadSignature, Detail: "no signature in webhook-signature matches a secret of this connection"})
		return &o
	}
	return nil
}

// signedByAny reports whether one of verifiers signed the delivery; the
// error is for headers that cannot be read.
func signedByAny(header http.Header, body []byte, verifiers []*standardwebhooks.Webhook) (bool, error) {
	for _, v := range verifiers {
		err := v.VerifyIgnoringTimestamp(body, header)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, standardwebhooks.ErrNoMatchingSignature) {
			return false, err
		}
	}
	return false, nil
}

func (r *Receiver) refuseEvent(ctx context.Context, connection string, header http.Header, err error) Outcome {
	var ee *triggers.EventError
	if errors.As(err, &ee) {
		return r.reject(ctx, connection, header, Outcome{Status: http.StatusBadRequest, Code: CodeInvalidEvent, Detail: ee.Error(), Problems: ee.Problems})
	}
	// Redis could not take it: not the sender's fault, and a retry may
	// succeed.
	return Outcome{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Detail: "the event could not be stored; retry later"}
}

func (r *Receiver) reject(ctx context.Context, connection string, header http.Header, o Outcome) Outcome {
	r.svc.Reject(ctx, connection, triggers.Receipt{
		Via: "webhook", Status: o.Status, Reason: o.Code + ": " + o.Detail, WebhookID: truncate(header.Get(standardwebhooks.HeaderWebhookID), triggers.MaxEventIDLen),
	})
	return o
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// Deliveries returns the last n deliveries to connection, newest first,
// for the admin UI.
func (r *Receiver) Deliveries(ctx context.Context, connection string, n int) ([]triggers.Receipt, error) {
	return r.svc.Deliveries(ctx, connection, n)
}

// HeaderSubscriptionID names the MCP server's webhook subscription a
// delivery is for (the Events extension's one header of its own).
const HeaderSubscriptionID = "X-MCP-Subscription-Id"

// receiveServer verifies a delivery of an MCP server's events with the
// secrets of connection's webhook subscriptions and hands it to triggers.
func (r *Receiver) receiveServer(ctx context.Context, connection string, header http.Header, body []byte) Outcome {
	id, _, refused := r.checkHeaders(ctx, connection, header)
	if refused != nil {
		return *refused
	}
	cands, err := r.svc.HookCandidates(ctx, connection, header.Get(HeaderSubscriptionID))
	if err != nil {
		return Outcome{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Detail: "the subscription could not be read; retry later"}
	}
	for _, c := range cands {
		verifiers := make([]*standardwebhooks.Webhook, 0, len(c.Secrets))
		for _, secret := range c.Secrets {
			if v, err := standardwebhooks.NewWebhook(secret); err == nil {
				verifiers = append(verifiers, v)
			}
		}
		ok, err := signedByAny(header, body, verifiers)
		if err != nil {
			return r.reject(ctx, connection, header, Outcome{Status: http.StatusBadRequest, Code: CodeMalformed, Detail: "the webhook headers cannot be read"})
		}
		if ok {
			return r.deliverServer(ctx, connection, header, c, id, body)
		}
	}
	return r.reject(ctx, connection, header, Outcome{Status: http.StatusUnauthorized, Code: CodeBadSignature, Detail: "no signature in webhook-signature matches a secret of this connection's event subscriptions"})
}

func (r *Receiver) deliverServer(ctx context.Context, connection string, header http.Header, c triggers.HookCandidate, id string, body []byte) Outcome {
	ans, err := r.svc.DeliverHook(ctx, c, id, body)
	if err != nil {
		return r.refuseEvent(ctx, connection, header, err)
	}
	switch {
	case ans.Challenge != "":
		return Outcome{Status: http.StatusOK, Challenge: ans.Challenge}
	case ans.Event != nil && ans.Duplicate:
		return Outcome{Status: http.StatusOK, Event: ans.Event}
	}
	return Outcome{Status: http.StatusNoContent, Event: ans.Event}
}
