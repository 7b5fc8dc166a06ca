package oauth

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness"
)

// What sealed values look like and how the package key is derived.
const (
	sealFormat   = "v1"
	sealAADLabel = "patchbay oauth\x00"
	sealNonce    = 12
	// keyInfo separates this package's key from the secret store's,
	// which uses the same PATCHBAY_SECRET_KEY.
	keyInfo = "patchbay oauth tokens v1"
)

var (
	keyIDRE        = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)
	errKeyMismatch = errors.New("oauth: a stored value does not decrypt (another key, or tampered)")
)

// KeyFromSecretKey returns the current key of PATCHBAY_SECRET_KEY and its
// id, as harness.ParseKeyring reads it (which also checks the value).
// Errors never quote the value.
func KeyFromSecretKey(v string) (id string, key []byte, err error) {
	kr, err := harness.ParseKeyring(v)
	if err != nil {
		return "", nil, err
	}
	id, key = kr.CurrentKey()
	return id, key, nil
}

func newCipher(key []byte, keyID string) (cipher.AEAD, string, error) {
	if len(key) != 32 {
		return nil, "", errors.New("oauth: Options.Key must be 32 bytes (PATCHBAY_SECRET_KEY is required for OAuth connections)")
	}
	sub, err := hkdf.Key(sha256.New, key, nil, keyInfo, 32)
	if err != nil {
		return nil, "", fmt.Errorf("oauth: derive key: %w", err)
	}
	if keyID == "" {
		sum := sha256.Sum256(sub)
		keyID = "o" + hex.EncodeToString(sum[:4])
	}
	if !keyIDRE.MatchString(keyID) {
		return nil, "", errors.New("oauth: Options.KeyID must be 1 to 32 letters, digits, '_' or '-'")
	}
	block, err := aes.NewCipher(sub)
	if err != nil {
		return nil, "", fmt.Errorf("oauth: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, "", fmt.Errorf("oauth: %w", err)
	}
	return aead, keyID, nil
}

// seal encrypts v's JSON as "v1:<key id>:<base64url(nonce ‖ ciphertext)>"
// with name (the Redis key without its prefix) as additional data, so a
// value copied under another key (one user's token under another user's
// name) does not decrypt.
func (s *Service) seal(name string, v any) (string, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("oauth: encode %s: %w", name, err)
	}
	nonce := make([]byte, sealNonce, sealNonce+len(plain)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("oauth: nonce: %w", err)
	}
	ct := s.aead.Seal(nonce, nonce, plain, []byte(sealAADLabel+name))
	return sealFormat + ":" + s.keyID + ":" + base64.RawURLEncoding.EncodeToString(ct), nil
}

func (s *Service) open(name, stored string, v any) error {
	parts := strings.SplitN(stored, ":", 3)
	if len(parts) != 3 || parts[0] != sealFormat {
		return fmt.Errorf("oauth: %s is stored in an unknown format", name)
	}
	if parts[1] != s.keyID {
		return fmt.Errorf("oauth: %s was encrypted under key %q, not the current %q: %w", name, parts[1], s.keyID, errKeyMismatch)
	}
	ct, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(ct) < sealNonce+s.aead.Overhead() {
		return fmt.Errorf("oauth: %s is stored in an unknown format", name)
	}
	plain, err := s.aead.Open(nil, ct[:sealNonce], ct[sealNonce:], []byte(sealAADLabel+name))
	if err != nil {
		return fmt.Errorf("oauth: %s: %w", name, errKeyMismatch)
	}
	if err := json.Unmarshal(plain, v); err != nil {
		return fmt.Errorf("oauth: decode %s: %w", name, err)
	}
	return nil
}

// putSealed stores v encrypted under name; ttl 0 keeps it.
func (s *Service) putSealed(ctx context.Context, name string, v any, ttl time.Duration) error {
	sealed, err := s.seal(name, v)
	if err != nil {
		return err
	}
	if err := s.store.Client.Set(ctx, s.store.Key(name), sealed, ttl).Err(); err != nil {
		return fmt.Errorf("oauth: write %s: %w", name, err)
	}
	return nil
}

// getSealed reads name into v; found is false when there is no such key.
func (s *Service) getSealed(ctx context.Context, name string, v any) (found bool, err error) {
	stored, err := s.store.Client.Get(ctx, s.store.Key(name)).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("oauth: read %s: %w", name, err)
	}
	return true, s.open(name, stored, v)
}

// randomToken returns n random bytes in base64url.
func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
