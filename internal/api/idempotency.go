package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
)

// The Idempotency-Key header (draft-ietf-httpapi-idempotency-key-header,
// as Stripe uses it) on POST /v1/executions and POST
// /v1/sources/{name}/events: the same key from the same principal within
// harness.IdempotencyTTL answers the first request's result, marked with
// Idempotent-Replayed: true, instead of doing the work again.
const (
	headerIdempotencyKey = "Idempotency-Key"
	headerReplayed       = "Idempotent-Replayed"
	maxIdempotencyKeyLen = 255
)

// Codes of idempotency keys.
const (
	codeIdempotencyKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	codeIdempotencyKeyReused  = "IDEMPOTENCY_KEY_REUSED"
	codeIdempotencyKeyInUse   = "IDEMPOTENCY_KEY_IN_USE"
)

// retryInUse is the Retry-After of a key in flight: the first request is
// usually done within a second.
const retryInUse = 1

// idempotencyKey returns the request's Idempotency-Key, "" when it has
// none. The draft sends the key as a structured-field string ("…"); a bare
// token, as Stripe's clients send it, is accepted too.
func idempotencyKey(c echo.Context) (string, error) {
	vals := c.Request().Header.Values(headerIdempotencyKey)
	if len(vals) == 0 {
		return "", nil
	}
	bad := problem(http.StatusBadRequest, codeIdempotencyKeyInvalid,
		headerIdempotencyKey+" must be one value of 1 to 255 printable ASCII characters",
		fault.FieldError{Path: headerIdempotencyKey, Code: codeIdempotencyKeyInvalid, Message: "must be 1 to 255 printable ASCII characters"})
	if len(vals) > 1 {
		return "", bad
	}
	key := strings.TrimSpace(vals[0])
	if len(key) >= 2 && key[0] == '"' && key[len(key)-1] == '"' {
		key = key[1 : len(key)-1]
	}
	if key == "" || len(key) > maxIdempotencyKeyLen {
		return "", bad
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return "", bad
		}
	}
	return key, nil
}

// fingerprint is a digest of a JSON body that ignores what JSON does not
// mean (spacing, the order of an object's members), so a client that
// re-encodes its request for a retry still matches. Numbers keep their
// text.
func fingerprint(body []byte) string {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	canon := body
	if d.Decode(&v) == nil {
		if b, err := json.Marshal(v); err == nil {
			canon = b
		}
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:])
}

func idempotencyProblem(err error) *Problem {
	switch {
	case errors.Is(err, harness.ErrIdempotencyInFlight):
		p := problem(http.StatusConflict, codeIdempotencyKeyInUse, "a request with this "+headerIdempotencyKey+" is still in progress; retry when it has finished")
		p.retryAfter = retryInUse
		return p
	case errors.Is(err, harness.ErrIdempotencyMismatch):
		return problem(http.StatusUnprocessableEntity, codeIdempotencyKeyReused, "this "+headerIdempotencyKey+" was used with a different request body; use a new key for a new request")
	}
	return nil
}

// submitOnce submits under the request's idempotency key, if it has one.
func (h *handlers) submitOnce(c echo.Context, key string, body []byte, submit func(context.Context, string) (*harness.Execution, error)) (*harness.Execution, error) {
	ctx := c.Request().Context()
	if key == "" {
		return submit(ctx, "")
	}
	k := harness.IdempotencyKey{Principal: principal(c).Name, Scope: "POST /v1/executions", Key: key, Fingerprint: fingerprint(body)}
	ex, replayed, err := h.Executions.SubmitIdempotent(ctx, k, submit)
	if replayed {
		c.Response().Header().Set(headerReplayed, "true")
	}
	return ex, err
}

// storedAnswer is what an idempotent push saves for its replays.
type storedAnswer struct {
	Status int         `json:"status"`
	Answer eventAnswer `json:"answer"`
}

// pushOnce is pushEvent under an idempotency key: a replay answers the
// saved status and body. A retry after a push that did not complete pushes
// again; the event id (the key, when the body has none) makes the inbox
// answer duplicate rather than start a second turn.
func (h *handlers) pushOnce(c echo.Context, name, key string, body []byte) error {
	ctx := c.Request().Context()
	idem := h.Executions.Idempotency()
	k := harness.IdempotencyKey{Principal: principal(c).Name, Scope: "POST /v1/sources/" + name + "/events", Key: key, Fingerprint: fingerprint(body)}
	claim, err := idem.Claim(ctx, k, "")
	if err != nil {
		return err
	}
	if claim.State == harness.ClaimDone {
		var saved storedAnswer
		if err := json.Unmarshal([]byte(claim.Result), &saved); err != nil {
			return err
		}
		c.Response().Header().Set(headerReplayed, "true")
		return c.JSON(saved.Status, saved.Answer)
	}
	status, ans, err := h.push(ctx, name, body, key)
	if err != nil {
		release := idem.Release
		var p *Problem
		if claim.State == harness.ClaimNew && errors.As(err, &p) && p.Status < 500 {
			release = idem.Forget
		}
		if rerr := release(ctx, claim); rerr != nil {
			h.Logger.Warn("idempotency key not released", "err", rerr)
		}
		return err
	}
	saved, _ := json.Marshal(storedAnswer{Status: status, Answer: ans})
	if err := idem.Complete(context.WithoutCancel(ctx), claim, string(saved)); err != nil {
		h.Logger.Warn("idempotency key not completed", "source", name, "err", err)
	}
	return c.JSON(status, ans)
}
