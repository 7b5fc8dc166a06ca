package secrets_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/harness/secrets"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

func TestValidSecretName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		ok   bool
	}{
		{"app.password", true},
		{"A-b_c.9", true},
		{strings.Repeat("x", 128), true},
		{"...", true},
		{strings.Repeat("x", 129), false},
		{"", false},
		{".", false},
		{"..", false},
		{"a/b", false},
		{"../etc/passwd", false},
		{"a b", false},
		{"é", false},
		{"a:b", false},
	}
	for _, tt := range tests {
		if got := secrets.ValidSecretName(tt.name); got != tt.ok {
			t.Errorf("ValidSecretName(%q) = %v, want %v", tt.name, got, tt.ok)
		}
	}
}

func TestSecretEnvVar(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]string{
		"app.password": "PATCHBAY_SECRET_APP_PASSWORD",
		"linear-token": "PATCHBAY_SECRET_LINEAR_TOKEN",
		"a_b.C-9":      "PATCHBAY_SECRET_A_B_C_9",
	} {
		if got := secrets.SecretEnvVar(name); got != want {
			t.Errorf("SecretEnvVar(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestEnvSecrets(t *testing.T) {
	t.Parallel()
	env := map[string]string{"PATCHBAY_SECRET_APP_PASSWORD": "hunter2-long"}
	s := secrets.NewEnvSecrets(func(k string) string { return env[k] })
	tests := []struct {
		name string
		want string
		err  error
	}{
		{"app.password", "hunter2-long", nil},
		{"app_password", "hunter2-long", nil},
		{"app.token", "", secrets.ErrSecretNotFound},
		{"../x", "", secrets.ErrSecretName},
	}
	for _, tt := range tests {
		got, err := s.Resolve(t.Context(), tt.name)
		if got != tt.want || !errors.Is(err, tt.err) {
			t.Errorf("Resolve(%q) = %q, %v; want %q, %v", tt.name, got, err, tt.want, tt.err)
		}
	}
}

func TestFileSecrets(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	dir := filepath.Join(parent, "secrets")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(path, data string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "app.password"), "hunter2-long\n")
	write(filepath.Join(dir, "crlf"), "line one\r\n")
	write(filepath.Join(dir, "inner.space"), " keep  spaces \n\n")
	write(filepath.Join(dir, "empty"), "\n")
	write(filepath.Join(dir, "big"), strings.Repeat("x", secrets.MaxSecretSize+1))
	write(filepath.Join(parent, "outside"), "must-not-be-read")
	if err := os.Symlink(filepath.Join(parent, "outside"), filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("app.password", filepath.Join(dir, "alias")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}

	s, err := secrets.NewFileSecrets(dir)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		want    string
		err     error
		anyErr  bool
		noQuote string
	}{
		{name: "app.password", want: "hunter2-long"},
		{name: "crlf", want: "line one"},
		{name: "inner.space", want: " keep  spaces "},
		{name: "alias", want: "hunter2-long"},
		{name: "missing", err: secrets.ErrSecretNotFound},
		{name: "empty", err: secrets.ErrSecretNotFound},
		{name: "..", err: secrets.ErrSecretName},
		{name: "../outside", err: secrets.ErrSecretName},
		{name: "escape", anyErr: true, noQuote: "must-not-be-read"},
		{name: "sub", anyErr: true},
		{name: "big", anyErr: true, noQuote: "xxxxxxxx"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := s.Resolve(t.Context(), tt.name)
			switch {
			case tt.anyErr:
				if err == nil || got != "" {
					t.Fatalf("Resolve = %q, %v; want an error", got, err)
				}
				if tt.noQuote != "" && strings.Contains(err.Error(), tt.noQuote) {
					t.Fatalf("error quotes the content: %v", err)
				}
			case got != tt.want || !errors.Is(err, tt.err):
				t.Fatalf("Resolve = %q, %v; want %q, %v", got, err, tt.want, tt.err)
			}
		})
	}

	if _, err := secrets.NewFileSecrets(filepath.Join(parent, "nope")); err == nil {
		t.Error("NewFileSecrets(missing dir) succeeded")
	}
	if _, err := secrets.NewFileSecrets(filepath.Join(parent, "outside")); err == nil {
		t.Error("NewFileSecrets(file) succeeded")
	}
}

// mapSecrets is a SecretStore over a map that may fail.
type mapSecrets struct {
	values map[string]string
	err    error
}

func (f mapSecrets) Resolve(_ context.Context, name string) (string, error) {
	if f.err != nil {
		return "", f.err
	}
	if v, ok := f.values[name]; ok {
		return v, nil
	}
	return "", secrets.ErrSecretNotFound
}

