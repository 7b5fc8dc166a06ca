// Package secrets owns secret values: where they come from (the
// environment, files, Redis sealed under a Keyring; ChainSecrets tries them
// in order), the rules for their names and sizes, and the Redactor that
// scrubs every value patchbay has resolved from what it stores, shows and
// logs. Gate 6 resolves through a SecretStore at the last moment; the
// providers and the OAuth sign-ins use the same stores and redactor.
package secrets

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"regexp"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/store"
)

// SecretStore resolves a secret's name to its value. Gate 6 is its only
// caller: a value is looked up at the last moment and never stored.
// Implementations must be safe for concurrent use.
type SecretStore interface {
	// Resolve returns the value of name, or an error wrapping
	// ErrSecretNotFound when the store does not hold it. Errors never
	// quote a value.
	Resolve(ctx context.Context, name string) (string, error)
}

// SecretWriter stores a secret's value; PUT /v1/secrets/{name} is its
// caller. Nothing reads a value back out through an API.
type SecretWriter interface {
	Put(ctx context.Context, name, value string) error
}

// Errors of the secret stores.
var (
	// ErrSecretNotFound: the store holds no secret of that name.
	ErrSecretNotFound = errors.New("secret not found")
	// ErrSecretName: the name is not a valid secret name.
	ErrSecretName = errors.New("invalid secret name (1 to 128 letters, digits, '.', '_' or '-')")
	// ErrSecretKeyUnknown: a stored value was encrypted under a key id the
	// keyring no longer holds (a key was dropped from PATCHBAY_SECRET_KEY
	// before Rekey moved its values to a newer key).
	ErrSecretKeyUnknown = errors.New("secret encrypted under an unknown key id")
)

// MaxSecretSize bounds one secret's value, in every store: a secret is a
// password or a token, not a file.
const MaxSecretSize = 64 << 10

// MinSecretSize is the shortest secret any store gives out. A shorter
// value cannot be redacted without shredding ordinary text ("abc" is in
// many words), so it would leak wherever it was echoed: it is refused when
// written and when resolved, with a message saying why.
const MinSecretSize = 8

// ErrSecretTooShort is a secret value shorter than MinSecretSize.
var ErrSecretTooShort = fmt.Errorf("a secret must be at least %d bytes: a shorter value cannot be redacted from output", MinSecretSize)

var validSecretNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// ValidSecretName reports whether name may name a secret: 1 to 128
// letters, digits, '.', '_' and '-'. "." and ".." are refused too, since
// the file store uses the name as a file name.
func ValidSecretName(name string) bool {
	return validSecretNameRE.MatchString(name) && name != "." && name != ".."
}

func checkSecretName(name string) error {
	if !ValidSecretName(name) {
		return fmt.Errorf("secrets: %q: %w", name, ErrSecretName)
	}
	return nil
}

func secretNotFound(kind, name string) error {
	return fmt.Errorf("secrets: %s has no secret %q: %w", kind, name, ErrSecretNotFound)
}

// ChainSecrets returns a store that resolves a name from the first of
// stores that holds it. Any error other than ErrSecretNotFound stops the
// search: falling through to a lower store on an outage would quietly
// send a different value. Nil stores are skipped.
func ChainSecrets(stores ...SecretStore) SecretStore {
	var c secretChain
	for _, s := range stores {
		if s != nil {
			c = append(c, s)
		}
	}
	return c
}

type secretChain []SecretStore

func (c secretChain) Resolve(ctx context.Context, name string) (string, error) {
	if err := checkSecretName(name); err != nil {
		return "", err
	}
	for _, s := range c {
		v, err := s.Resolve(ctx, name)
		if errors.Is(err, ErrSecretNotFound) {
			continue
		}
		if err == nil && len(v) < MinSecretSize {
			return "", fmt.Errorf("secrets: %q: %w", name, ErrSecretTooShort)
		}
		return v, err
	}
	return "", secretNotFound("no store", name)
}

// EnvSecrets reads secrets from environment variables: the secret
// app.password is PATCHBAY_SECRET_APP_PASSWORD (see SecretEnvVar). An empty
// variable counts as unset. Names that differ only in case or in '.', '_'
// and '-' share a variable.
type EnvSecrets struct {
	getenv func(string) string
}

// NewEnvSecrets returns the environment store; getenv is os.Getenv in
// production and a fake in tests.
func NewEnvSecrets(getenv func(string) string) *EnvSecrets {
	return &EnvSecrets{getenv: getenv}
}

