// Package credhttp owns the rules for patchbay's own HTTP requests that
// carry a credential — an API's configured headers, a caller's token, a
// GitHub App JWT or installation token, a service account's assertion:
// which redirects such a request follows and what crosses one, and how a
// token endpoint's refusal is put into words. The OpenAPI, Drive and
// GitHub App clients and the OAuth refresh all use it, so the rule is
// written once; an MCP connection's client follows KeepOrigin. It is not
// in DESIGN.md's layout: it imports nothing internal, so the providers,
// oauth and config can all depend on it.
//
// # Redirects
//
// A credential belongs to the origin (scheme, host and port) the request
// was addressed to. net/http keeps Authorization across a redirect to the
// same host name on another port and every other header (X-Api-Key, a
// filled-in secret) everywhere, and re-sends a 307/308 body wherever the
// Location points. Client wraps an *http.Client so that a redirect is
// followed only when:
//
//   - the client's mode allows it (FollowNone never; FollowSameOrigin
//     within the first request's origin; FollowAnyOrigin anywhere);
//   - the redirected request is a GET or HEAD (a 307/308 of a write would
//     send its body, and a write goes only where it was addressed;
//     net/http turns a 301/302/303 answer to a POST into a GET);
//   - it does not leave https for http;
//   - it is at most the MaxRedirects-th.
//
// Once a chain has left the first request's origin, every later request
// of it carries only Accept, Accept-Language and User-Agent: no
// credential, cookie, Referer or header parameter crosses, whatever its
// name. A redirect refused is a *RedirectError (inside net/http's
// *url.Error), naming both ends without their queries.
package credhttp

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Redirects says which redirects a client follows.
type Redirects string

// The modes; the zero value is FollowSameOrigin.
const (
	// FollowNone follows no redirect: the request fails naming where it
	// was sent.
	FollowNone Redirects = "none"
	// FollowSameOrigin follows GET and HEAD redirects within the first
	// request's origin, credentials included.
	FollowSameOrigin Redirects = "same-origin"
	// FollowAnyOrigin also follows GET and HEAD redirects to other
	// origins, without credentials (a download host, say).
	FollowAnyOrigin Redirects = "any"
)

// Modes are the values a config may give, for messages.
var Modes = []Redirects{FollowNone, FollowSameOrigin, FollowAnyOrigin}

// MaxRedirects is the most redirects one request follows (net/http's own
// bound).
const MaxRedirects = 10

// carried are the only headers that cross to another origin.
var carried = []string{"Accept", "Accept-Language", "User-Agent"}

// ParseRedirects reads a config value; "" is FollowSameOrigin.
func ParseRedirects(s string) (Redirects, error) {
	if s == "" {
		return FollowSameOrigin, nil
	}
	if m := Redirects(s); slices.Contains(Modes, m) {
		return m, nil
	}
	return "", fmt.Errorf("followRedirects must be none, same-origin or any, not %q", s)
}

// RedirectError is a redirect that was not followed. From and To are the
// redirecting and redirected URLs without userinfo, query or fragment.
type RedirectError struct {
	From, To string
	Reason   string
}

func (e *RedirectError) Error() string {
	return fmt.Sprintf("redirect from %s to %s not followed: %s", e.From, e.To, e.Reason)
}

// AsRedirect returns the *RedirectError inside err, if there is one.
func AsRedirect(err error) (*RedirectError, bool) {
	var re *RedirectError
	ok := errors.As(err, &re)
	return re, ok
}

// Client returns a copy of c (a new client when c is nil) whose redirects
// follow mode; c's own CheckRedirect, when it has one, is asked after the
// rules here pass.
func Client(c *http.Client, mode Redirects) *http.Client {
	var out http.Client
	if c != nil {
		out = *c
	}
	if mode == "" {
		mode = FollowSameOrigin
	}
	next := out.CheckRedirect
	out.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if err := check(mode, req, via); err != nil {
			return err
		}
		if next != nil {
			return next(req, via)
		}
		return nil
	}
	return &out
}