func TestChainSecrets(t *testing.T) {
	t.Parallel()
	outage := errors.New("redis down")
	first := mapSecrets{values: map[string]string{"a": "from-first"}}
	second := mapSecrets{values: map[string]string{"a": "from-second", "b": "from-second"}}
	broken := mapSecrets{err: outage}
	tests := []struct {
		name   string
		stores []secrets.SecretStore
		secret string
		want   string
		err    error
	}{
		{"first wins", []secrets.SecretStore{first, second}, "a", "from-first", nil},
		{"falls through", []secrets.SecretStore{first, second}, "b", "from-second", nil},
		{"nowhere", []secrets.SecretStore{first, second}, "c", "", secrets.ErrSecretNotFound},
		{"error stops", []secrets.SecretStore{first, broken, second}, "b", "", outage},
		{"error after a hit is not reached", []secrets.SecretStore{first, broken}, "a", "from-first", nil},
		{"nil skipped", []secrets.SecretStore{nil, second}, "b", "from-second", nil},
		{"empty chain", nil, "a", "", secrets.ErrSecretNotFound},
		{"bad name", []secrets.SecretStore{first}, "a/b", "", secrets.ErrSecretName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := secrets.ChainSecrets(tt.stores...).Resolve(t.Context(), tt.secret)
			if got != tt.want || !errors.Is(err, tt.err) {
				t.Fatalf("Resolve = %q, %v; want %q, %v", got, err, tt.want, tt.err)
			}
		})
	}
}

func randomSecretKey(t testing.TB) []byte {
	t.Helper()
	k := make([]byte, 32)
	_, _ = rand.Read(k)
	return k
}

func TestParseKeyring(t *testing.T) {
	t.Parallel()
	k1, k2 := randomSecretKey(t), randomSecretKey(t)
	std := base64.StdEncoding.EncodeToString
	tests := []struct {
		name    string
		value   string
		current string
		err     string
	}{
		{name: "one key", value: "k1:" + std(k1), current: "k1"},
		{name: "two keys, first current", value: "new:" + std(k2) + ", old:" + std(k1), current: "new"},
		{name: "url alphabet unpadded", value: "a_b-1:" + base64.RawURLEncoding.EncodeToString(k1), current: "a_b-1"},
		{name: "trailing comma", value: "k1:" + std(k1) + ",", current: "k1"},
		{name: "passphrase", value: "correct horse battery staple", current: "k1"},
		{name: "passphrase with colon", value: "user: Pa55 word but long", current: "k1"},
		{name: "passphrase shaped like a key entry", value: "user:Pa55word-but-long", err: "read as a key list"},
		{name: "passphrase too short", value: "s3cret", err: "at least 16"},
		{name: "empty", value: "  ", err: "empty"},
		{name: "short key", value: "k1:" + std(k1[:31]), err: "entry 0 (k1): the key must be 32 bytes"},
		{name: "typo in second key", value: "k2:" + std(k2) + ",k1:" + std(k1)[:40], err: "entry 1 (k1)"},
		{name: "second entry not a key", value: "k2:" + std(k2) + ",just-a-passphrase", err: "entry 1 must be id:base64key"},
		{name: "duplicate id", value: "k1:" + std(k1) + ",k1:" + std(k2), err: "given twice"},
		{name: "id too long", value: strings.Repeat("i", 33) + ":" + std(k1), err: "entry 0 must be id:base64key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kr, err := secrets.ParseKeyring(tt.value)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want …%s…", err, tt.err)
				}
				for _, k := range [][]byte{k1, k2} {
					if strings.Contains(err.Error(), std(k)[:12]) {
						t.Fatalf("error quotes a key: %v", err)
					}
				}
				return
			}
			if err != nil || kr.Current() != tt.current {
				t.Fatalf("Current = %q, err %v; want %q", kr.Current(), err, tt.current)
			}
		})
	}
}

// The passphrase form derives the key documented on Keyring: this is the
// output of the openssl command given there, so operators can move to the
// key-list form without losing their values.
func TestParseKeyringPassphraseKnownAnswer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	st := storetest.NewEmbedded(t)
	derived, err := secrets.ParseKeyring("correct horse battery staple")
	if err != nil {
		t.Fatal(err)
	}
	listed, err := secrets.ParseKeyring("k1:BQPzv/un7elBIK6gTWFZ4+TO/delsLZn43LafC2pV5M=")
	if err != nil {
		t.Fatal(err)
	}
	if err := secrets.NewRedisSecrets(st, derived).Put(ctx, "app.token", "tok-123456"); err != nil {
		t.Fatal(err)
	}
	if got, err := secrets.NewRedisSecrets(st, listed).Resolve(ctx, "app.token"); err != nil || got != "tok-123456" {
		t.Fatalf("Resolve with the listed key = %q, %v", got, err)
	}
}

