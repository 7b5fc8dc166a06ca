package oauth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// challenge is what a resource server's WWW-Authenticate Bearer challenge
// says (RFC 6750, RFC 9728 §5.1).
type challenge struct {
	ResourceMetadata string `json:"resourceMetadata,omitempty"`
	Scope            string `json:"scope,omitempty"`
	Error            string `json:"error,omitempty"`
}

// resourceMetadata is RFC 9728 protected resource metadata.
type resourceMetadata struct {
	Resource             string   `json:"resource"`
	AuthorizationServers []string `json:"authorization_servers"`
	ScopesSupported      []string `json:"scopes_supported"`
}

// serverMetadata is RFC 8414 (or OpenID Connect discovery) authorization
// server metadata, the fields patchbay uses.
type serverMetadata struct {
	Issuer                            string   `json:"issuer"`
	AuthorizationEndpoint             string   `json:"authorization_endpoint"`
	TokenEndpoint                     string   `json:"token_endpoint"`
	RegistrationEndpoint              string   `json:"registration_endpoint"`
	RevocationEndpoint                string   `json:"revocation_endpoint"`
	ScopesSupported                   []string `json:"scopes_supported"`
	CodeChallengeMethodsSupported     []string `json:"code_challenge_methods_supported"`
	TokenEndpointAuthMethodsSupported []string `json:"token_endpoint_auth_methods_supported"`
	ClientIDMetadataDocumentSupported bool     `json:"client_id_metadata_document_supported"`
	IssParameterSupported             bool     `json:"authorization_response_iss_parameter_supported"`
}

// discovery is everything Begin learns about a connection's servers.
type discovery struct {
	Resource  string // as the resource server publishes it (sent as is)
	PRMScopes []string
	Challenge challenge
	AS        serverMetadata
}

