package oauth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/oauth2"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// record is one principal's tokens for one connection, with what a refresh
// or a revocation needs (so neither has to discover again). It is stored
// encrypted; nothing outside this file sees it.
type record struct {
	AccessToken  string    `json:"accessToken"`
	RefreshToken string    `json:"refreshToken,omitempty"`
	Expiry       time.Time `json:"expiry,omitzero"`
	Scopes       []string  `json:"scopes,omitempty"`
	SignedInBy   string    `json:"signedInBy"`
	SignedInAt   time.Time `json:"signedInAt"`
	Issuer       string    `json:"issuer"`
	Resource     string    `json:"resource"`
	TokenURL     string    `json:"tokenUrl"`
	RevokeURL    string    `json:"revokeUrl,omitempty"`
	Client       clientReg `json:"client"`
}

func tokenName(connection, principal string) string {
	return "oauth:token:" + connection + ":" + principalName(principal)
}
func lockName(connection, principal string) string {
	return "oauth:lock:" + connection + ":" + principalName(principal)
}
func signinsName(connection string) string   { return "oauth:signins:" + connection }
func challengeName(connection string) string { return "oauth:challenge:" + connection }

func (s *Service) newRecord(p pending, tok *oauth2.Token) record {
	rec := record{
		AccessToken:  tok.AccessToken,
		RefreshToken: tok.RefreshToken,
		Expiry:       tok.Expiry,
		Scopes:       grantedScopes(tok, p.Scopes),
		SignedInBy:   p.SignedInBy,
		SignedInAt:   s.now(),
		Issuer:       p.Issuer,
		Resource:     p.Resource,
		TokenURL:     p.TokenURL,
		RevokeURL:    p.RevokeURL,
		Client:       p.Client,
	}
	return rec
}

// grantedScopes: the token response's scope, else what was asked for
// (RFC 6749 §5.1: an omitted scope means the requested one).
func grantedScopes(tok *oauth2.Token, requested []string) []string {
	if s, ok := tok.Extra("scope").(string); ok && strings.TrimSpace(s) != "" {
		return strings.Fields(s)
	}
	return requested
}

func (s *Service) saveToken(ctx context.Context, connection, principal string, rec record) error {
	s.redactor.Add(rec.AccessToken, rec.RefreshToken, rec.Client.ClientSecret)
	if err := s.putSealed(ctx, tokenName(connection, principal), rec, 0); err != nil {
		return err
	}
	err := s.store.Client.ZAdd(ctx, s.store.Key(signinsName(connection)), redis.Z{Score: float64(rec.SignedInAt.UnixMilli()), Member: principal}).Err()
	if err != nil {
		return fmt.Errorf("oauth: record sign-in of %s: %w", connection, err)
	}
	return nil
}

// loadToken returns the stored record, or an error wrapping ErrNotSignedIn.
// A record that no longer decrypts (the key changed) counts as none.
func (s *Service) loadToken(ctx context.Context, connection, principal string) (record, error) {
	var rec record
	found, err := s.getSealed(ctx, tokenName(connection, principal), &rec)
	switch {
	case err != nil && errors.Is(err, errKeyMismatch):
		s.log.Warn("oauth: a stored token no longer decrypts (PATCHBAY_SECRET_KEY changed?); sign-in needed", "connection", connection, "principal", principal)
		return record{}, fmt.Errorf("oauth: %s (principal %q): %w", connection, principal, ErrNotSignedIn)
	case err != nil:
		return record{}, err
	case !found:
		return record{}, fmt.Errorf("oauth: %s (principal %q): %w", connection, principal, ErrNotSignedIn)
	}
	s.redactor.Add(rec.AccessToken, rec.RefreshToken, rec.Client.ClientSecret)
	return rec, nil
}

func (s *Service) dropToken(ctx context.Context, connection, principal string) error {
	if err := s.store.Client.Del(ctx, s.store.Key(tokenName(connection, principal))).Err(); err != nil {
		return fmt.Errorf("oauth: delete token of %s: %w", connection, err)
	}
	if err := s.store.Client.ZRem(ctx, s.store.Key(signinsName(connection)), principal).Err(); err != nil {
		return fmt.Errorf("oauth: delete sign-in of %s: %w", connection, err)
	}
	return nil
}

