package oauth

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"golang.org/x/oauth2"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// Token endpoint authentication methods patchbay can use, most preferred
// first: patchbay is a confidential client (it keeps secrets encrypted on
// the server), so it asks for a secret when the server allows one.
const (
	authBasic = "client_secret_basic"
	authPost  = "client_secret_post"
	authNone  = "none"
)

var authPreference = []string{authBasic, authPost, authNone}

// Where a client identity came from.
const (
	clientConfigured = "configured"
	clientDocument   = "metadata-document"
	clientRegistered = "registered"
)

// clientReg is how patchbay identifies itself to one authorization server.
type clientReg struct {
	ClientID     string `json:"clientId"`
	ClientSecret string `json:"clientSecret,omitempty"`
	AuthMethod   string `json:"authMethod"`
	// SecretExpiresAt is RFC 7591 client_secret_expires_at (0: never).
	SecretExpiresAt int64  `json:"secretExpiresAt,omitempty"`
	Issuer          string `json:"issuer"`
	Source          string `json:"source"`
}

// authStyle maps the method onto golang.org/x/oauth2 (never auto-detect:
// a server must not see the secret in a form it did not ask for).
func (c clientReg) authStyle() oauth2.AuthStyle {
	if c.AuthMethod == authBasic {
		return oauth2.AuthStyleInHeader
	}
	return oauth2.AuthStyleInParams
}

// secret is the secret to send: none for a public client.
func (c clientReg) secret() string {
	if c.AuthMethod == authNone {
		return ""
	}
	return c.ClientSecret
}

func registrationName(issuer, redirect string) string {
	return "oauth:client:" + digest(issuer+"\n"+redirect)
}

// clientFor returns patchbay's client identity at the discovered server:
// the configured one, else the Client ID Metadata Document URL (when it
// is https and the server accepts such documents), else a registration,
// cached per server and redirect URI or made now (RFC 7591).
func (s *Service) clientFor(ctx context.Context, c Connection, as serverMetadata) (clientReg, error) {
	if c.ClientID != "" && (c.ClientIssuer == "" || c.ClientIssuer == as.Issuer) {
		reg := clientReg{ClientID: c.ClientID, ClientSecret: c.ClientSecret, AuthMethod: authNone, Issuer: as.Issuer, Source: clientConfigured}
		if c.ClientSecret != "" {
			reg.AuthMethod = authBasic
			if m := supportedMethods(as); !slices.Contains(m, authBasic) && slices.Contains(m, authPost) {
				reg.AuthMethod = authPost
			}
		}
		return reg, nil
	}
	if as.ClientIDMetadataDocumentSupported && strings.HasPrefix(s.metadataURL, "https://") {
		return clientReg{ClientID: s.metadataURL, AuthMethod: authNone, Issuer: as.Issuer, Source: clientDocument}, nil
	}
	name := registrationName(as.Issuer, s.redirectURI)
	var cached clientReg
	found, err := s.getSealed(ctx, name, &cached)
	if err != nil {
		s.log.Warn("oauth: cached client registration unreadable; registering again", "issuer", as.Issuer, "err", err)
	}
	if found && err == nil && (cached.SecretExpiresAt == 0 || cached.SecretExpiresAt > s.now().Unix()+60) {
		s.redactor.Add(cached.ClientSecret)
		return cached, nil
	}
	reg, err := s.register(ctx, as)
	if err != nil {
		return clientReg{}, err
	}
	if err := s.putSealed(ctx, name, reg, 0); err != nil {
		return clientReg{}, err
	}
	return reg, nil
}

// supportedMethods is token_endpoint_auth_methods_supported, with RFC
// 8414's default when absent.
func supportedMethods(as serverMetadata) []string {
	if len(as.TokenEndpointAuthMethodsSupported) == 0 {
		return []string{authBasic}
	}
	return as.TokenEndpointAuthMethodsSupported
}

