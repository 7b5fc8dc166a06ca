package drive_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/drive"
	"github.com/patchbay-dev/patchbay/internal/drive/drivetest"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// memSecrets is a secret store of one map.
type memSecrets struct {
	mu sync.Mutex
	m  map[string]string
}

func (s *memSecrets) Resolve(_ context.Context, name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[name]
	if !ok {
		return "", errors.New("no such secret")
	}
	return v, nil
}

func (s *memSecrets) set(name, v string) {
	s.mu.Lock()
	s.m[name] = v
	s.mu.Unlock()
}

// recorder is a redactor that remembers what it was told.
type recorder struct {
	mu sync.Mutex
	v  []string
}

func (r *recorder) Add(values ...string) {
	r.mu.Lock()
	r.v = append(r.v, values...)
	r.mu.Unlock()
}

func (r *recorder) has(v string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.v, v)
}

type saBundle struct {
	*bundle
	account *drivetest.Account
	secrets *memSecrets
	red     *recorder
}

func setupSA(t *testing.T, sa config.ServiceAccount) *saBundle {
	t.Helper()
	fake := drivetest.New(t, map[string]string{"tok-robot": "robot"})
	scope := strings.Join(sa.Scopes, " ")
	if scope == "" {
		scope = drive.DefaultScope
	}
	account := drivetest.NewAccount(t, fake, "tok-robot", scope, sa.Subject)
	secrets := &memSecrets{m: map[string]string{"DRIVE_KEY": account.Key()}}
	red := &recorder{}
	sa.Key = "${secret:DRIVE_KEY}"
	p := drive.New("gdrive", config.Drive{APIBaseURL: fake.APIURL(), UploadBaseURL: fake.UploadURL()},
		&drive.Options{ServiceAccount: &sa, Secrets: secrets, Redactor: red})
	c, err := p.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &saBundle{bundle: &bundle{fake: fake, conn: c}, account: account, secrets: secrets, red: red}
}

func (b *saBundle) call(t *testing.T, op string, args map[string]any) (any, error) {
	t.Helper()
	return b.conn.Call(context.Background(), connect.CallRequest{Op: op, Args: args})
}

// TestServiceAccount: calls without per-call credentials act as the
// account. One exchange serves many calls (x/oauth2 reuses the token
// until it is about to expire); the assertion is checked by the fake
// token endpoint; the key and every access token go to the redactor.
func TestServiceAccount(t *testing.T) {
	t.Parallel()
	for _, sa := range []config.ServiceAccount{
		{},
		{Scopes: []string{"https://www.googleapis.com/auth/drive"}, Subject: "alice@example.com"},
	} {
		b := setupSA(t, sa)
		b.fake.Add("tok-robot", "shared.txt", "text/plain", "root", "for the robot")
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				out, err := b.call(t, "read_file", map[string]any{"path": "shared.txt"})
				if err != nil || out.(map[string]any)["content"] != "for the robot" {
					t.Errorf("read_file = %v, %v", out, err)
				}
			})
		}
		wg.Wait()
		if n := b.account.Exchanges(); n != 1 {
			t.Fatalf("%d token exchanges for 10 calls, want 1", n)
		}
		if !b.red.has(b.account.Issued()[0]) || !b.red.has(b.account.Key()) {
			t.Fatal("the access token or the key was not given to the redactor")
		}
		if info := b.conn.Info(); info["auth"] != "serviceAccount" {
			t.Fatalf("info = %v", info)
		}
	}
}

// TestServiceAccountRefused: a token Drive refuses before its expiry is
// replaced once and the call sent again; a key rotated in the secret
// store is exchanged at the next call.
func TestServiceAccountRefused(t *testing.T) {
	t.Parallel()
	b := setupSA(t, config.ServiceAccount{})
	b.fake.Add("tok-robot", "a.txt", "text/plain", "root", "a")
	if _, err := b.call(t, "find_file", map[string]any{"path": "a.txt"}); err != nil {
		t.Fatal(err)
	}
	b.fake.Revoke(b.account.Issued()[0])
	out, err := b.call(t, "find_file", map[string]any{"path": "a.txt"})
	if err != nil || out.(map[string]any)["found"] != true {
		t.Fatalf("after a revocation: %v, %v", out, err)
	}
	if n := b.account.Exchanges(); n != 2 {
		t.Fatalf("%d exchanges, want 2", n)
	}

	b.account.Rotate() // only the new key's assertions pass now
	b.secrets.set("DRIVE_KEY", b.account.Key())
	if _, err := b.call(t, "list_files", map[string]any{}); err != nil {
		t.Fatal(err)
	}
	if n := b.account.Exchanges(); n != 3 {
		t.Fatalf("%d exchanges after a key rotation, want 3", n)
	}
}

// TestServiceAccountBadKeys: keys that cannot work fail the call with a
// message that never quotes the key, and send nothing to Drive.
func TestServiceAccountBadKeys(t *testing.T) {
	t.Parallel()
	b := setupSA(t, config.ServiceAccount{})
	good, _ := b.secrets.Resolve(context.Background(), "DRIVE_KEY")
	var m map[string]any
	json.Unmarshal([]byte(good), &m)
	with := func(k, v string) string {
		c := map[string]any{}
		for kk, vv := range m {
			c[kk] = vv
		}
		c[k] = v
		b, _ := json.Marshal(c)
		return string(b)
	}
	for key, want := range map[string]string{
		"not json":                                "is not JSON",
		with("type", "authorized_user"):           `type "authorized_user"`,
		with("private_key", "nope"):               "no PEM private_key",
		with("token_uri", "http://example.com/t"): "must be https",
		with("client_email", ""):                  "no client_email",
	} {
		b.secrets.set("DRIVE_KEY", key)
		_, err := b.call(t, "list_files", map[string]any{})
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Errorf("key %.30q: %v, want %q", key, err, want)
		}
	}
	if len(b.fake.Requests()) != 0 {
		t.Fatal("a request went to Drive without a token")
	}
}
