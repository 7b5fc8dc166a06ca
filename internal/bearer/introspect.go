package bearer

import (
	"context"
	"crypto/sha256"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// introspector asks the issuer's RFC 7662 endpoint about tokens that are
// not JWTs, and remembers an active answer for at most introspectionTTL.
type introspector struct {
	url                    string
	clientID, clientSecret string
	fetch                  *fetcher
	now                    func() time.Time

	mu    sync.Mutex
	cache map[[32]byte]cached // by the token's SHA-256, never the token
}

// cached is an active answer: the caller it named, until when it is used.
type cached struct {
	caller string
	until  time.Time
}

// maxCached bounds the cache; past it, expired answers are dropped, and
// all of them if none has expired.
const maxCached = 10_000

// check introspects token and returns its caller's claim value.
func (in *introspector) check(ctx context.Context, v *Verifier, token string) (string, error) {
	sum := sha256.Sum256([]byte(token))
	now := in.now()
	in.mu.Lock()
	c, ok := in.cache[sum]
	in.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.caller, nil
	}

	form := url.Values{"token": {token}, "token_type_hint": {"access_token"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, in.url, strings.NewReader(form.Encode()))
	if err != nil {
		return "", unavailable("introspection: %v", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if in.clientID != "" {
		// RFC 6749 §2.3.1: form-encoded, then Basic.
		req.SetBasicAuth(url.QueryEscape(in.clientID), url.QueryEscape(in.clientSecret))
	}
	var ans map[string]any
	status, err := in.fetch.do(req, &ans)
	if err != nil {
		return "", unavailable("introspection: %v", err)
	}
	switch {
	case status == http.StatusOK:
	case (status == http.StatusBadRequest || status == http.StatusUnauthorized) && ans["active"] == false:
		// Some servers (the MCP TypeScript SDK's demo) answer an
		// unknown token with an error status and active false.
		return "", refused("the issuer says the token is not active")
	default:
		return "", unavailable("introspection: %s answered %d %s", in.url, status, http.StatusText(status))
	}
	caller, until, err := v.checkIntrospection(ans, now)
	if err != nil {
		return "", err
	}
	if ttl := now.Add(introspectionTTL); until.After(ttl) {
		until = ttl
	}
	in.mu.Lock()
	if len(in.cache) >= maxCached {
		for k, c := range in.cache {
			if !now.Before(c.until) {
				delete(in.cache, k)
			}
		}
		if len(in.cache) >= maxCached {
			clear(in.cache)
		}
	}
	in.cache[sum] = cached{caller: caller, until: until}
	in.mu.Unlock()
	return caller, nil
}

// checkIntrospection applies the JWT rules to an introspection answer:
// active, the issuer when it names one, not a refresh token, exp required
// and in the future, nbf past, the audience among aud (or resource). It
// returns the caller and the token's expiry.
func (v *Verifier) checkIntrospection(ans map[string]any, now time.Time) (string, time.Time, error) {
	if ans["active"] != true {
		return "", time.Time{}, refused("the issuer says the token is not active")
	}
	if iss, ok := ans["iss"]; ok && iss != v.o.Issuer {
		return "", time.Time{}, refused("the token's issuer is not %s", v.o.Issuer)
	}
	if ans["token_type"] == "refresh_token" {
		return "", time.Time{}, refused("a refresh token is not an access token")
	}
	exp, ok := ans["exp"].(float64)
	if !ok {
		return "", time.Time{}, refused("the introspection answer gives no exp")
	}
	expiry := time.Unix(int64(exp), 0)
	if !now.Before(expiry.Add(leeway)) {
		return "", time.Time{}, refused("the token has expired")
	}
	if nbf, ok := ans["nbf"].(float64); ok && now.Add(leeway).Before(time.Unix(int64(nbf), 0)) {
		return "", time.Time{}, refused("the token is not valid yet")
	}
	aud, ok := ans["aud"]
	if !ok {
		aud = ans["resource"]
	}
	if !slices.Contains(stringList(aud), v.audience) {
		return "", time.Time{}, refused("the token's audience does not include %s", v.audience)
	}
	caller, err := v.callerOf(ans)
	if err != nil {
		return "", time.Time{}, err
	}
	return caller, expiry, nil
}

// stringList reads a claim that is one string or a list of them.
func stringList(x any) []string {
	switch x := x.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}
