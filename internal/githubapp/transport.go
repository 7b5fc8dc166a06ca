package githubapp

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Transport returns a RoundTripper for server-side code (a provider, or
// a connection's own session) that calls GitHub with the scope's token.
// Requests to the origin of to (the Source's API base URL when to is
// empty; an MCP server's URL for an MCP connection) get
// "Authorization: Bearer <token>"; a 401 invalidates the token and the
// request is sent once more with a fresh one (when its body can be
// replayed, as http.NewRequest arranges for in-memory bodies). Requests
// to any other origin, a redirect to a download host included, go out
// without the token. A nil base is http.DefaultTransport.
func (s *Source) Transport(scope Scope, to string, base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if to == "" {
		to = s.apiBase
	}
	return &transport{s: s, scope: scope, base: base, origin: origin(to)}
}

// Headers are the request headers that carry the scope's token, for a
// caller that sends the request itself (connect.Credentials).
func (s *Source) Headers(ctx context.Context, scope Scope) (map[string]string, error) {
	tok, err := s.Token(ctx, scope)
	if err != nil {
		return nil, err
	}
	return map[string]string{"Authorization": "Bearer " + tok}, nil
}

// Refresh replaces headers the server answered 401 to: the token they
// carry is invalidated and a fresh one minted (harness.
// CredentialRefresher). When the fresh token is the rejected one (GitHub
// refuses a token it has just issued), it is unauthorized rather than
// the same headers again.
func (s *Source) Refresh(ctx context.Context, scope Scope, rejected map[string]string) (map[string]string, error) {
	tok, _ := strings.CutPrefix(rejected["Authorization"], "Bearer ")
	if err := s.Invalidate(ctx, scope, tok); err != nil {
		return nil, err
	}
	h, err := s.Headers(ctx, scope)
	if err != nil {
		return nil, err
	}
	if h["Authorization"] == rejected["Authorization"] {
		return nil, errorf(Unauthorized, "GitHub refused the installation token it had just issued")
	}
	return h, nil
}

type transport struct {
	s      *Source
	scope  Scope
	base   http.RoundTripper
	origin string
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if origin(req.URL.String()) != t.origin {
		return t.base.RoundTrip(req)
	}
	ctx := req.Context()
	tok, err := t.s.Token(ctx, t.scope)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	res, err := t.base.RoundTrip(withToken(req, tok))
	if err != nil || res.StatusCode != http.StatusUnauthorized || (req.Body != nil && req.GetBody == nil) {
		return res, err
	}
	body, err := rewind(req)
	if err != nil {
		return res, nil
	}
	if err := t.s.Invalidate(ctx, t.scope, tok); err != nil {
		return res, nil
	}
	fresh, err := t.s.Token(ctx, t.scope)
	if err != nil || fresh == tok {
		return res, nil
	}
	drain(res)
	retry := withToken(req, fresh)
	retry.Body = body
	return t.base.RoundTrip(retry)
}

// withToken is a copy of req carrying the token.
func withToken(req *http.Request, tok string) *http.Request {
	r := req.Clone(req.Context())
	r.Header.Set("Authorization", "Bearer "+tok)
	return r
}

func rewind(req *http.Request) (io.ReadCloser, error) {
	if req.Body == nil || req.GetBody == nil {
		return nil, nil
	}
	return req.GetBody()
}

func drain(res *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, maxBody))
	_ = res.Body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// origin is scheme://host[:port], lower-cased, with the default port
// dropped, or "" when u does not parse.
func origin(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" {
		return ""
	}
	host := strings.ToLower(p.Host)
	scheme := strings.ToLower(p.Scheme)
	if (scheme == "https" && strings.HasSuffix(host, ":443")) || (scheme == "http" && strings.HasSuffix(host, ":80")) {
		host = host[:strings.LastIndex(host, ":")]
	}
	return scheme + "://" + host
}