// Headers implements connect.Credentials: the Authorization header with
// the principal's token (per-user connections) or the shared one,
// refreshed first when it expires within RefreshMargin. ok is false for a
// connection not registered for OAuth. No token, or a refresh the server
// refuses (the token is then dropped), is an error wrapping
// connect.ErrNeedsSignIn.
func (s *Service) Headers(ctx context.Context, connection, principal string) (map[string]string, bool, error) {
	c, ok := s.connection(connection)
	if !ok {
		return nil, false, nil
	}
	key, err := principalKey(c, principal)
	if err != nil {
		return nil, true, err
	}
	rec, err := s.validToken(ctx, c.Name, key)
	if err != nil {
		return nil, true, err
	}
	return map[string]string{"Authorization": "Bearer " + rec.AccessToken}, true, nil
}

// SharedHeaders is a connection's discovery-scoped credential: the
// Authorization header with the shared token (the operator's on a
// per-user connection), refreshed first when it expires within
// RefreshMargin. Unlike Transport it never falls back to a principal's
// own token, so what a connection loads for everyone is never read with
// one user's rights. ok is false for a connection not registered for
// OAuth; no shared sign-in is an error wrapping connect.ErrNeedsSignIn.
func (s *Service) SharedHeaders(ctx context.Context, connection string) (map[string]string, bool, error) {
	c, ok := s.connection(connection)
	if !ok {
		return nil, false, nil
	}
	rec, err := s.validToken(ctx, c.Name, SharedPrincipal)
	if err != nil {
		return nil, true, err
	}
	return map[string]string{"Authorization": "Bearer " + rec.AccessToken}, true, nil
}

// Refresh implements connect.CredentialRefresher: the server rejected
// rejected (the headers Headers gave), so the token is refreshed now,
// once across replicas, unless another caller already replaced it. A
// token without a refresh token, or a refresh the server refuses, is an
// error wrapping connect.ErrNeedsSignIn.
func (s *Service) Refresh(ctx context.Context, connection, principal string, rejected map[string]string) (map[string]string, error) {
	c, err := s.mustConnection(connection)
	if err != nil {
		return nil, err
	}
	key, err := principalKey(c, principal)
	if err != nil {
		return nil, err
	}
	token, _ := strings.CutPrefix(rejected["Authorization"], "Bearer ")
	rec, err := s.loadToken(ctx, c.Name, key)
	if errors.Is(err, ErrNotSignedIn) {
		return nil, needsSignIn(c.Name, key, "nobody is signed in")
	}
	if err != nil {
		return nil, err
	}
	if rec.AccessToken == token {
		if rec.RefreshToken == "" {
			return nil, needsSignIn(c.Name, key, "the server did not accept the token and gave no refresh token")
		}
		if rec, err = s.refreshOnce(ctx, c.Name, key, token); err != nil {
			return nil, err
		}
		if rec.AccessToken == token {
			return nil, needsSignIn(c.Name, key, "the server did not accept the token and it could not be refreshed")
		}
	}
	return map[string]string{"Authorization": "Bearer " + rec.AccessToken}, nil
}

func (s *Service) stale(rec record) bool {
	return !rec.Expiry.IsZero() && !s.now().Add(RefreshMargin).Before(rec.Expiry)
}

// fresh reports whether rec needs no refresh: it is not stale and not
// the token the server rejected.
func (s *Service) fresh(rec record, rejected string) bool {
	return !s.stale(rec) && (rejected == "" || rec.AccessToken != rejected)
}

func (s *Service) expired(rec record) bool {
	return !rec.Expiry.IsZero() && !s.now().Before(rec.Expiry)
}

// validToken returns a token fit to send, refreshing it when stale.
func (s *Service) validToken(ctx context.Context, connection, principal string) (record, error) {
	rec, err := s.loadToken(ctx, connection, principal)
	if errors.Is(err, ErrNotSignedIn) {
		return record{}, needsSignIn(connection, principal, "nobody is signed in")
	}
	if err != nil || !s.stale(rec) {
		return rec, err
	}
	if rec.RefreshToken == "" {
		if s.expired(rec) {
			_ = s.dropToken(ctx, connection, principal)
			return record{}, needsSignIn(connection, principal, "the token expired and the server gave no refresh token")
		}
		return rec, nil // still valid for a little while
	}
	return s.refreshOnce(ctx, connection, principal, "")
}

