package githubapp

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// RefreshBefore is how long before its expiry a cached token is
	// replaced (GitHub's tokens live an hour).
	RefreshBefore = 5 * time.Minute
	// lockTTL bounds one exchange: the replica holding the lock gives up
	// on GitHub by then, and a replica that died holding it delays the
	// others at most this long.
	lockTTL = 20 * time.Second
	// lockPoll is how often a waiting replica looks at the lock besides
	// being woken, so a missed wake-up, or a holder that died (its lock
	// expires), costs at most this much more.
	lockPoll = 250 * time.Millisecond
)

// cachedToken is what the cache keeps, sealed.
type cachedToken struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// flightResult is the error the winner of an exchange leaves for the
// replicas that waited for it (no secret in it).
type flightResult struct {
	Code       Code   `json:"code"`
	Status     int    `json:"status,omitempty"`
	RetryAfter int64  `json:"retryAfterMs,omitempty"`
	Message    string `json:"message"`
}

// delIfEqual deletes KEYS[1] only while it still holds ARGV[1]: a lock
// its owner releases, a token its rejecter invalidates.
var delIfEqual = redis.NewScript(`if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0`)

// Names (without the store prefix) of a scope's keys. The hash tag keeps
// them in one slot on Redis Cluster.
func tokenName(id string) string   { return "ghapp:token:{" + id + "}" }
func lockName(id string) string    { return "ghapp:lock:{" + id + "}" }
func channelName(id string) string { return "ghapp:done:{" + id + "}" }

// failedName holds the error of the flight that held the lock as owner.
func failedName(id, owner string) string { return "ghapp:failed:{" + id + "}:" + owner }

// cached returns the scope's token while it has more than RefreshBefore
// left.
func (s *Source) cached(ctx context.Context, id string) (string, bool, error) {
	raw, err := s.store.Client.Get(ctx, s.store.Key(tokenName(id))).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("githubapp: read the token cache: %w", err)
	}
	var c cachedToken
	if err := s.box.Open(tokenName(id), raw, &c); err != nil {
		// Sealed under a retired key or damaged: mint anew, which
		// overwrites it.
		return "", false, nil
	}
	s.redact(c.Token)
	if !s.now().Before(c.ExpiresAt.Add(-RefreshBefore)) {
		return "", false, nil
	}
	return c.Token, true, nil
}

// mint gets the scope's token once for the cluster: the replica that
// takes the lock exchanges; the others wait for its result.
func (s *Source) mint(ctx context.Context, sc Scope, id string) (string, error) {
	for {
		if tok, ok, err := s.cached(ctx, id); err != nil || ok {
			return tok, err
		}
		owner := randomValue()
		won, err := s.store.Client.SetNX(ctx, s.store.Key(lockName(id)), owner, lockTTL).Result()
		if err != nil {
			return "", fmt.Errorf("githubapp: take the exchange lock: %w", err)
		}
		if won {
			return s.exchangeLocked(ctx, sc, id, owner)
		}
		holder, err := s.store.Client.Get(ctx, s.store.Key(lockName(id))).Result()
		if errors.Is(err, redis.Nil) {
			continue // released meanwhile
		}
		if err != nil {
			return "", fmt.Errorf("githubapp: read the exchange lock: %w", err)
		}
		tok, done, err := s.await(ctx, id, holder)
		if done || err != nil {
			return tok, err
		}
	}
}

// exchangeLocked exchanges while holding the lock, leaves the token in
// the cache or the error under the flight's name, releases the lock and
// wakes the waiters — in that order, so a waiter that sees the lock gone
// finds the result.
func (s *Source) exchangeLocked(ctx context.Context, sc Scope, id, owner string) (string, error) {
	// Never outlive the lock: past its TTL another replica may exchange.
	ctx, cancel := context.WithTimeout(ctx, lockTTL)
	defer cancel()
	tok, err := s.exchangeOnce(ctx, sc, id, owner)
	// Released even when ctx is spent; never another replica's lock.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	_ = delIfEqual.Run(rctx, s.store.Client, []string{s.store.Key(lockName(id))}, owner).Err()
	_ = s.store.Client.Publish(rctx, s.store.Key(channelName(id)), "").Err()
	return tok, err
}