// KeepOrigin returns a copy of c (a new client when c is nil) that follows
// a redirect of any method within the first request's origin and none
// beyond it, never off https and at most MaxRedirects. It serves clients
// whose every request carries the credential and whose redirects are the
// server's own layout (an MCP connection: a server mounted at /mcp/
// answers /mcp with a 307); c's own CheckRedirect is asked after.
func KeepOrigin(c *http.Client) *http.Client {
	var out http.Client
	if c != nil {
		out = *c
	}
	next := out.CheckRedirect
	out.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if err := bounded(req, via); err != nil {
			return err
		}
		if first := via[0]; Origin(req.URL) != Origin(first.URL) {
			return refusal(req, via, "it leads away from %s, and credentials go only there", Origin(first.URL))
		}
		if next != nil {
			return next(req, via)
		}
		return nil
	}
	return &out
}

// refusal is the error of a redirect to req not followed.
func refusal(req *http.Request, via []*http.Request, format string, args ...any) error {
	return &RedirectError{From: Show(via[len(via)-1].URL), To: Show(req.URL), Reason: fmt.Sprintf(format, args...)}
}

// bounded refuses a redirect past MaxRedirects or off https, whatever the
// mode.
func bounded(req *http.Request, via []*http.Request) error {
	prev := via[len(via)-1]
	switch {
	case len(via) >= MaxRedirects:
		return refusal(req, via, "more than %d redirects", MaxRedirects)
	case strings.EqualFold(prev.URL.Scheme, "https") && !strings.EqualFold(req.URL.Scheme, "https"):
		return refusal(req, via, "it leaves https for %s", req.URL.Scheme)
	}
	return nil
}

// check applies mode's rules to req, the request a redirect leads to;
// via are the requests sent so far, the first one first.
func check(mode Redirects, req *http.Request, via []*http.Request) error {
	first := via[0]
	refuse := func(format string, args ...any) error { return refusal(req, via, format, args...) }
	if mode == FollowNone {
		return refuse("this connection follows no redirects")
	}
	if err := bounded(req, via); err != nil {
		return err
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		return refuse("a %s goes only where it was addressed", req.Method)
	}
	crossed := false
	for _, r := range append(via[1:len(via):len(via)], req) {
		if Origin(r.URL) != Origin(first.URL) {
			crossed = true
		}
	}
	if !crossed {
		return nil
	}
	if mode != FollowAnyOrigin {
		return refuse("it leads away from %s, and credentials go only there", Origin(first.URL))
	}
	for k := range req.Header {
		if !slices.Contains(carried, http.CanonicalHeaderKey(k)) {
			delete(req.Header, k)
		}
	}
	return nil
}

// Origin is a URL's scheme://host[:port], lower case, without the
// scheme's default port.
func Origin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Host)
	switch {
	case scheme == "http" && strings.HasSuffix(host, ":80"):
		host = strings.TrimSuffix(host, ":80")
	case scheme == "https" && strings.HasSuffix(host, ":443"):
		host = strings.TrimSuffix(host, ":443")
	}
	return scheme + "://" + host
}

// SameOrigin reports whether two URLs share an origin; a URL that does
// not parse shares none.
func SameOrigin(a, b string) bool {
	ua, err := url.Parse(a)
	if err != nil || ua.Host == "" {
		return false
	}
	ub, err := url.Parse(b)
	if err != nil || ub.Host == "" {
		return false
	}
	return Origin(ua) == Origin(ub)
}

// Show is u fit for a message: without userinfo, query or fragment, which
// may hold credentials (a signed download link's, say).
func Show(u *url.URL) string {
	c := *u
	c.User, c.RawQuery, c.Fragment, c.RawFragment, c.ForceQuery = nil, "", "", "", false
	return c.String()
}
