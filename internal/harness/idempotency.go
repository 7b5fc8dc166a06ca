package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/store"
)

// Idempotency keys (the Idempotency-Key header of Stripe and of the IETF
// draft draft-ietf-httpapi-idempotency-key-header) let a client retry a
// request that creates something without creating it twice.
//
// A key is claimed before the work and completed after it. The claim
// reserves the id of what the work creates (an execution id), so a retry
// after a crash between the two — when the in-flight lock has lapsed —
// does the work again under the same id, and the work itself is
// idempotent by id (enqueue writes a record only if absent). The record
// lives IdempotencyTTL from the first request; the lock a few seconds.
const (
	IdempotencyTTL  = 24 * time.Hour
	idempotencyLock = 10 * time.Second
)

// Errors of Claim, matched with errors.Is.
var (
	// ErrIdempotencyInFlight: a request with the same key is being served.
	ErrIdempotencyInFlight = errors.New("a request with this idempotency key is in flight")
	// ErrIdempotencyMismatch: the key was used with a different request.
	ErrIdempotencyMismatch = errors.New("this idempotency key was used with a different request")
)

// IdempotencyKey names one logical request.
type IdempotencyKey struct {
	// Principal, Scope and Key together name the record: one client's key
	// on one route (Scope, e.g. "POST /v1/executions") is its own, and
	// never answers another principal.
	Principal string
	Scope     string
	Key       string
	// Fingerprint is a digest of the request; a retry must match it.
	Fingerprint string
}

func (k IdempotencyKey) hash() string {
	sum := sha256.Sum256([]byte(k.Principal + "\x00" + k.Scope + "\x00" + k.Key))
	return hex.EncodeToString(sum[:])
}

// ClaimState says what a claim found.
type ClaimState int

// Claim states.
const (
	// ClaimNew: the first request with this key; nothing was done yet.
	ClaimNew ClaimState = iota
	// ClaimResumed: an earlier request with this key reserved ID and did
	// not complete (it failed, or died); the work may or may not be done.
	ClaimResumed
	// ClaimDone: an earlier request completed; Result is what it saved.
	ClaimDone
)

// Claim is a reservation of an idempotency key.
type Claim struct {
	State ClaimState
	// ID is the id reserved for what the request creates; empty when the
	// claim was made without one.
	ID string
	// Result is what Complete saved (ClaimDone only).
	Result string

	recKey, lockKey, token string
	claimed                time.Time // when the lock was taken, by this process's clock
}

// Idempotency stores idempotency keys in Redis.
type Idempotency struct {
	store *store.Store
	ttl   time.Duration
	lock  time.Duration
}

// NewIdempotency returns the idempotency store over st.
func NewIdempotency(st *store.Store) *Idempotency {
	return &Idempotency{store: st, ttl: IdempotencyTTL, lock: idempotencyLock}
}

// Idempotency is the idempotency store of these executions.
func (e *Executions) Idempotency() *Idempotency { return NewIdempotency(e.store) }

// idemClaimScript reserves a key (KEYS[1] the record, KEYS[2] the in-flight
// lock, which share a hash tag). Run twice with one token (go-redis
// retries), it finds its own lock and answers resumed, which callers treat
// as "may be done": safe, only more careful.
var idemClaimScript = redis.NewScript(`
local fp = redis.call('HGET', KEYS[1], 'fp')
if not fp then
  redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'id', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
  return {'new', ARGV[2], ''}
end
if fp ~= ARGV[1] then return {'mismatch', '', ''} end
local id = redis.call('HGET', KEYS[1], 'id')
local result = redis.call('HGET', KEYS[1], 'result')
if result then return {'done', id, result} end
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[3] then return {'busy', id, ''} end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
return {'resumed', id, ''}
`)

// idemCompleteScript saves the result once and drops the caller's lock.
var idemCompleteScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSETNX', KEYS[1], 'result', ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
return 1
`)

// idemReleaseScript drops the caller's lock and, with ARGV[2] = "forget", the
// record too unless it is complete.
var idemReleaseScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[2])
if ARGV[2] == 'forget' and redis.call('HEXISTS', KEYS[1], 'result') == 0 then
  redis.call('DEL', KEYS[1])
end
return 1
`)

// Claim reserves k for one request, reserving newID for what it creates
// (newID may be empty). It returns ErrIdempotencyMismatch when k was used
// with another fingerprint and ErrIdempotencyInFlight while another request
// holds it.
func (i *Idempotency) Claim(ctx context.Context, k IdempotencyKey, newID string) (*Claim, error) {
	tag := "{idem:" + k.hash() + "}"
	c := &Claim{recKey: i.store.Key(tag, "rec"), lockKey: i.store.Key(tag, "lock"), token: newIdemToken(), claimed: time.Now()}
	res, err := idemClaimScript.Run(ctx, i.store.Client, []string{c.recKey, c.lockKey},
		k.Fingerprint, newID, c.token, i.lock.Milliseconds(), i.ttl.Milliseconds()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("idempotency: claim: %w", err)
	}
	if len(res) != 3 {
		return nil, fmt.Errorf("idempotency: claim: unexpected answer %q", res)
	}
	c.ID, c.Result = res[1], res[2]
	switch res[0] {
	case "new":
		c.State = ClaimNew
	case "resumed":
		c.State = ClaimResumed
	case "done":
		c.State = ClaimDone
	case "busy":
		return nil, ErrIdempotencyInFlight
	default:
		return nil, ErrIdempotencyMismatch
	}
	return c, nil
}