func (s *Source) exchangeOnce(ctx context.Context, sc Scope, id, owner string) (string, error) {
	// Another replica may have finished between our read and our lock.
	if tok, ok, err := s.cached(ctx, id); err != nil || ok {
		return tok, err
	}
	g, err := s.exchange(ctx, sc)
	if err != nil {
		s.leaveError(ctx, id, owner, err)
		return "", err
	}
	return g.Token, s.put(ctx, id, g)
}

// put caches a fresh token until RefreshBefore ahead of its expiry.
func (s *Source) put(ctx context.Context, id string, g grant) error {
	ttl := g.ExpiresAt.Add(-RefreshBefore).Sub(s.now())
	if ttl <= 0 {
		return nil // too short-lived to be worth sharing
	}
	sealed, err := s.box.Seal(tokenName(id), cachedToken{Token: g.Token, ExpiresAt: g.ExpiresAt})
	if err != nil {
		return fmt.Errorf("githubapp: %w", err)
	}
	if err := s.store.Client.Set(ctx, s.store.Key(tokenName(id)), sealed, ttl).Err(); err != nil {
		return fmt.Errorf("githubapp: write the token cache: %w", err)
	}
	return nil
}

// leaveError keeps an *Error for the flight's waiters for as long as they
// could be waiting. Anything else is not passed on: they try themselves.
func (s *Source) leaveError(ctx context.Context, id, owner string, err error) {
	var e *Error
	if !errors.As(err, &e) {
		return
	}
	text := e.Message
	if e.Err != nil {
		text += ": " + e.Err.Error()
	}
	msg, _ := json.Marshal(flightResult{Code: e.Code, Status: e.Status, RetryAfter: e.RetryAfter.Milliseconds(), Message: text})
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = s.store.Client.Set(rctx, s.store.Key(failedName(id, owner)), msg, lockTTL).Err()
}

// await waits for the flight holding the lock as holder: done with the
// token or that flight's error once it has finished, not done when it
// ended without either (the lock is free to take).
func (s *Source) await(ctx context.Context, id, holder string) (tok string, done bool, err error) {
	sub := s.store.Client.Subscribe(ctx, s.store.Key(channelName(id)))
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		return "", false, fmt.Errorf("githubapp: wait for the exchange: %w", err)
	}
	wake := sub.Channel()
	tick := time.NewTicker(lockPoll)
	defer tick.Stop()
	for {
		// Checked after subscribing, so a flight that ended before is
		// seen here and one that ends after wakes us.
		finished, err := s.flightOver(ctx, id, holder)
		if err != nil || finished {
			if err != nil {
				return "", true, err
			}
			tok, ok, err := s.cached(ctx, id)
			return tok, ok || err != nil, err
		}
		select {
		case <-wake:
		case <-tick.C:
		case <-ctx.Done():
			return "", true, &Error{Code: Network, Message: "waiting for another replica's exchange", Err: ctx.Err()}
		}
	}
}

// flightOver reports whether holder's flight has ended (its lock is gone
// or replaced); its error, when it left one, is err.
func (s *Source) flightOver(ctx context.Context, id, holder string) (bool, error) {
	cur, err := s.store.Client.Get(ctx, s.store.Key(lockName(id))).Result()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return false, fmt.Errorf("githubapp: wait for the exchange: %w", err)
	case cur == holder:
		return false, nil
	}
	raw, err := s.store.Client.Get(ctx, s.store.Key(failedName(id, holder))).Result()
	if errors.Is(err, redis.Nil) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("githubapp: read the exchange's result: %w", err)
	}
	var r flightResult
	if json.Unmarshal([]byte(raw), &r) != nil || r.Code == "" {
		return true, nil
	}
	return true, &Error{Code: r.Code, Status: r.Status, RetryAfter: time.Duration(r.RetryAfter) * time.Millisecond, Message: r.Message}
}

// drop deletes the scope's cached token if it is rejected.
func (s *Source) drop(ctx context.Context, id, rejected string) error {
	key := s.store.Key(tokenName(id))
	raw, err := s.store.Client.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("githubapp: read the token cache: %w", err)
	}
	var c cachedToken
	if err := s.box.Open(tokenName(id), raw, &c); err == nil && c.Token != rejected {
		return nil
	}
	if err := delIfEqual.Run(ctx, s.store.Client, []string{key}, raw).Err(); err != nil {
		return fmt.Errorf("githubapp: invalidate the cached token: %w", err)
	}
	return nil
}

func (s *Source) redact(secret string) {
	if secret != "" {
		s.redactor.Add(secret)
	}
}

func randomValue() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}
