package oauth

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/oauth2"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// pending is one sign-in between Begin and Complete, kept encrypted under
// the hash of its state for StateTTL.
type pending struct {
	Connection   string    `json:"connection"`
	Principal    string    `json:"principal"`  // whose token (SharedPrincipal on a shared connection)
	SignedInBy   string    `json:"signedInBy"` // who clicked Connect
	Session      string    `json:"session"`    // SHA-256 of the browser session id
	Verifier     string    `json:"verifier"`
	Issuer       string    `json:"issuer"`
	IssSupported bool      `json:"issSupported"`
	Resource     string    `json:"resource"`
	Scopes       []string  `json:"scopes,omitempty"`
	AuthURL      string    `json:"authUrl"`
	TokenURL     string    `json:"tokenUrl"`
	RevokeURL    string    `json:"revokeUrl,omitempty"`
	Client       clientReg `json:"client"`
	Started      time.Time `json:"started"`
}

func stateName(state string) string { return "oauth:state:" + digest(state) }

// Begin starts a sign-in to connection for principal from the browser
// session sessionID and returns the authorization URL to send the browser
// to. It discovers the authorization server, settles patchbay's client
// identity there, and stores a single-use state (PKCE verifier inside)
// bound to the session for StateTTL. Failures are *FlowError, except an
// unknown connection (ErrUnknownConnection) and Redis errors.
func (s *Service) Begin(ctx context.Context, connection, principal, sessionID string) (string, error) {
	c, err := s.mustConnection(connection)
	if err != nil {
		return "", err
	}
	if sessionID == "" {
		return "", errors.New("oauth: Begin needs the browser session id")
	}
	key, err := principalKey(c, principal)
	if err != nil {
		return "", err
	}
	d, err := s.discover(ctx, c)
	if err != nil {
		return "", err
	}
	reg, err := s.clientFor(ctx, c, d.AS)
	if err != nil {
		return "", err
	}
	p := pending{
		Connection:   c.Name,
		Principal:    key,
		SignedInBy:   principal,
		Session:      digest(sessionID),
		Verifier:     oauth2.GenerateVerifier(),
		Issuer:       d.AS.Issuer,
		IssSupported: d.AS.IssParameterSupported,
		Resource:     d.Resource,
		Scopes:       chooseScopes(c, d),
		AuthURL:      d.AS.AuthorizationEndpoint,
		TokenURL:     d.AS.TokenEndpoint,
		RevokeURL:    d.AS.RevocationEndpoint,
		Client:       reg,
		Started:      s.now(),
	}
	if p.SignedInBy == "" {
		p.SignedInBy = key
	}
	state := randomToken(32)
	if err := s.putSealed(ctx, stateName(state), p, StateTTL); err != nil {
		return "", err
	}
	conf := s.config(reg, p.AuthURL, p.TokenURL, p.Scopes)
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(p.Verifier), oauth2.SetAuthURLParam("resource", p.Resource)}
	for _, k := range slices.Sorted(maps.Keys(c.AuthParams)) {
		opts = append(opts, oauth2.SetAuthURLParam(k, c.AuthParams[k]))
	}
	u := conf.AuthCodeURL(state, opts...)
	s.log.Info("oauth: sign-in started", "connection", c.Name, "principal", key, "issuer", p.Issuer, "client", reg.Source, "scopes", strings.Join(p.Scopes, " "))
	return u, nil
}

// chooseScopes: the configured scopes joined with those of the server's
// latest challenge (which, after a 403 insufficient_scope, already hold
// the union with what the token had); with neither, the resource's
// scopes_supported; offline_access added when the authorization server
// offers it (a refresh token), unless nothing else is asked for (no scope
// at all lets the server pick its default).
func chooseScopes(c Connection, d discovery) []string {
	scopes := union(c.Scopes, strings.Fields(d.Challenge.Scope))
	if len(scopes) == 0 {
		scopes = slices.Clone(d.PRMScopes)
	}
	if len(scopes) > 0 && slices.Contains(d.AS.ScopesSupported, "offline_access") && !slices.Contains(scopes, "offline_access") {
		scopes = append(scopes, "offline_access")
	}
	return scopes
}

