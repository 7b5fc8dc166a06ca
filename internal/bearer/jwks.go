package bearer

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"fmt"
	"log/slog"
	"math/big"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// keySet is the issuer's JSON Web Key Set, fetched when first needed and
// again when a token names a key it lacks or it is keysMaxAge old, never
// twice within refreshEvery.
type keySet struct {
	url    string // configured; "" discovers it
	issuer string
	fetch  *fetcher
	logger *slog.Logger
	now    func() time.Time

	cur atomic.Pointer[keys]

	mu         sync.Mutex // one fetch at a time; guards the fields below
	tried      time.Time  // the last fetch's start
	lastErr    error
	discovered string // jwks_uri from the issuer's metadata
}

// keys is one fetched key set.
type keys struct {
	all []key
	at  time.Time
}

// key is one usable public key of the set.
type key struct {
	kid, alg string // alg "" when the key does not say
	pub      any    // *rsa.PublicKey, *ecdsa.PublicKey or ed25519.PublicKey
}

// find returns the key (or keys, when the token names no kid) that may
// have signed a token of alg.
func (ks *keySet) find(ctx context.Context, kid, alg string) (any, error) {
	cur, err := ks.current(ctx)
	if err != nil {
		return nil, err
	}
	if found, ok := cur.match(kid, alg); ok {
		return found, nil
	}
	if kid == "" {
		return nil, refused("the token names no key (kid), and no key of the issuer's fits %s", alg)
	}
	// A key the set lacks: the issuer may have added one since.
	if ks.refresh(ctx, cur) {
		if found, ok := ks.cur.Load().match(kid, alg); ok {
			return found, nil
		}
	}
	return nil, refused("no key of the issuer's has kid %q for %s", clip(kid), alg)
}

// current is the key set, fetched first if there is none or it is old.
// An old set is still used when it cannot be fetched again.
func (ks *keySet) current(ctx context.Context) (*keys, error) {
	cur := ks.cur.Load()
	if cur != nil && ks.now().Sub(cur.at) < keysMaxAge {
		return cur, nil
	}
	ks.refresh(ctx, cur)
	if c := ks.cur.Load(); c != nil {
		return c, nil
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return nil, &unavailableError{err: fmt.Errorf("the issuer's signing keys: %w", ks.lastErr)}
}

// refresh fetches the key set unless another call replaced seen already
// or the last fetch started less than refreshEvery ago. It reports
// whether the set may have changed since seen.
func (ks *keySet) refresh(ctx context.Context, seen *keys) bool {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.cur.Load() != seen {
		return true
	}
	now := ks.now()
	if !ks.tried.IsZero() && now.Sub(ks.tried) < refreshEvery {
		return false
	}
	ks.tried = now
	u, err := ks.jwksURL(ctx)
	if err == nil {
		var set []key
		if set, err = ks.fetchKeys(ctx, u); err == nil {
			ks.cur.Store(&keys{all: set, at: now})
			ks.lastErr = nil
			ks.logger.Info("access tokens: signing keys fetched", "url", u, "keys", len(set))
			return true
		}
	}
	ks.lastErr = err
	ks.logger.Warn("access tokens: cannot fetch the issuer's signing keys", "issuer", ks.issuer, "err", err)
	return false
}

// jwksURL is the configured URL or the issuer's jwks_uri.
func (ks *keySet) jwksURL(ctx context.Context) (string, error) {
	if ks.url != "" {
		return ks.url, nil
	}
	if ks.discovered != "" {
		return ks.discovered, nil
	}
	md, err := discover(ctx, ks.fetch, ks.issuer)
	if err != nil {
		return "", err
	}
	if md.JWKSURI == "" {
		return "", fmt.Errorf("the metadata of %s gives no jwks_uri: configure jwksUrl, or introspectionUrl for tokens that are not JWTs", ks.issuer)
	}
	if !secureURL(md.JWKSURI, true) {
		return "", fmt.Errorf("the metadata of %s gives a jwks_uri that is not https (or http on loopback)", ks.issuer)
	}
	ks.discovered = md.JWKSURI
	return md.JWKSURI, nil
}

// serverMetadata is what the verifier reads of the issuer's metadata.
type serverMetadata struct {
	Issuer  string `json:"issuer"`
	JWKSURI string `json:"jwks_uri"`
}

// discover reads the issuer's metadata: RFC 8414 first, then OpenID
// Connect discovery, with the path-insertion forms for an issuer with a
// path. A document naming another issuer is not used (RFC 8414 §3.3).
func discover(ctx context.Context, f *fetcher, issuer string) (serverMetadata, error) {
	iu, err := url.Parse(issuer)
	if err != nil {
		return serverMetadata{}, fmt.Errorf("issuer: %w", err)
	}
	var tried []string
	for _, u := range credhttp.MetadataURLs(iu) {
		var md serverMetadata
		status, err := f.getJSON(ctx, u, &md)
		switch {
		case err != nil:
			tried = append(tried, err.Error())
		case status != http.StatusOK:
			tried = append(tried, fmt.Sprintf("%s: %d %s", u, status, http.StatusText(status)))
		case md.Issuer != issuer:
			tried = append(tried, fmt.Sprintf("%s names issuer %q, not this one", u, clip(md.Issuer)))
		default:
			return md, nil
		}
	}
	return serverMetadata{}, fmt.Errorf("no metadata of issuer %s: %s", issuer, strings.Join(tried, "; "))
}

// jwk is one JSON Web Key (RFC 7517), public parts only.
type jwk struct {
	Kty    string   `json:"kty"`
	Kid    string   `json:"kid"`
	Use    string   `json:"use"`
	Alg    string   `json:"alg"`
	KeyOps []string `json:"key_ops"`
	Crv    string   `json:"crv"`
	N      string   `json:"n"`
	E      string   `json:"e"`
	X      string   `json:"x"`
	Y      string   `json:"y"`
}

// fetchKeys fetches and parses a key set. Keys patchbay cannot use
// (encryption keys, symmetric keys, unknown types, weak RSA) are left
// out; a set with none left is an error.
func (ks *keySet) fetchKeys(ctx context.Context, u string) ([]key, error) {
	var doc struct {
		Keys []jwk `json:"keys"`
	}
	status, err := ks.fetch.getJSON(ctx, u, &doc)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("%s: %d %s", u, status, http.StatusText(status))
	}
	var out []key
	var skipped []string
	for i, k := range doc.Keys {
		pub, err := k.public()
		if err != nil {
			skipped = append(skipped, fmt.Sprintf("keys[%d] (kid %q): %v", i, clip(k.Kid), err))
			continue
		}
		out = append(out, key{kid: k.Kid, alg: k.Alg, pub: pub})
	}
	if len(skipped) > 0 {
		ks.logger.Debug("access tokens: signing keys left out", "url", u, "keys", strings.Join(skipped, "; "))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no usable signing key", u)
	}
	return out, nil
}