// SecretEnvVar is the variable that holds the secret name:
// PATCHBAY_SECRET_ followed by the name upper-cased, with every character
// other than a letter or digit turned into '_'.
func SecretEnvVar(name string) string {
	b := []byte(strings.ToUpper(name))
	for i, c := range b {
		if !('A' <= c && c <= 'Z' || '0' <= c && c <= '9') {
			b[i] = '_'
		}
	}
	return "PATCHBAY_SECRET_" + string(b)
}

// Resolve implements SecretStore.
func (e *EnvSecrets) Resolve(_ context.Context, name string) (string, error) {
	if err := checkSecretName(name); err != nil {
		return "", err
	}
	if v := e.getenv(SecretEnvVar(name)); v != "" {
		return v, nil
	}
	return "", secretNotFound("the environment", name)
}

// FileSecrets reads secrets from a directory holding one file per name
// (Docker and Kubernetes secret mounts), with trailing newlines trimmed so
// that `echo token > dir/name` works. The directory is opened as an
// os.Root on every lookup, so a name can never reach outside it, not even
// through a symbolic link, and a remounted directory is seen at once.
type FileSecrets struct {
	dir string
}

// NewFileSecrets returns the store over dir, which must be a directory.
func NewFileSecrets(dir string) (*FileSecrets, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("secrets: directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("secrets: %s is not a directory", dir)
	}
	return &FileSecrets{dir: dir}, nil
}

// Resolve implements SecretStore.
func (f *FileSecrets) Resolve(_ context.Context, name string) (string, error) {
	if err := checkSecretName(name); err != nil {
		return "", err
	}
	root, err := os.OpenRoot(f.dir)
	if err != nil {
		return "", fmt.Errorf("secrets: open %s: %w", f.dir, err)
	}
	defer root.Close()
	file, err := root.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return "", secretNotFound("directory "+f.dir, name)
	}
	if err != nil {
		return "", fmt.Errorf("secrets: read %q from %s: %w", name, f.dir, err)
	}
	defer file.Close()
	data, err := io.ReadAll(io.LimitReader(file, MaxSecretSize+2))
	if err != nil {
		return "", fmt.Errorf("secrets: read %q from %s: %w", name, f.dir, err)
	}
	v := strings.TrimRight(string(data), "\r\n")
	if len(v) > MaxSecretSize {
		return "", fmt.Errorf("secrets: %q in %s is larger than %d bytes", name, f.dir, MaxSecretSize)
	}
	if v == "" {
		return "", secretNotFound("directory "+f.dir+" (empty file)", name)
	}
	return v, nil
}

// Keyring holds the AES-256 keys that encrypt secrets at rest, newest
// first: the first key encrypts, every key decrypts, so keys can rotate
// without re-encrypting everything at once (RedisSecrets.Rekey does that
// afterwards, when it suits).
//
// ParseKeyring reads it from PATCHBAY_SECRET_KEY, which takes one of two
// forms:
//
//   - A key list, "id:base64key[,id:base64key…]": each key exactly 32 random
//     bytes in base64 (standard or URL alphabet, padded or not), each id 1
//     to 32 letters, digits, '_' or '-'. The first is the current key.
//     Generate one with `openssl rand -base64 32`. This is the form to use
//     in production, and the only one that can rotate.
//   - Anything else is a passphrase, from which the key "k1" is derived with
//     HKDF-SHA256 (no salt, info "patchbay secret key v1"). HKDF does not
//     stretch: a passphrase must be high-entropy (at least 16 bytes; a
//     random string, not a word), or values can be brute-forced from a
//     Redis dump. To move from a passphrase to a key list, keep the derived
//     key as "k1":
//     openssl kdf -keylen 32 -kdfopt digest:SHA256 -kdfopt key:"$PASSPHRASE" -kdfopt info:"patchbay secret key v1" -binary HKDF | base64
//
// A value whose first entry looks like "id:base64…" is read as a key list
// and must then be a valid one: a typo in a key must fail start-up, not
// silently become a passphrase that encrypts under a different key.
type Keyring struct {
	keys []secretKey
}

type secretKey struct {
	id   string
	raw  []byte
	aead cipher.AEAD
}

// Key sizes and the HKDF parameters of the passphrase form.
const (
	SecretKeySize         = 32
	minPassphraseLen      = 16
	passphraseKeyID       = "k1"
	passphraseKDFInfo     = "patchbay secret key v1"
	maxKeyIDLen           = 32
	secretValueFormatV1   = "v1"
	secretAADPrefix       = "patchbay secret\x00"
	secretCiphertextNonce = 12
)

var (
	secretKeyIDRE      = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)
	secretKeyEntryRE   = regexp.MustCompile(`^[A-Za-z0-9_-]+:[A-Za-z0-9+/_=-]{16,}$`)
	secretKeyEncodings = []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding}
)