func testKeyring(t testing.TB, keys ...secrets.KeyringKey) secrets.Keyring {
	t.Helper()
	kr, err := secrets.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func TestRedisSecrets(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		ctx := t.Context()
		old := secrets.KeyringKey{ID: "k1", Key: randomSecretKey(t)}
		fresh := secrets.KeyringKey{ID: "k2", Key: randomSecretKey(t)}
		v1 := secrets.NewRedisSecrets(st, testKeyring(t, old))
		const value = "s3cr3t-value/with+stuff"

		if _, err := v1.Resolve(ctx, "app.password"); !errors.Is(err, secrets.ErrSecretNotFound) {
			t.Fatalf("Resolve before Put: %v", err)
		}
		if err := v1.Put(ctx, "app.password", value); err != nil {
			t.Fatal(err)
		}
		if got, err := v1.Resolve(ctx, "app.password"); err != nil || got != value {
			t.Fatalf("Resolve = %q, %v", got, err)
		}

		// At rest: the name in the clear, the value not, the key id beside it.
		stored, err := st.Client.HGet(ctx, st.Key("secrets"), "app.password").Result()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(stored, "v1:k1:") || strings.Contains(stored, value) {
			t.Fatalf("stored form = %q", stored)
		}
		// Random nonce: the same value encrypts differently each time.
		if err := v1.Put(ctx, "other", value); err != nil {
			t.Fatal(err)
		}
		other, _ := st.Client.HGet(ctx, st.Key("secrets"), "other").Result()
		if other[len("v1:k1:"):] == stored[len("v1:k1:"):] {
			t.Fatal("two encryptions of one value are equal")
		}
		// A value moved to another name does not decrypt (name is bound).
		if err := st.Client.HSet(ctx, st.Key("secrets"), "moved", stored).Err(); err != nil {
			t.Fatal(err)
		}
		if got, err := v1.Resolve(ctx, "moved"); err == nil || got != "" || strings.Contains(err.Error(), value) {
			t.Fatalf("Resolve(moved) = %q, %v", got, err)
		}
		if err := st.Client.HDel(ctx, st.Key("secrets"), "moved").Err(); err != nil {
			t.Fatal(err)
		}

		// A different key under the same id fails, without quoting anything.
		impostor := secrets.NewRedisSecrets(st, testKeyring(t, secrets.KeyringKey{ID: "k1", Key: randomSecretKey(t)}))
		if got, err := impostor.Resolve(ctx, "app.password"); err == nil || got != "" {
			t.Fatalf("Resolve under a wrong key = %q, %v", got, err)
		}

		// Rotation: k2 in front; old values still open, new ones use k2.
		v2 := secrets.NewRedisSecrets(st, testKeyring(t, fresh, old))
		if got, err := v2.Resolve(ctx, "app.password"); err != nil || got != value {
			t.Fatalf("Resolve after rotation = %q, %v", got, err)
		}
		if err := v2.Put(ctx, "app.token", "token-abcdef"); err != nil {
			t.Fatal(err)
		}
		if s, _ := st.Client.HGet(ctx, st.Key("secrets"), "app.token").Result(); !strings.HasPrefix(s, "v1:k2:") {
			t.Fatalf("new value stored as %q", s)
		}
		onlyNew := secrets.NewRedisSecrets(st, testKeyring(t, fresh))
		if _, err := onlyNew.Resolve(ctx, "app.password"); !errors.Is(err, secrets.ErrSecretKeyUnknown) {
			t.Fatalf("Resolve without the old key: %v", err)
		}
		n, err := v2.Rekey(ctx)
		if err != nil || n != 2 {
			t.Fatalf("Rekey = %d, %v; want 2 (app.password, other)", n, err)
		}
		if n, err := v2.Rekey(ctx); err != nil || n != 0 {
			t.Fatalf("second Rekey = %d, %v", n, err)
		}
		for name, want := range map[string]string{"app.password": value, "other": value, "app.token": "token-abcdef"} {
			if got, err := onlyNew.Resolve(ctx, name); err != nil || got != want {
				t.Fatalf("after Rekey, Resolve(%s) = %q, %v", name, got, err)
			}
		}

		// Bad input.
		if err := v2.Put(ctx, "bad/name", "x-value"); !errors.Is(err, secrets.ErrSecretName) {
			t.Fatalf("Put(bad name) = %v", err)
		}
		if err := v2.Put(ctx, "empty", ""); err == nil {
			t.Fatal("Put(empty value) succeeded")
		}
		if err := secrets.NewRedisSecrets(st, secrets.Keyring{}).Put(ctx, "x", "value"); err == nil {
			t.Fatal("Put without a key succeeded")
		}
	})
}

func TestRedisSecretsConcurrentPut(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		s := secrets.NewRedisSecrets(st, testKeyring(t, secrets.KeyringKey{ID: "k1", Key: randomSecretKey(t)}))
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				if err := s.Put(t.Context(), "shared", strings.Repeat(string(rune('a'+i)), 8)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		got, err := s.Resolve(t.Context(), "shared")
		if err != nil || len(got) != 8 || strings.Count(got, got[:1]) != 8 {
			t.Fatalf("Resolve = %q, %v", got, err)
		}
	})
}