// union keeps the order of first appearance.
func union(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, s := range l {
			if s != "" && !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

func (s *Service) config(reg clientReg, authURL, tokenURL string, scopes []string) *oauth2.Config {
	return &oauth2.Config{
		ClientID:     reg.ClientID,
		ClientSecret: reg.secret(),
		Endpoint:     oauth2.Endpoint{AuthURL: authURL, TokenURL: tokenURL, AuthStyle: reg.authStyle()},
		RedirectURL:  s.redirectURI,
		Scopes:       scopes,
	}
}

// Complete finishes a sign-in from the callback's query: the state must be
// one Begin stored for this same browser session (it is used up either
// way), the response must come from the issuer the sign-in started with
// (RFC 9207: iss is compared when present, and required when the server
// advertises it), then the code is exchanged (with the PKCE verifier and
// the resource) and the tokens stored encrypted. It returns the
// connection and the principal that signed in. Failures are *FlowError.
func (s *Service) Complete(ctx context.Context, sessionID string, query url.Values) (connection, principal string, err error) {
	state := query.Get("state")
	if state == "" || len(state) > 512 {
		return "", "", flowErr(KindState, "The sign-in response carries no valid state, so it cannot be matched to a sign-in that patchbay started. Start again with Connect on the connection's page.")
	}
	raw, err := s.store.Client.GetDel(ctx, s.store.Key(stateName(state))).Result()
	if errors.Is(err, redis.Nil) {
		return "", "", flowErr(KindState, "This sign-in response is expired (a sign-in has %s) or was already used. Start again with Connect on the connection's page.", StateTTL)
	}
	if err != nil {
		return "", "", fmt.Errorf("oauth: read state: %w", err)
	}
	var p pending
	if err := s.open(stateName(state), raw, &p); err != nil {
		return "", "", flowErr(KindState, "This sign-in can no longer be read (the server's key changed). Start again with Connect on the connection's page.")
	}
	if subtle.ConstantTimeCompare([]byte(digest(sessionID)), []byte(p.Session)) != 1 {
		return "", "", flowErr(KindState, "This sign-in was started in a different browser session, so it was refused. Start it again with Connect from this browser.")
	}
	if iss, sent := query["iss"]; sent {
		if len(iss) != 1 || iss[0] != p.Issuer {
			return "", "", flowErr(KindIssuer, "The sign-in response says it comes from %q, but the sign-in was sent to %q. It was refused, since it may come from a different (mix-up) server. Start again; if this repeats, the authorization server is misconfigured.", clip(strings.Join(iss, ",")), clip(p.Issuer))
		}
	} else if p.IssSupported {
		return "", "", flowErr(KindIssuer, "The authorization server %s promises to say who it is in its response (iss), but this response does not, so it was refused. Start again; if this repeats, the server is misconfigured.", clip(p.Issuer))
	}
	if e := query.Get("error"); e != "" {
		if e == "access_denied" {
			return "", "", flowErr(KindDenied, "Access to %s was declined at the authorization server, so nothing was stored. Choose Connect again if you want to allow it.", p.Connection)
		}
		return "", "", flowErr(KindExchange, "The authorization server answered with an error (%s). Start again with Connect; if it repeats, check the connection's OAuth settings.", clip(strings.TrimSpace(e+": "+query.Get("error_description"))))
	}
	c, err := s.mustConnection(p.Connection)
	if err != nil {
		return "", "", err
	}
	code := query.Get("code")
	if code == "" || len(code) > 4096 {
		return "", "", flowErr(KindExchange, "The authorization server sent no authorization code. Start again with Connect.")
	}
	conf := s.config(p.Client, p.AuthURL, p.TokenURL, p.Scopes)
	tok, err := conf.Exchange(s.withClient(ctx), code, oauth2.VerifierOption(p.Verifier), oauth2.SetAuthURLParam("resource", p.Resource))
	if err != nil {
		if isRefusal(err, "invalid_client") {
			s.forgetRegistration(ctx, p.Client)
		}
		return "", "", flowErr(KindExchange, "The authorization server did not exchange the code for a token (%s). Start again with Connect; if it repeats, check the connection's OAuth client settings.", describeTokenError(err))
	}
	rec := s.newRecord(p, tok)
	if err := s.saveToken(ctx, c.Name, p.Principal, rec); err != nil {
		return "", "", err
	}
	// The challenge that led here is answered.
	_ = s.store.Client.Del(ctx, s.store.Key(challengeName(c.Name))).Err()
	s.log.Info("oauth: signed in", "connection", c.Name, "principal", p.Principal, "by", p.SignedInBy, "issuer", p.Issuer, "refreshable", rec.RefreshToken != "")
	return c.Name, p.SignedInBy, nil
}

// describeTokenError is a token endpoint failure in words: the
// endpoint's code and description however x/oauth2 returned them (see
// credhttp.RefusalOf), never the raw body, which may echo what was sent.
func describeTokenError(err error) string {
	return clip(credhttp.DescribeTokenError(err))
}

// isRefusal reports whether the token endpoint refused (an OAuth error or a
// 4xx), as opposed to failing to answer; with codes, only those codes.
func isRefusal(err error, codes ...string) bool {
	r, ok := credhttp.RefusalOf(err)
	if !ok {
		return false
	}
	if len(codes) > 0 {
		return slices.Contains(codes, r.Code)
	}
	return r.Code != "" || r.Status >= 400 && r.Status < 500
}

func principalName(p string) string { return base64.RawURLEncoding.EncodeToString([]byte(p)) }