// ParseKeyring reads PATCHBAY_SECRET_KEY (see Keyring). Its errors never
// quote the value.
func ParseKeyring(s string) (Keyring, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Keyring{}, errors.New("secret key: PATCHBAY_SECRET_KEY is empty")
	}
	first, _, _ := strings.Cut(s, ",")
	if !secretKeyEntryRE.MatchString(strings.TrimSpace(first)) {
		if len(s) < minPassphraseLen {
			return Keyring{}, fmt.Errorf("secret key: a passphrase must be at least %d bytes of random text (or give id:base64key)", minPassphraseLen)
		}
		key, err := hkdf.Key(sha256.New, []byte(s), nil, passphraseKDFInfo, SecretKeySize)
		if err != nil {
			return Keyring{}, fmt.Errorf("secret key: derive: %w", err)
		}
		return NewKeyring(KeyringKey{ID: passphraseKeyID, Key: key})
	}
	var keys []KeyringKey
	for i, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		id, b64, ok := strings.Cut(entry, ":")
		if !ok || !secretKeyIDRE.MatchString(id) {
			return Keyring{}, fmt.Errorf("secret key: entry %d must be id:base64key with an id of 1 to %d letters, digits, '_' or '-'", i, maxKeyIDLen)
		}
		key, ok := decodeSecretKey(b64)
		if !ok {
			return Keyring{}, fmt.Errorf("secret key: entry %d (%s): the key must be %d bytes in base64 (a value of the form id:base64… is read as a key list, not a passphrase)", i, id, SecretKeySize)
		}
		keys = append(keys, KeyringKey{ID: id, Key: key})
	}
	return NewKeyring(keys...)
}

func decodeSecretKey(s string) ([]byte, bool) {
	for _, enc := range secretKeyEncodings {
		if b, err := enc.DecodeString(s); err == nil {
			return b, len(b) == SecretKeySize
		}
	}
	return nil, false
}

// KeyringKey is one key of a Keyring.
type KeyringKey struct {
	ID  string
	Key []byte // 32 bytes
}