// Complete saves result (non-empty) as the answer of c's key; later claims
// are ClaimDone with it. A result saved earlier is kept. When Redis
// refuses, the error is returned and the completion is retried in the
// background while c's lock stands (see settleLater).
func (i *Idempotency) Complete(ctx context.Context, c *Claim, result string) error {
	complete := func(ctx context.Context) error {
		return idemCompleteScript.Run(ctx, i.store.Client, []string{c.recKey, c.lockKey}, c.token, result).Err()
	}
	if err := complete(ctx); err != nil {
		i.settleLater(c, complete)
		return fmt.Errorf("idempotency: complete: %w", err)
	}
	return nil
}

// Release ends c without a result, keeping the reserved id: the next
// request with the key resumes under it (the work may have been done).
func (i *Idempotency) Release(ctx context.Context, c *Claim) error {
	return i.release(ctx, c, "keep")
}

// Forget ends c and deletes the key unless it is complete: for a request
// refused before anything was written, so the client may correct it and
// send it again under the same key.
func (i *Idempotency) Forget(ctx context.Context, c *Claim) error {
	return i.release(ctx, c, "forget")
}

func (i *Idempotency) release(ctx context.Context, c *Claim, mode string) error {
	release := func(ctx context.Context) error {
		return idemReleaseScript.Run(ctx, i.store.Client, []string{c.recKey, c.lockKey}, c.token, mode).Err()
	}
	if err := release(context.WithoutCancel(ctx)); err != nil {
		i.settleLater(c, release)
		return fmt.Errorf("idempotency: release: %w", err)
	}
	return nil
}

// settleLater retries a release or a completion that Redis refused (most
// often because the master holding the key is failing over: the request
// itself failed for the same reason) until it goes through or c's lock
// would have lapsed by itself. Without it every retry of the request is
// told the key is in flight (409) until the lock lapses, however soon
// Redis is back. Both scripts check the lock's token, so a late retry
// never drops another request's lock.
func (i *Idempotency) settleLater(c *Claim, settle func(context.Context) error) {
	deadline := c.claimed.Add(i.lock)
	go func() {
		for wait := settleFirstRetry; time.Until(deadline) > wait; wait = min(2*wait, settleMaxRetry) {
			time.Sleep(wait)
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			err := settle(ctx)
			cancel()
			if err == nil {
				return
			}
		}
	}()
}

// Bounds of settleLater's retries: soon after a failover's promotion
// (hundreds of milliseconds), and not hammering a Redis that is down.
const (
	settleFirstRetry = 100 * time.Millisecond
	settleMaxRetry   = time.Second
)

// Refused reports whether err is a refusal of a request before anything
// was written (a document that does not validate, a coded harness error),
// after which its idempotency key may be forgotten.
func Refused(err error) bool {
	var ve *fault.ValidationError
	var he *fault.Error
	return errors.As(err, &ve) || errors.As(err, &he)
}

// SubmitIdempotent runs submit (a Submit or SubmitAgent with Request.ID
// set to the id it is given) at most once per key: a retry of a completed
// request returns its execution with replayed true, and a retry after a
// request that ended without completing finds the execution it may have
// created under the reserved id before submitting again under that id.
func (e *Executions) SubmitIdempotent(ctx context.Context, k IdempotencyKey, submit func(ctx context.Context, id string) (*Execution, error)) (ex *Execution, replayed bool, err error) {
	idem := e.Idempotency()
	c, err := idem.Claim(ctx, k, newExecutionID())
	if err != nil {
		return nil, false, err
	}
	switch c.State {
	case ClaimDone:
		ex, err := e.Get(ctx, c.ID)
		return ex, true, err
	case ClaimResumed:
		if ex, err := e.resumeClaimed(ctx, c.ID); err != nil || ex != nil {
			return e.finish(ctx, idem, c, ex, err, true)
		}
	}
	ex, err = submit(ctx, c.ID)
	return e.finish(ctx, idem, c, ex, err, false)
}

// resumeClaimed returns the execution an earlier request created under id,
// or nil when it created none. It is made whole (indexed, and queued again
// while queued): its submitter may have been an older version that died
// between the record and the rest (a second item is harmless, as in
// SubmitOnce).
func (e *Executions) resumeClaimed(ctx context.Context, id string) (*Execution, error) {
	rec, err := e.load(ctx, id)
	if errors.Is(err, fault.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := e.ensure(ctx, rec); err != nil {
		return nil, err
	}
	return &rec.Execution, nil
}

// finish completes or releases c after the work ended with ex or err.
func (e *Executions) finish(ctx context.Context, idem *Idempotency, c *Claim, ex *Execution, err error, replayed bool) (*Execution, bool, error) {
	if err != nil {
		release := idem.Release
		if c.State == ClaimNew && Refused(err) {
			release = idem.Forget
		}
		if rerr := release(ctx, c); rerr != nil {
			// Retried in the background; at worst the lock lapses by
			// itself, and until then a retry is told the key is in flight.
			e.logger.Warn("idempotency key not released", "err", rerr)
		}
		return nil, false, err
	}
	if cerr := idem.Complete(context.WithoutCancel(ctx), c, ex.ID); cerr != nil {
		// The execution exists under the reserved id; a retry once the
		// lock lapses finds it (ClaimResumed).
		e.logger.Warn("idempotency key not completed", "execution", ex.ID, "err", cerr)
	}
	return ex, replayed, nil
}

func newIdemToken() string { return newExecutionID()[3:] }