// public parses a signing key's public part.
func (k jwk) public() (any, error) {
	if k.Use != "" && k.Use != "sig" {
		return nil, fmt.Errorf("use %q is not sig", k.Use)
	}
	if len(k.KeyOps) > 0 && !slices.Contains(k.KeyOps, "verify") {
		return nil, fmt.Errorf("key_ops do not include verify")
	}
	switch k.Kty {
	case "RSA":
		n, err := b64int(k.N)
		if err != nil {
			return nil, fmt.Errorf("n: %w", err)
		}
		e, err := b64int(k.E)
		if err != nil || !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31-1 || e.Bit(0) == 0 {
			return nil, fmt.Errorf("e is not a usable exponent")
		}
		if n.BitLen() < 2048 {
			return nil, fmt.Errorf("an RSA key of %d bits is too weak (at least 2048)", n.BitLen())
		}
		return &rsa.PublicKey{N: n, E: int(e.Int64())}, nil
	case "EC":
		var curve elliptic.Curve
		switch k.Crv {
		case "P-256":
			curve = elliptic.P256()
		case "P-384":
			curve = elliptic.P384()
		case "P-521":
			curve = elliptic.P521()
		default:
			return nil, fmt.Errorf("curve %q is not supported", k.Crv)
		}
		size := (curve.Params().BitSize + 7) / 8
		x, errX := b64(k.X)
		y, errY := b64(k.Y)
		if errX != nil || errY != nil || len(x) != size || len(y) != size {
			return nil, fmt.Errorf("x and y must be %d bytes each", size)
		}
		pub, err := ecdsa.ParseUncompressedPublicKey(curve, append(append([]byte{4}, x...), y...))
		if err != nil {
			return nil, err
		}
		return pub, nil
	case "OKP":
		if k.Crv != "Ed25519" {
			return nil, fmt.Errorf("curve %q is not supported", k.Crv)
		}
		x, err := b64(k.X)
		if err != nil || len(x) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("x must be %d bytes", ed25519.PublicKeySize)
		}
		return ed25519.PublicKey(x), nil
	}
	return nil, fmt.Errorf("key type %q is not a signature key patchbay accepts", k.Kty)
}

// match returns the keys that may have signed a token of alg naming kid:
// the one key, or a VerificationKeySet when kid is "" and several fit.
func (ks *keys) match(kid, alg string) (any, bool) {
	var found []jwt.VerificationKey
	for _, k := range ks.all {
		if (kid == "" || k.kid == kid) && (k.alg == "" || k.alg == alg) && fits(alg, k.pub) {
			found = append(found, k.pub)
		}
	}
	switch len(found) {
	case 0:
		return nil, false
	case 1:
		return found[0], true
	}
	return jwt.VerificationKeySet{Keys: found}, true
}

// fits reports whether pub is a key of alg's family (and curve).
func fits(alg string, pub any) bool {
	switch p := pub.(type) {
	case *rsa.PublicKey:
		return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")
	case *ecdsa.PublicKey:
		switch alg {
		case "ES256":
			return p.Curve == elliptic.P256()
		case "ES384":
			return p.Curve == elliptic.P384()
		case "ES512":
			return p.Curve == elliptic.P521()
		}
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}

func b64(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}

func b64int(s string) (*big.Int, error) {
	b, err := b64(s)
	if err != nil || len(b) == 0 {
		return nil, fmt.Errorf("not base64url")
	}
	return new(big.Int).SetBytes(b), nil
}

// clip shortens a value from outside for a message.
func clip(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}