// NewKeyring builds a keyring from keys, the current one first.
func NewKeyring(keys ...KeyringKey) (Keyring, error) {
	if len(keys) == 0 {
		return Keyring{}, errors.New("secret key: no key")
	}
	var k Keyring
	seen := map[string]bool{}
	for _, key := range keys {
		if !secretKeyIDRE.MatchString(key.ID) {
			return Keyring{}, fmt.Errorf("secret key: key id %q must be 1 to %d letters, digits, '_' or '-'", key.ID, maxKeyIDLen)
		}
		if seen[key.ID] {
			return Keyring{}, fmt.Errorf("secret key: key id %q given twice", key.ID)
		}
		seen[key.ID] = true
		if len(key.Key) != SecretKeySize {
			return Keyring{}, fmt.Errorf("secret key: key %q must be %d bytes", key.ID, SecretKeySize)
		}
		block, err := aes.NewCipher(key.Key)
		if err != nil {
			return Keyring{}, fmt.Errorf("secret key: %w", err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return Keyring{}, fmt.Errorf("secret key: %w", err)
		}
		k.keys = append(k.keys, secretKey{id: key.ID, raw: bytes.Clone(key.Key), aead: aead})
	}
	return k, nil
}

// Current is the id of the key that encrypts; "" for an empty keyring.
func (k Keyring) Current() string {
	if len(k.keys) == 0 {
		return ""
	}
	return k.keys[0].id
}

// CurrentKey is the current key and its id, for a package that derives
// its own key from PATCHBAY_SECRET_KEY (OAuth tokens) rather than reading
// the variable a second time; nil for an empty keyring.
func (k Keyring) CurrentKey() (id string, key []byte) {
	if len(k.keys) == 0 {
		return "", nil
	}
	return k.keys[0].id, bytes.Clone(k.keys[0].raw)
}

func (k Keyring) key(id string) (cipher.AEAD, bool) {
	for _, key := range k.keys {
		if key.id == id {
			return key.aead, true
		}
	}
	return nil, false
}

// seal encrypts value for name under the current key as
// "v1:<key id>:<base64url(nonce ‖ ciphertext)>". The name is the
// additional data, so a value copied to another name does not decrypt.
func (k Keyring) seal(name, value string) (string, error) {
	if len(k.keys) == 0 {
		return "", errors.New("secrets: no encryption key (PATCHBAY_SECRET_KEY)")
	}
	cur := k.keys[0]
	nonce := make([]byte, secretCiphertextNonce, secretCiphertextNonce+len(value)+cur.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("secrets: nonce: %w", err)
	}
	ct := cur.aead.Seal(nonce, nonce, []byte(value), []byte(secretAADPrefix+name))
	return secretValueFormatV1 + ":" + cur.id + ":" + base64.RawURLEncoding.EncodeToString(ct), nil
}

// open decrypts what seal made, and says which key it used.
func (k Keyring) open(name, stored string) (value, keyID string, err error) {
	parts := strings.SplitN(stored, ":", 3)
	if len(parts) != 3 || parts[0] != secretValueFormatV1 {
		return "", "", fmt.Errorf("secrets: %q is stored in an unknown format", name)
	}
	keyID = parts[1]
	aead, ok := k.key(keyID)
	if !ok {
		return "", keyID, fmt.Errorf("secrets: %q (key %q): %w", name, keyID, ErrSecretKeyUnknown)
	}
	ct, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(ct) < secretCiphertextNonce+aead.Overhead() {
		return "", keyID, fmt.Errorf("secrets: %q is stored in an unknown format", name)
	}
	pt, err := aead.Open(nil, ct[:secretCiphertextNonce], ct[secretCiphertextNonce:], []byte(secretAADPrefix+name))
	if err != nil {
		return "", keyID, fmt.Errorf("secrets: %q does not decrypt under key %q (a different key with that id, or a tampered value)", name, keyID)
	}
	return string(pt), keyID, nil
}

// RedisSecrets keeps secrets in one Redis hash (store.Key("secrets")),
// each value encrypted with AES-256-GCM under the keyring's current key,
// with a random nonce, the key id stored beside it, and the secret's name
// as additional data. Anyone who can read Redis sees the names, not the
// values.
type RedisSecrets struct {
	store *store.Store
	keys  Keyring
}

// NewRedisSecrets returns the Redis store; keys usually come from
// ParseKeyring(PATCHBAY_SECRET_KEY).
func NewRedisSecrets(st *store.Store, keys Keyring) *RedisSecrets {
	return &RedisSecrets{store: st, keys: keys}
}

func (r *RedisSecrets) hashKey() string { return r.store.Key("secrets") }

// Resolve implements SecretStore.
func (r *RedisSecrets) Resolve(ctx context.Context, name string) (string, error) {
	if err := checkSecretName(name); err != nil {
		return "", err
	}
	stored, err := r.store.Client.HGet(ctx, r.hashKey(), name).Result()
	if errors.Is(err, redis.Nil) {
		return "", secretNotFound("Redis", name)
	}
	if err != nil {
		return "", fmt.Errorf("secrets: read %q: %w", name, err)
	}
	v, _, err := r.keys.open(name, stored)
	return v, err
}

// Put implements SecretWriter: it stores value under name, encrypted with
// the current key, replacing any earlier value.
func (r *RedisSecrets) Put(ctx context.Context, name, value string) error {
	if err := checkSecretName(name); err != nil {
		return err
	}
	if len(value) < MinSecretSize {
		return fmt.Errorf("secrets: %q: %w", name, ErrSecretTooShort)
	}
	if len(value) > MaxSecretSize {
		return fmt.Errorf("secrets: the value of %q must be at most %d bytes", name, MaxSecretSize)
	}
	stored, err := r.keys.seal(name, value)
	if err != nil {
		return err
	}
	if err := r.store.Client.HSet(ctx, r.hashKey(), name, stored).Err(); err != nil {
		return fmt.Errorf("secrets: write %q: %w", name, err)
	}
	return nil
}

// secretRekeyScript replaces a field only if it still holds what was read, so a
// Put that lands between the read and the write is never undone. Running
// it twice is harmless.
var secretRekeyScript = redis.NewScript(`
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return 1
end
return 0`)

// Rekey re-encrypts under the current key every value stored under an
// older one, and returns how many it moved. Run it after adding a key at
// the front of PATCHBAY_SECRET_KEY; once it has run on one replica, the
// old key may be dropped from the list. A value no key opens is left as
// it is and reported in the error.
func (r *RedisSecrets) Rekey(ctx context.Context) (int, error) {
	all, err := r.store.Client.HGetAll(ctx, r.hashKey()).Result()
	if err != nil {
		return 0, fmt.Errorf("secrets: rekey: %w", err)
	}
	moved := 0
	var errs []error
	for name, stored := range all {
		v, keyID, err := r.keys.open(name, stored)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if keyID == r.keys.Current() {
			continue
		}
		fresh, err := r.keys.seal(name, v)
		if err != nil {
			return moved, err
		}
		n, err := secretRekeyScript.Run(ctx, r.store.Client, []string{r.hashKey()}, name, stored, fresh).Int()
		if err != nil {
			return moved, fmt.Errorf("secrets: rekey %q: %w", name, err)
		}
		moved += n
	}
	return moved, errors.Join(errs...)
}