// discover finds the authorization server of c: the challenge (recorded
// by Transport, else a probe), protected resource metadata, then the
// authorization server's metadata. Failures are *FlowError.
func (s *Service) discover(ctx context.Context, c Connection) (discovery, error) {
	server, err := url.Parse(c.ResourceURL)
	if err != nil || (server.Scheme != "http" && server.Scheme != "https") || server.Host == "" {
		return discovery{}, flowErr(KindDiscovery, "The connection's URL is not an http or https URL; fix it in the configuration.")
	}
	if c.Issuer != "" {
		as, err := s.serverMetadata(ctx, c.Issuer)
		if err != nil {
			return discovery{}, err
		}
		return discovery{Resource: c.ResourceURL, AS: as}, nil
	}
	ch, ok := s.recordedChallenge(ctx, c.Name)
	if !ok {
		ch = s.probe(ctx, c.ResourceURL)
	}
	prm, err := s.resourceMetadata(ctx, server, ch)
	if err != nil && ch.ResourceMetadata == "" {
		// A server of the 2025-03-26 revision publishes no resource
		// metadata and is its own authorization server, at its origin.
		if as, aerr := s.serverMetadata(ctx, server.Scheme+"://"+server.Host); aerr == nil {
			s.log.Debug("oauth: no protected resource metadata; the server's origin is its authorization server", "connection", c.Name)
			return discovery{Resource: c.ResourceURL, Challenge: ch, AS: as}, nil
		}
	}
	if err != nil {
		return discovery{}, err
	}
	d := discovery{Resource: prm.Resource, PRMScopes: prm.ScopesSupported, Challenge: ch}
	if d.Resource == "" {
		d.Resource = c.ResourceURL
	}
	var firstErr error
	for _, issuer := range prm.AuthorizationServers {
		as, err := s.serverMetadata(ctx, issuer)
		if err == nil {
			d.AS = as
			return d, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	if firstErr == nil {
		firstErr = flowErr(KindDiscovery, "The server's protected resource metadata names no authorization server, so there is nowhere to sign in.")
	}
	return discovery{}, firstErr
}

// probe sends the request an MCP client starts with, unauthenticated, and
// returns the challenge of a 401 or 403 answer (empty otherwise).
func (s *Service) probe(ctx context.Context, resourceURL string) challenge {
	body := `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"patchbay","version":"oauth-probe"}}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, resourceURL, strings.NewReader(body))
	if err != nil {
		return challenge{}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	hc := *s.http
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := hc.Do(req)
	if err != nil {
		s.log.Debug("oauth: probe failed", "url", resourceURL, "err", err)
		return challenge{}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
		return challenge{}
	}
	ch, _ := bearerChallenge(resp.Header.Values("WWW-Authenticate"))
	return ch
}

// resourceMetadata fetches RFC 9728 metadata: from the challenge's
// resource_metadata when given, else the path-based then the root
// well-known URL. Its resource must be the server's URL or a parent of it.
func (s *Service) resourceMetadata(ctx context.Context, server *url.URL, ch challenge) (resourceMetadata, error) {
	origin := server.Scheme + "://" + server.Host
	var candidates []string
	if ch.ResourceMetadata != "" {
		candidates = append(candidates, ch.ResourceMetadata)
	}
	if p := strings.TrimSuffix(server.EscapedPath(), "/"); p != "" {
		candidates = append(candidates, origin+"/.well-known/oauth-protected-resource"+p)
	}
	candidates = append(candidates, origin+"/.well-known/oauth-protected-resource")
	var tried []string
	for _, u := range candidates {
		var prm resourceMetadata
		status, err := s.fetchJSON(ctx, u, &prm)
		if err != nil || status != http.StatusOK {
			tried = append(tried, fmt.Sprintf("%s (%s)", u, describeFetch(status, err)))
			continue
		}
		if !resourceCovers(prm.Resource, server) {
			return resourceMetadata{}, flowErr(KindDiscovery,
				"The server's protected resource metadata is for %q, not for %s, so patchbay will not send a sign-in for it. Check the connection's URL; if it is right, the server is misconfigured.",
				clip(prm.Resource), server.Redacted())
		}
		return prm, nil
	}
	return resourceMetadata{}, flowErr(KindDiscovery,
		"Could not find the server's OAuth protected resource metadata (RFC 9728); tried %s. Check that the connection's URL is right and that the server supports OAuth sign-in.",
		strings.Join(tried, ", "))
}

// resourceCovers reports whether resource (from metadata) identifies the
// server: same origin, and its path equal to or a parent of the server's.
// An empty resource is taken as the server itself.
func resourceCovers(resource string, server *url.URL) bool {
	if resource == "" {
		return true
	}
	r, err := url.Parse(resource)
	if err != nil || r.Fragment != "" || !sameOrigin(r, server) {
		return false
	}
	rp := strings.TrimSuffix(r.EscapedPath(), "/")
	sp := server.EscapedPath()
	return rp == "" || sp == rp || strings.HasPrefix(sp, rp+"/")
}

// sameOrigin compares scheme, host and port (default ports filled in).
func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

func port(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}

// serverMetadata fetches and checks the authorization server metadata of
// issuer (RFC 8414 §3 and OpenID Connect discovery, with the path-insertion
// forms for issuers that have a path): the issuer in the document must be
// the one asked for, PKCE S256 must be offered, and every endpoint must be
// https (or http on a loopback host).
func (s *Service) serverMetadata(ctx context.Context, issuer string) (serverMetadata, error) {
	iu, err := url.Parse(issuer)
	if err != nil || !credhttp.Secure(iu) || iu.RawQuery != "" || iu.Fragment != "" {
		return serverMetadata{}, flowErr(KindDiscovery, "The authorization server %q is not an https URL (http is accepted on loopback only) without query or fragment.", clip(issuer))
	}
	var tried []string
	var mismatch error
	for _, u := range credhttp.MetadataURLs(iu) {
		var md serverMetadata
		status, err := s.fetchJSON(ctx, u, &md)
		if err != nil || status != http.StatusOK {
			tried = append(tried, fmt.Sprintf("%s (%s)", u, describeFetch(status, err)))
			continue
		}
		if md.Issuer != issuer {
			// RFC 8414 §3.3: the document must not be used. Another
			// well-known location may still hold the right one.
			mismatch = flowErr(KindIssuer,
				"The authorization server metadata at %s names issuer %q, not %q, so it was not used: it may be a spoofed server. Nothing was sent to it; the server must be fixed before signing in.",
				u, clip(md.Issuer), clip(issuer))
			continue
		}
		if err := checkServerMetadata(md); err != nil {
			return serverMetadata{}, err
		}
		return md, nil
	}
	if mismatch != nil {
		return serverMetadata{}, mismatch
	}
	return serverMetadata{}, flowErr(KindDiscovery, "Could not read the metadata of authorization server %s (RFC 8414); tried %s.", clip(issuer), strings.Join(tried, ", "))
}

func checkServerMetadata(md serverMetadata) error {
	if !slices.Contains(md.CodeChallengeMethodsSupported, "S256") {
		return flowErr(KindDiscovery, "The authorization server %s does not offer PKCE with S256 (code_challenge_methods_supported), which MCP requires; patchbay refuses to sign in without it.", clip(md.Issuer))
	}
	for name, raw := range map[string]string{
		"authorization_endpoint": md.AuthorizationEndpoint,
		"token_endpoint":         md.TokenEndpoint,
		"registration_endpoint":  md.RegistrationEndpoint,
		"revocation_endpoint":    md.RevocationEndpoint,
	} {
		required := name == "authorization_endpoint" || name == "token_endpoint"
		if raw == "" && !required {
			continue
		}
		u, err := url.Parse(raw)
		if raw == "" || err != nil || !credhttp.Secure(u) || u.Fragment != "" {
			return flowErr(KindDiscovery, "The authorization server %s gives no usable %s (it must be https, or http on loopback).", clip(md.Issuer), name)
		}
	}
	return nil
}

// fetchJSON GETs u and decodes a 200 answer into v.
func (s *Service) fetchJSON(ctx context.Context, u string, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return resp.StatusCode, nil
	}
	return resp.StatusCode, decodeLimited(resp.Body, v)
}

func decodeLimited(r io.Reader, v any) error {
	b, err := io.ReadAll(io.LimitReader(r, maxDocument+1))
	if err != nil {
		return err
	}
	if len(b) > maxDocument {
		return errors.New("document larger than 1 MiB")
	}
	if err := json.Unmarshal(bytes.TrimSpace(b), v); err != nil {
		return errors.New("not a JSON object of the expected shape")
	}
	return nil
}

func describeFetch(status int, err error) string {
	switch {
	case err != nil:
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return clip(err.Error())
	default:
		return fmt.Sprintf("HTTP %d", status)
	}
}

// clip bounds text from a remote party before it reaches a message, and
// drops control characters.
func clip(s string) string {
	const max = 200
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// bearerChallenge finds the Bearer challenge among WWW-Authenticate values
// (RFC 9110 §11.6.1: several challenges may share one header value).
func bearerChallenge(values []string) (challenge, bool) {
	for _, v := range values {
		for _, c := range parseChallenges(v) {
			if strings.EqualFold(c.scheme, "Bearer") {
				return challenge{ResourceMetadata: c.params["resource_metadata"], Scope: c.params["scope"], Error: c.params["error"]}, true
			}
		}
	}
	return challenge{}, false
}

type authChallenge struct {
	scheme string
	params map[string]string
}

// parseChallenges reads `scheme param=value, param="quoted", scheme2 …`.
// Parameter names are lower-cased; token68 forms are skipped.
func parseChallenges(h string) []authChallenge {
	var out []authChallenge
	p := &headerScanner{s: h}
	for {
		p.skip(" \t,")
		scheme := p.token()
		if scheme == "" {
			if p.done() {
				return out
			}
			p.i++ // not a token: skip a character and go on
			continue
		}
		c := authChallenge{scheme: scheme, params: map[string]string{}}
		for {
			p.skip(" \t")
			save := p.i
			name := p.token()
			p.skip(" \t")
			if name == "" || !p.eat('=') {
				// A new challenge (or token68): give the token back.
				p.i = save
				if name == "" {
					// token68 such as "abc==" or a stray character
					for !p.done() && p.peek() != ',' {
						p.i++
					}
				}
				break
			}
			p.skip(" \t")
			var val string
			if p.peek() == '"' {
				val = p.quoted()
			} else {
				val = p.token()
			}
			c.params[strings.ToLower(name)] = val
			p.skip(" \t")
			if !p.eat(',') {
				break
			}
		}
		out = append(out, c)
		if p.done() {
			return out
		}
	}
}

type headerScanner struct {
	s string
	i int
}

func (p *headerScanner) done() bool { return p.i >= len(p.s) }

func (p *headerScanner) peek() byte {
	if p.done() {
		return 0
	}
	return p.s[p.i]
}

func (p *headerScanner) eat(c byte) bool {
	if p.peek() == c && !p.done() {
		p.i++
		return true
	}
	return false
}

func (p *headerScanner) skip(set string) {
	for !p.done() && strings.IndexByte(set, p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *headerScanner) token() string {
	start := p.i
	for !p.done() && isTokenChar(p.s[p.i]) {
		p.i++
	}
	return p.s[start:p.i]
}

func (p *headerScanner) quoted() string {
	p.i++ // opening quote
	var b strings.Builder
	for !p.done() {
		c := p.s[p.i]
		p.i++
		switch c {
		case '\\':
			if !p.done() {
				b.WriteByte(p.s[p.i])
				p.i++
			}
		case '"':
			return b.String()
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~/:", c) >= 0
}
