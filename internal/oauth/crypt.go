package oauth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/seal"
)

// How the package key is derived and what binds a value to its name.
const (
	sealAADLabel = "patchbay oauth\x00"
	// keyInfo separates this package's key from the secret store's,
	// which uses the same PATCHBAY_SECRET_KEY.
	keyInfo = "patchbay oauth tokens v1"
)

var errKeyMismatch = seal.ErrKeyMismatch

// KeyFromSecretKey returns the current key of PATCHBAY_SECRET_KEY and its
// id, as secrets.ParseKeyring reads it (which also checks the value).
// Errors never quote the value.
func KeyFromSecretKey(v string) (id string, key []byte, err error) {
	kr, err := secrets.ParseKeyring(v)
	if err != nil {
		return "", nil, err
	}
	id, key = kr.CurrentKey()
	return id, key, nil
}

func newBox(key []byte, keyID string) (*seal.Box, error) {
	box, err := seal.New(key, keyID, keyInfo, sealAADLabel)
	switch {
	case errors.Is(err, seal.ErrKeySize):
		return nil, errors.New("oauth: Options.Key must be 32 bytes (PATCHBAY_SECRET_KEY is required for OAuth connections)")
	case err != nil:
		return nil, fmt.Errorf("oauth: Options.KeyID: %w", err)
	}
	return box, nil
}

// seal encrypts v's JSON (see package seal) with name (the Redis key
// without its prefix) as additional data, so a value copied under another
// key (one user's token under another user's name) does not decrypt.
func (s *Service) seal(name string, v any) (string, error) {
	sealed, err := s.box.Seal(name, v)
	if err != nil {
		return "", fmt.Errorf("oauth: %w", err)
	}
	return sealed, nil
}

func (s *Service) open(name, stored string, v any) error {
	if err := s.box.Open(name, stored, v); err != nil {
		return fmt.Errorf("oauth: %w", err)
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
