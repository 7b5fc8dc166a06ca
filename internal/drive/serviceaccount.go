package drive

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/jwt"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// googleTokenURL is where a key without token_uri exchanges its
// assertions (every key Google issues names it).
const googleTokenURL = "https://oauth2.googleapis.com/token"

var secretRefRE = regexp.MustCompile(`^\$\{secret:([A-Za-z0-9._-]+)\}$`)

// serviceAccount mints access tokens with the JWT-bearer grant (RFC 7523,
// Google's "server to server" flow): an RS256 assertion signed with the
// key, iss the account's email, aud the token URI, scope, sub the
// delegated user; golang.org/x/oauth2/jwt builds and sends it and reuses
// the token until shortly before it expires.
type serviceAccount struct {
	spec     config.ServiceAccount
	secrets  SecretResolver
	redactor Redactor
	client   *http.Client

	mu      sync.Mutex
	keyHash [32]byte
	source  oauth2.TokenSource
}

// tokenTimeout bounds one token exchange: the exchange runs outside any
// call's context (its token serves many calls).
const tokenTimeout = 30 * time.Second

func newServiceAccount(spec config.ServiceAccount, secrets SecretResolver, redactor Redactor, client *http.Client) *serviceAccount {
	c := *client
	if c.Timeout == 0 {
		c.Timeout = tokenTimeout
	}
	return &serviceAccount{spec: spec, secrets: secrets, redactor: redactor, client: &c}
}

// token is a valid access token. The key is resolved at every call, so a
// key rotated in the secret store takes effect at once (and its tokens
// with it).
func (sa *serviceAccount) token(ctx context.Context) (string, error) {
	raw, err := sa.key(ctx)
	if err != nil {
		return "", err
	}
	src, err := sa.tokenSource(raw)
	if err != nil {
		return "", err
	}
	tok, err := src.Token()
	if err != nil {
		// x/oauth2/jwt keeps only the answer's body: Google's code and
		// description are read from it. A token endpoint echoing the
		// assertion has it cut out; the key is the redactor's.
		if r, ok := credhttp.RefusalOf(err); ok {
			return "", fmt.Errorf("service account token: %s", r)
		}
		return "", fmt.Errorf("service account token: %w", err)
	}
	sa.redactor.Add(tok.AccessToken)
	return tok.AccessToken, nil
}

// invalidate drops the cached token (Drive refused it before it was due
// to expire), so the next call exchanges the key again.
func (sa *serviceAccount) invalidate() {
	sa.mu.Lock()
	sa.source = nil
	sa.mu.Unlock()
}

func (sa *serviceAccount) key(ctx context.Context) (string, error) {
	m := secretRefRE.FindStringSubmatch(strings.TrimSpace(sa.spec.Key))
	if m == nil {
		return "", errors.New("service account key must be a ${secret:NAME} reference")
	}
	if sa.secrets == nil {
		return "", fmt.Errorf("service account key: no secret store to resolve ${secret:%s}", m[1])
	}
	raw, err := sa.secrets.Resolve(ctx, m[1])
	if err != nil {
		return "", fmt.Errorf("service account key ${secret:%s}: %w", m[1], err)
	}
	sa.redactor.Add(raw)
	return raw, nil
}

func (sa *serviceAccount) tokenSource(raw string) (oauth2.TokenSource, error) {
	h := sha256.Sum256([]byte(raw))
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.source != nil && h == sa.keyHash {
		return sa.source, nil
	}
	cfg, err := parseKey([]byte(raw), sa.spec)
	if err != nil {
		return nil, err
	}
	sa.redactor.Add(string(cfg.PrivateKey))
	// The source outlives this call, so it gets a context of its own;
	// the client's timeout bounds a hung exchange.
	ctx := context.WithValue(context.Background(), oauth2.HTTPClient, sa.client)
	sa.source, sa.keyHash = cfg.TokenSource(ctx), h
	return sa.source, nil
}

// keyFile is the part of Google's service account JSON key this uses.
type keyFile struct {
	Type         string `json:"type"`
	ClientEmail  string `json:"client_email"`
	PrivateKey   string `json:"private_key"`
	PrivateKeyID string `json:"private_key_id"`
	TokenURI     string `json:"token_uri"`
}

// parseKey reads a JSON key into the grant's settings. Its errors never
// quote the key.
func parseKey(raw []byte, spec config.ServiceAccount) (*jwt.Config, error) {
	var k keyFile
	if err := json.Unmarshal(raw, &k); err != nil {
		return nil, errors.New("service account key is not JSON (give the key file Google's console downloads)")
	}
	switch {
	case k.Type != "service_account":
		return nil, fmt.Errorf("service account key has type %q, not service_account", k.Type)
	case k.ClientEmail == "":
		return nil, errors.New("service account key has no client_email")
	case !strings.Contains(k.PrivateKey, "PRIVATE KEY"):
		return nil, errors.New("service account key has no PEM private_key")
	}
	tokenURL := k.TokenURI
	if tokenURL == "" {
		tokenURL = googleTokenURL
	}
	if err := checkTokenURL(tokenURL); err != nil {
		return nil, err
	}
	scopes := spec.Scopes
	if len(scopes) == 0 {
		scopes = []string{DefaultScope}
	}
	return &jwt.Config{
		Email: k.ClientEmail, PrivateKey: []byte(k.PrivateKey), PrivateKeyID: k.PrivateKeyID,
		Scopes: scopes, TokenURL: tokenURL, Subject: spec.Subject,
	}, nil
}

// checkTokenURL refuses a token_uri that would send the signed assertion
// in the clear anywhere but this machine.
func checkTokenURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return errors.New("service account key's token_uri is not an absolute URL")
	}
	if u.Scheme == "https" {
		return nil
	}
	if ip := net.ParseIP(u.Hostname()); u.Scheme == "http" && (u.Hostname() == "localhost" || ip != nil && ip.IsLoopback()) {
		return nil
	}
	return errors.New("service account key's token_uri must be https (http only on loopback)")
}
