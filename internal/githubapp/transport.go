package githubapp

import (
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Transport returns a RoundTripper for server-side code that calls
// GitHub's REST API with the scope's token. Requests to the Source's API
// origin get "Authorization: Bearer <token>"; a 401 invalidates the token
// and the request is sent once more with a fresh one (when its body can
// be replayed, as http.NewRequest arranges for in-memory bodies).
// Requests to any other origin, a redirect to a download host included,
// go out without the token. A nil base is http.DefaultTransport.
func (s *Source) Transport(scope Scope, base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{s: s, scope: scope, base: base, origin: origin(s.apiBase)}
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