// refreshOnce refreshes the token once across replicas: the replica that
// takes the Redis lock refreshes (after reading the token again, as
// another may just have done it); the others wait for the lock to go and
// read what it stored. A token is refreshed when it is stale, or when it
// is the one the server just rejected (rejected; "" for none).
func (s *Service) refreshOnce(ctx context.Context, connection, principal, rejected string) (record, error) {
	lock := s.store.Key(lockName(connection, principal))
	owner := randomToken(16)
	for {
		got, err := s.store.Client.SetNX(ctx, lock, owner, lockTTL).Result()
		if err != nil {
			return record{}, fmt.Errorf("oauth: refresh lock for %s: %w", connection, err)
		}
		if got {
			rec, err := s.refreshLocked(ctx, connection, principal, rejected)
			if uerr := unlockScript.Run(context.WithoutCancel(ctx), s.store.Client, []string{lock}, owner).Err(); uerr != nil && !errors.Is(uerr, redis.Nil) {
				s.log.Warn("oauth: could not release the refresh lock (it expires by itself)", "connection", connection, "err", uerr)
			}
			return rec, err
		}
		// Another replica (or goroutine) refreshes: wait, then read.
		for {
			select {
			case <-ctx.Done():
				return record{}, fmt.Errorf("oauth: waiting for a token refresh of %s: %w", connection, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
			rec, err := s.loadToken(ctx, connection, principal)
			if errors.Is(err, ErrNotSignedIn) {
				return record{}, needsSignIn(connection, principal, "the server refused to refresh the token")
			}
			if err != nil {
				return record{}, err
			}
			if s.fresh(rec, rejected) {
				return rec, nil
			}
			n, err := s.store.Client.Exists(ctx, lock).Result()
			if err != nil {
				return record{}, fmt.Errorf("oauth: refresh lock for %s: %w", connection, err)
			}
			if n == 0 {
				break // the holder gave up without refreshing: try ourselves
			}
		}
	}
}

// unlockScript deletes the lock only if this caller still holds it.
var unlockScript = redis.NewScript(`
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0`)

func (s *Service) refreshLocked(ctx context.Context, connection, principal, rejected string) (record, error) {
	rec, err := s.loadToken(ctx, connection, principal)
	if errors.Is(err, ErrNotSignedIn) {
		return record{}, needsSignIn(connection, principal, "nobody is signed in")
	}
	if err != nil || s.fresh(rec, rejected) {
		return rec, err
	}
	conf := s.config(rec.Client, "", rec.TokenURL, nil)
	// golang.org/x/oauth2 sends grant_type and refresh_token only; the
	// resource (RFC 8707) is added on the way out.
	hc := *s.http
	hc.Transport = formParams{base: transportOf(s.http), add: url.Values{"resource": {rec.Resource}}}
	// The refresh token goes to the token endpoint only (see withClient).
	refresher := credhttp.Client(&hc, credhttp.FollowSameOrigin)
	tok, err := conf.TokenSource(context.WithValue(ctx, oauth2.HTTPClient, refresher), &oauth2.Token{RefreshToken: rec.RefreshToken}).Token()
	if err != nil {
		if isRefusal(err) {
			s.log.Warn("oauth: refresh refused; sign-in needed", "connection", connection, "principal", principal, "reason", describeTokenError(err))
			if derr := s.dropToken(ctx, connection, principal); derr != nil {
				return record{}, derr
			}
			return record{}, needsSignIn(connection, principal, "the server refused to refresh the token ("+describeTokenError(err)+")")
		}
		if !s.expired(rec) {
			s.log.Warn("oauth: refresh failed; using the current token while it lasts", "connection", connection, "principal", principal, "reason", describeTokenError(err))
			return rec, nil
		}
		return record{}, fmt.Errorf("oauth: refresh the token of %s: %s", connection, describeTokenError(err))
	}
	rec.AccessToken = tok.AccessToken
	if tok.RefreshToken != "" {
		rec.RefreshToken = tok.RefreshToken
	}
	rec.Expiry = tok.Expiry
	if sc, ok := tok.Extra("scope").(string); ok && strings.TrimSpace(sc) != "" {
		rec.Scopes = strings.Fields(sc)
	}
	s.redactor.Add(rec.AccessToken, rec.RefreshToken)
	if err := s.putSealed(ctx, tokenName(connection, principal), rec, 0); err != nil {
		return record{}, err
	}
	s.log.Info("oauth: token refreshed", "connection", connection, "principal", principal)
	return rec, nil
}

func transportOf(hc *http.Client) http.RoundTripper {
	if hc.Transport != nil {
		return hc.Transport
	}
	return http.DefaultTransport
}

// formParams adds parameters to a form POST that do not already carry
// them.
type formParams struct {
	base http.RoundTripper
	add  url.Values
}

func (f formParams) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.Body == nil || !strings.HasPrefix(req.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		return f.base.RoundTrip(req)
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, 64<<10))
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	form, err := url.ParseQuery(string(b))
	if err != nil {
		return nil, err
	}
	for k, vs := range f.add {
		if _, ok := form[k]; !ok && len(vs) > 0 && vs[0] != "" {
			form[k] = vs
		}
	}
	body := []byte(form.Encode())
	r2 := req.Clone(req.Context())
	r2.Body = io.NopCloser(bytes.NewReader(body))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r2.ContentLength = int64(len(body))
	r2.Header.Set("Content-Length", strconv.Itoa(len(body)))
	return f.base.RoundTrip(r2)
}

