// Package seal encrypts the small values patchbay keeps in Redis on behalf
// of a caller (OAuth tokens, GitHub App installation tokens), so that a
// copy of the database holds no usable credential.
//
// A sealed value is JSON encrypted with AES-256-GCM and written as
// "v1:<key id>:<base64url(nonce ‖ ciphertext)>". The AES key is derived
// with HKDF-SHA256 from the deployment's 32-byte key (PATCHBAY_SECRET_KEY's
// current key) and a purpose string, so each owner's ciphertexts use a key
// of their own and never mix with another's or with the secret store's.
// The additional data is the owner's label followed by the value's name
// (its Redis key without the prefix), so a value copied under another name
// (one user's token under another user's key) does not decrypt.
package seal

import (
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
)

const (
	format   = "v1"
	nonceLen = 12
)

var keyIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// ErrKeyMismatch is wrapped by Open's error for a value sealed under
// another key, under another name, or tampered with.
var ErrKeyMismatch = errors.New("a stored value does not decrypt (another key, or tampered)")

// ErrKeySize is returned by New for a key that is not 32 bytes.
var ErrKeySize = errors.New("the key must be 32 bytes")

// Box seals and opens values for one owner. It is safe for concurrent use.
type Box struct {
	aead  cipher.AEAD
	keyID string
	label string
}

// New derives the owner's AES key from key (32 bytes) and purpose (the
// HKDF info). label starts the additional data of every value. An empty
// keyID is derived from the key, so replicas sharing a key agree on it.
func New(key []byte, keyID, purpose, label string) (*Box, error) {
	if len(key) != 32 {
		return nil, ErrKeySize
	}
	sub, err := hkdf.Key(sha256.New, key, nil, purpose, 32)
	if err != nil {
		return nil, fmt.Errorf("seal: derive key: %w", err)
	}
	if keyID == "" {
		sum := sha256.Sum256(sub)
		keyID = "o" + hex.EncodeToString(sum[:4])
	}
	if !keyIDRE.MatchString(keyID) {
		return nil, errors.New("seal: the key id must be 1 to 32 letters, digits, '_' or '-'")
	}
	block, err := aes.NewCipher(sub)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return &Box{aead: aead, keyID: keyID, label: label}, nil
}

// KeyID names the key values are sealed under.
func (b *Box) KeyID() string { return b.keyID }

// Seal encrypts v's JSON, bound to name.
func (b *Box) Seal(name string, v any) (string, error) {
	plain, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", name, err)
	}
	nonce := make([]byte, nonceLen, nonceLen+len(plain)+b.aead.Overhead())
	_, _ = rand.Read(nonce) // crypto/rand.Read never fails (Go 1.24+)
	ct := b.aead.Seal(nonce, nonce, plain, []byte(b.label+name))
	return format + ":" + b.keyID + ":" + base64.RawURLEncoding.EncodeToString(ct), nil
}

// Open decrypts stored (sealed under name) into v. Errors never quote the
// plaintext.
func (b *Box) Open(name, stored string, v any) error {
	parts := strings.SplitN(stored, ":", 3)
	if len(parts) != 3 || parts[0] != format {
		return fmt.Errorf("%s is stored in an unknown format", name)
	}
	if parts[1] != b.keyID {
		return fmt.Errorf("%s was encrypted under key %q, not the current %q: %w", name, parts[1], b.keyID, ErrKeyMismatch)
	}
	ct, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(ct) < nonceLen+b.aead.Overhead() {
		return fmt.Errorf("%s is stored in an unknown format", name)
	}
	plain, err := b.aead.Open(nil, ct[:nonceLen], ct[nonceLen:], []byte(b.label+name))
	if err != nil {
		return fmt.Errorf("%s: %w", name, ErrKeyMismatch)
	}
	if err := json.Unmarshal(plain, v); err != nil {
		return fmt.Errorf("decode %s: %w", name, err)
	}
	return nil
}
