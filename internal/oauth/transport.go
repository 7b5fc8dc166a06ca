package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// Transport returns a RoundTripper for connection's own session with its
// server (the one that lists tools). It adds the shared token (on a
// per-user connection: the operator's, else the most recently signed-in
// principal's) only to requests for the resource server's origin; a
// request anywhere else, such as a redirect to another origin, goes out
// as it came. With no token the request goes out without one, so a server
// that needs no sign-in for it still answers.
//
// A 401 to a request that carried a token that has a refresh token first
// refreshes it (see Refresh) and sends the request once more. A 401
// answer, or a 403 with error="insufficient_scope", is recorded (its
// challenge guides the next Begin; for insufficient_scope with the union
// of the token's scopes and the challenged ones) and becomes an error
// wrapping connect.ErrNeedsSignIn. A 403 for a scope the token already has
// is ErrInsufficientScope instead: signing in again would not help, so a
// caller that signs in and retries on ErrNeedsSignIn cannot loop.
// Unregistered connections pass through untouched.
func (s *Service) Transport(connection string, base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{s: s, connection: connection, base: base}
}

type transport struct {
	s          *Service
	connection string
	base       http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, ok := t.s.connection(t.connection)
	if !ok {
		return t.base.RoundTrip(req)
	}
	resource, err := url.Parse(c.ResourceURL)
	if err != nil || !sameOrigin(req.URL, resource) {
		return t.base.RoundTrip(req)
	}
	ctx := req.Context()
	principal, err := t.s.discoveryPrincipal(ctx, c)
	if err != nil {
		return nil, err
	}
	rec, err := t.s.validToken(ctx, c.Name, principal)
	var haveToken bool
	switch {
	case err == nil:
		haveToken = true
	case errors.Is(err, connect.ErrNeedsSignIn):
	default:
		return nil, err
	}
	resp, err := t.send(req, rec, haveToken)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusUnauthorized && haveToken && rec.RefreshToken != "" && replayable(req) {
		// A token the server rejects before its expiry (revoked, rotated)
		// is refreshed once, and the request sent again with the new one.
		fresh, rerr := t.s.refreshOnce(ctx, c.Name, principal, rec.AccessToken)
		if rerr == nil && fresh.AccessToken != rec.AccessToken {
			drain(resp.Body)
			if req, err = rewind(req); err != nil {
				return nil, err
			}
			rec = fresh
			if resp, err = t.send(req, rec, true); err != nil {
				return nil, err
			}
		}
	}
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		ch, _ := bearerChallenge(resp.Header.Values("WWW-Authenticate"))
		drain(resp.Body)
		t.s.recordChallenge(ctx, c.Name, ch)
		why := "the server asks for a sign-in (401)"
		if haveToken {
			why = "the server did not accept the token (401)"
		}
		return nil, needsSignIn(c.Name, principal, why)
	case http.StatusForbidden:
		ch, ok := bearerChallenge(resp.Header.Values("WWW-Authenticate"))
		if !ok || ch.Error != "insufficient_scope" {
			return resp, nil
		}
		drain(resp.Body)
		want := strings.Fields(ch.Scope)
		if haveToken && len(want) > 0 && subset(want, rec.Scopes) {
			return nil, fmt.Errorf("oauth: %s wants scope %q: %w", c.Name, clip(ch.Scope), ErrInsufficientScope)
		}
		ch.Scope = strings.Join(union(rec.Scopes, want), " ")
		t.s.recordChallenge(ctx, c.Name, ch)
		return nil, needsSignIn(c.Name, principal, "the server wants more scope ("+clip(strings.Join(want, " "))+")")
	}
	return resp, nil
}

// send sends req, with rec's token when there is one.
func (t *transport) send(req *http.Request, rec record, haveToken bool) (*http.Response, error) {
	out := req
	if haveToken {
		out = req.Clone(req.Context())
		out.Header.Set("Authorization", "Bearer "+rec.AccessToken)
	}
	return t.base.RoundTrip(out)
}

// replayable reports whether req can be sent a second time: it has no
// body, or one it can get again.
func replayable(req *http.Request) bool { return req.Body == nil || req.GetBody != nil }

// rewind returns req with a fresh copy of its body.
func rewind(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.GetBody == nil {
		return req, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, fmt.Errorf("oauth: send the request again: %w", err)
	}
	r2 := req.Clone(req.Context())
	r2.Body = body
	return r2, nil
}

func subset(a, b []string) bool {
	for _, s := range a {
		if !slices.Contains(b, s) {
			return false
		}
	}
	return true
}

// discoveryPrincipal is whose token a connection's own session uses.
func (s *Service) discoveryPrincipal(ctx context.Context, c Connection) (string, error) {
	if !c.PerUser {
		return SharedPrincipal, nil
	}
	n, err := s.store.Client.Exists(ctx, s.store.Key(tokenName(c.Name, SharedPrincipal))).Result()
	if err != nil {
		return "", fmt.Errorf("oauth: read sign-ins of %s: %w", c.Name, err)
	}
	if n > 0 {
		return SharedPrincipal, nil
	}
	latest, err := s.store.Client.ZRevRange(ctx, s.store.Key(signinsName(c.Name)), 0, 0).Result()
	if err != nil {
		return "", fmt.Errorf("oauth: read sign-ins of %s: %w", c.Name, err)
	}
	if len(latest) == 0 {
		return SharedPrincipal, nil
	}
	return latest[0], nil
}

// recordChallenge keeps the latest challenge of a connection for the next
// Begin (for challengeTTL); a failure only costs that guidance.
func (s *Service) recordChallenge(ctx context.Context, connection string, ch challenge) {
	b, _ := json.Marshal(ch)
	if err := s.store.Client.Set(context.WithoutCancel(ctx), s.store.Key(challengeName(connection)), b, challengeTTL).Err(); err != nil {
		s.log.Warn("oauth: could not record the server's challenge", "connection", connection, "err", err)
	}
}

func (s *Service) recordedChallenge(ctx context.Context, connection string) (challenge, bool) {
	b, err := s.store.Client.Get(ctx, s.store.Key(challengeName(connection))).Bytes()
	if err != nil {
		if !errors.Is(err, redis.Nil) {
			s.log.Warn("oauth: could not read the server's challenge", "connection", connection, "err", err)
		}
		return challenge{}, false
	}
	var ch challenge
	if json.Unmarshal(b, &ch) != nil {
		return challenge{}, false
	}
	return ch, true
}