// Account says who is signed in to connection for principal (the shared
// sign-in on a shared connection), without any token. Nobody: an error
// wrapping ErrNotSignedIn.
func (s *Service) Account(ctx context.Context, connection, principal string) (Account, error) {
	c, err := s.mustConnection(connection)
	if err != nil {
		return Account{}, err
	}
	key, err := principalKey(c, principal)
	if err != nil {
		return Account{}, fmt.Errorf("oauth: %s: %w", connection, ErrNotSignedIn)
	}
	rec, err := s.loadToken(ctx, c.Name, key)
	if err != nil {
		return Account{}, err
	}
	return Account{Principal: rec.SignedInBy, Scopes: rec.Scopes, ExpiresAt: rec.Expiry, SignedInAt: rec.SignedInAt}, nil
}

// Disconnect signs principal (the shared sign-in on a shared connection)
// out: the tokens are revoked at the authorization server when it has a
// revocation endpoint (RFC 7009; a failure there is logged, not returned,
// as the tokens are deleted here either way), then deleted. Nobody signed
// in is not an error.
func (s *Service) Disconnect(ctx context.Context, connection, principal string) error {
	c, err := s.mustConnection(connection)
	if err != nil {
		return err
	}
	key, err := principalKey(c, principal)
	if err != nil {
		return err
	}
	rec, err := s.loadToken(ctx, c.Name, key)
	if errors.Is(err, ErrNotSignedIn) {
		return s.dropToken(ctx, c.Name, key)
	}
	if err != nil {
		return err
	}
	if rec.RevokeURL != "" {
		if rec.RefreshToken != "" {
			s.revoke(ctx, c.Name, rec, rec.RefreshToken, "refresh_token")
		}
		s.revoke(ctx, c.Name, rec, rec.AccessToken, "access_token")
	}
	if err := s.dropToken(ctx, c.Name, key); err != nil {
		return err
	}
	s.log.Info("oauth: signed out", "connection", c.Name, "principal", key)
	return nil
}

func (s *Service) revoke(ctx context.Context, connection string, rec record, token, hint string) {
	form := url.Values{"token": {token}, "token_type_hint": {hint}}
	if rec.Client.AuthMethod != authBasic {
		form.Set("client_id", rec.Client.ClientID)
		if sec := rec.Client.secret(); sec != "" {
			form.Set("client_secret", sec)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rec.RevokeURL, strings.NewReader(form.Encode()))
	if err != nil {
		s.log.Warn("oauth: revocation endpoint unusable", "connection", connection)
		return
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if rec.Client.AuthMethod == authBasic {
		req.SetBasicAuth(url.QueryEscape(rec.Client.ClientID), url.QueryEscape(rec.Client.ClientSecret))
	}
	resp, err := s.http.Do(req)
	if err != nil {
		s.log.Warn("oauth: token revocation failed", "connection", connection, "hint", hint, "err", describeFetch(0, err))
		return
	}
	drain(resp.Body)
	if resp.StatusCode != http.StatusOK {
		s.log.Warn("oauth: token revocation refused", "connection", connection, "hint", hint, "status", resp.StatusCode)
	}
}