// register performs RFC 7591 dynamic client registration, asking for a
// token endpoint auth method the server supports (and saying which: some
// servers accept token requests only in the method registered).
func (s *Service) register(ctx context.Context, as serverMetadata) (clientReg, error) {
	if as.RegistrationEndpoint == "" {
		return clientReg{}, flowErr(KindRegistration,
			"The authorization server %s does not support dynamic client registration and patchbay has no client there. Register patchbay with it (redirect URI %s) and set auth.oauth.clientId (and clientSecret) in the connection's configuration.",
			clip(as.Issuer), s.redirectURI)
	}
	method := ""
	supported := supportedMethods(as)
	for _, m := range authPreference {
		if slices.Contains(supported, m) {
			method = m
			break
		}
	}
	if method == "" {
		return clientReg{}, flowErr(KindRegistration,
			"The authorization server %s supports none of the client authentication methods patchbay has (%s); it offers %s.",
			clip(as.Issuer), strings.Join(authPreference, ", "), clip(strings.Join(supported, ", ")))
	}
	body, _ := json.Marshal(s.clientMetadata(method, false))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, as.RegistrationEndpoint, bytes.NewReader(body))
	if err != nil {
		return clientReg{}, flowErr(KindRegistration, "The registration endpoint of %s is not a usable URL.", clip(as.Issuer))
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		return clientReg{}, flowErr(KindRegistration, "Could not reach the registration endpoint of %s (%s). Try again later.", clip(as.Issuer), describeFetch(0, err))
	}
	defer resp.Body.Close()
	var out struct {
		ClientID          string `json:"client_id"`
		ClientSecret      string `json:"client_secret"`
		SecretExpiresAt   int64  `json:"client_secret_expires_at"`
		AuthMethod        string `json:"token_endpoint_auth_method"`
		Error             string `json:"error"`
		ErrorDescritption string `json:"error_description"`
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		_ = decodeLimited(resp.Body, &out)
		return clientReg{}, flowErr(KindRegistration, "The authorization server %s refused to register patchbay (HTTP %d %s). Register patchbay there by hand (redirect URI %s) and set auth.oauth.clientId in the configuration.",
			clip(as.Issuer), resp.StatusCode, clip(strings.TrimSpace(out.Error+" "+out.ErrorDescritption)), s.redirectURI)
	}
	if err := decodeLimited(resp.Body, &out); err != nil || out.ClientID == "" {
		return clientReg{}, flowErr(KindRegistration, "The authorization server %s answered the registration without a client_id.", clip(as.Issuer))
	}
	s.redactor.Add(out.ClientSecret)
	reg := clientReg{ClientID: out.ClientID, ClientSecret: out.ClientSecret, SecretExpiresAt: out.SecretExpiresAt, AuthMethod: method, Issuer: as.Issuer, Source: clientRegistered}
	if out.AuthMethod != "" {
		reg.AuthMethod = out.AuthMethod // what the server registered wins
	}
	switch {
	case !slices.Contains(authPreference, reg.AuthMethod):
		return clientReg{}, flowErr(KindRegistration, "The authorization server %s registered patchbay with token endpoint auth method %q, which patchbay does not support.", clip(as.Issuer), clip(reg.AuthMethod))
	case reg.AuthMethod != authNone && reg.ClientSecret == "":
		return clientReg{}, flowErr(KindRegistration, "The authorization server %s registered patchbay for %s but gave no client_secret.", clip(as.Issuer), reg.AuthMethod)
	}
	s.log.Info("oauth: registered client", "issuer", as.Issuer, "authMethod", reg.AuthMethod)
	return reg, nil
}

// clientMetadata is the RFC 7591 client metadata patchbay registers with,
// and (as a Client ID Metadata Document) serves.
func (s *Service) clientMetadata(method string, document bool) map[string]any {
	md := map[string]any{
		"client_name":                "patchbay",
		"client_uri":                 s.publicURL,
		"redirect_uris":              []string{s.redirectURI},
		"grant_types":                []string{"authorization_code", "refresh_token"},
		"response_types":             []string{"code"},
		"token_endpoint_auth_method": method,
		"application_type":           applicationType(s.redirectURI),
	}
	if document {
		md["client_id"] = s.metadataURL
	}
	return md
}

// applicationType is "native" for a loopback redirect (a server run on a
// workstation), "web" otherwise, as OpenID Connect registration expects.
func applicationType(redirect string) string {
	if u, err := url.Parse(redirect); err == nil && credhttp.Loopback(u.Hostname()) {
		return "native"
	}
	return "web"
}

// ClientMetadata is the Client ID Metadata Document to serve at
// ClientMetadataPath: patchbay as a public client with its redirect URI.
func (s *Service) ClientMetadata() []byte {
	b, _ := json.MarshalIndent(s.clientMetadata(authNone, true), "", "  ")
	return b
}

// forgetRegistration drops a cached registration the server no longer
// accepts, so the next sign-in registers again.
func (s *Service) forgetRegistration(ctx context.Context, reg clientReg) {
	if reg.Source != clientRegistered {
		return
	}
	if err := s.store.Client.Del(ctx, s.store.Key(registrationName(reg.Issuer, s.redirectURI))).Err(); err != nil {
		s.log.Warn("oauth: could not drop a refused client registration", "issuer", reg.Issuer, "err", err)
	}
}

// drain reads what is left of a body (bounded) so the connection can be
// reused.
func drain(r io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(r, 4<<10))
	_ = r.Close()
}
