package githubapp_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/githubapp"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

var testSecret = bytes.Repeat([]byte{7}, 32)

// recorder is a redactor that remembers what it was given.
type recorder struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (r *recorder) Add(values ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]bool{}
	}
	for _, v := range values {
		r.seen[v] = true
	}
}

func (r *recorder) has(v string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[v]
}

// replica is one patchbay process: a Source with its own Redis client
// and redactor.
type replica struct {
	src *githubapp.Source
	red *recorder
}

func newReplica(t testing.TB, gh *fakeGitHub, st *store.Store, opts ...func(*githubapp.Options)) replica {
	t.Helper()
	red := &recorder{}
	o := githubapp.Options{
		AppID: testAppID, PrivateKey: pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(testKey())),
		APIBaseURL: gh.srv.URL, Store: st, Key: testSecret, Redactor: red, Now: gh.clock.Now,
	}
	for _, opt := range opts {
		opt(&o)
	}
	src, err := githubapp.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return replica{src: src, red: red}
}

// otherClient is a second connection to st's Redis under the same
// prefix, as another replica of patchbay would hold.
func otherClient(t *testing.T, st *store.Store) *store.Store {
	t.Helper()
	if mr := st.Miniredis(); mr != nil {
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		return &store.Store{Client: c, Prefix: st.Prefix}
	}
	other, err := store.Open(t.Context(), storetest.URL(t), st.Prefix, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	return other
}

var widgets = githubapp.Scope{Owner: "acme", Repo: "widgets", Permissions: map[string]string{"issues": "write"}}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestTokenExchangeRequest(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		gh := newFake(t, newClock(), "")
		r := newReplica(t, gh, st)
		tok, err := r.src.Token(t.Context(), widgets)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(tok, "ghs_") || !r.red.has(tok) {
			t.Errorf("token %q not minted by the fake or not given to the redactor", tok)
		}
		gh.mu.Lock()
		body, h := gh.exchangeBody, gh.headers
		gh.mu.Unlock()
		golden(t, "exchange.request.json", body)
		for name, want := range map[string]string{"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "patchbay", "Content-Type": "application/json"} {
			if got := h.Get(name); got != want {
				t.Errorf("%s = %q, want %q", name, got, want)
			}
		}
		if !r.red.has(pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(testKey()))) {
			t.Error("the private key is not given to the redactor")
		}
		if appJWT, _ := strings.CutPrefix(h.Get("Authorization"), "Bearer "); !r.red.has(appJWT) {
			t.Error("the App JWT is not given to the redactor")
		}
		// At rest the token is sealed, not readable.
		key, _, _ := githubapp.Keys(r.src, widgets)
		raw, err := st.Client.Get(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(raw, tok) || !strings.HasPrefix(raw, "v1:") {
			t.Errorf("cached value %q is not sealed", raw)
		}
		ttl := st.Client.TTL(t.Context(), key).Val()
		if ttl <= 54*time.Minute || ttl > 55*time.Minute {
			t.Errorf("cache TTL = %s, want the token's hour less 5 minutes", ttl)
		}
	})
}

// golden compares JSON with testdata/name.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var g, w bytes.Buffer
	if err := json.Compact(&g, got); err != nil {
		t.Fatalf("sent %q: %v", got, err)
	}
	if err := json.Compact(&w, want); err != nil {
		t.Fatal(err)
	}
	if g.String() != w.String() {
		t.Errorf("sent %s\nwant %s (testdata/%s)", g.String(), w.String(), name)
	}
}

func TestScopesShareTokensOnlyWhenEqual(t *testing.T) {
	gh := newFake(t, newClock(), "")
	r := newReplica(t, gh, storetest.New(t))
	ctx := t.Context()
	first := must(r.src.Token(ctx, widgets))
	for name, sc := range map[string]githubapp.Scope{
		"metadata named":      {Owner: "acme", Repo: "widgets", Permissions: map[string]string{"metadata": "read", "issues": "write"}},
		"owner and repo case": {Owner: "ACME", Repo: "Widgets", Permissions: map[string]string{"issues": "write"}},
	} {
		if got := must(r.src.Token(ctx, sc)); got != first {
			t.Errorf("%s: a second token for the same scope", name)
		}
	}
	if got := must(r.src.Token(ctx, githubapp.Scope{Owner: "acme", Repo: "widgets", Permissions: map[string]string{"issues": "read"}})); got == first {
		t.Error("issues: read got the issues: write token")
	}
	if _, n := gh.counts(); n != 2 {
		t.Errorf("%d exchanges, want 2", n)
	}
}

func TestTokenErrors(t *testing.T) {
	perm422 := &reply{status: 422, body: `{"message":"The permissions requested are not granted to this installation.","documentation_url":"https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app"}`}
	repo422 := &reply{status: 422, body: `{"message":"There is at least one repository that does not exist or is not accessible to the parent installation.","documentation_url":"https://docs.github.com/rest"}`}
	secondary := `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}`
	primary := `{"message":"API rate limit exceeded for installation ID 42.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"}`
	c := newClock()
	tests := []struct {
		name   string
		scope  githubapp.Scope
		fake   func(f *fakeGitHub)
		opts   func(o *githubapp.Options)
		code   githubapp.Code
		status int
		retry  time.Duration
	}{
		{name: "no permissions", scope: githubapp.Scope{Owner: "acme", Repo: "widgets"}, code: githubapp.InvalidRequest},
		{name: "empty permissions", scope: githubapp.Scope{Owner: "acme", Repo: "widgets", Permissions: map[string]string{}}, code: githubapp.InvalidRequest},
		{name: "owner with a slash", scope: githubapp.Scope{Owner: "acme/x", Repo: "widgets", Permissions: widgets.Permissions}, code: githubapp.InvalidRequest},
		{name: "dot-dot repo", scope: githubapp.Scope{Owner: "acme", Repo: "..", Permissions: widgets.Permissions}, code: githubapp.InvalidRequest},
		{name: "empty owner", scope: githubapp.Scope{Repo: "widgets", Permissions: widgets.Permissions}, code: githubapp.InvalidRequest},
		{name: "unknown level", scope: githubapp.Scope{Owner: "acme", Repo: "widgets", Permissions: map[string]string{"issues": "superuser"}}, code: githubapp.InvalidRequest},
		{name: "bad permission name", scope: githubapp.Scope{Owner: "acme", Repo: "widgets", Permissions: map[string]string{"Issues!": "read"}}, code: githubapp.InvalidRequest},
		{name: "not installed", scope: githubapp.Scope{Owner: "acme", Repo: "gadgets", Permissions: widgets.Permissions}, code: githubapp.NotInstalled, status: 404},
		{name: "wrong app id", opts: func(o *githubapp.Options) { o.AppID = "999" }, code: githubapp.Unauthorized, status: 401},
		{name: "permission the App lacks", fake: func(f *fakeGitHub) { f.exchangeReply = perm422 }, code: githubapp.PermissionDenied, status: 422},
		{name: "repository outside the installation", fake: func(f *fakeGitHub) { f.exchangeReply = repo422 }, code: githubapp.NotInstalled, status: 422},
		{name: "forbidden", fake: func(f *fakeGitHub) {
			f.exchangeReply = &reply{status: 403, body: `{"message":"Resource not accessible by integration"}`}
		}, code: githubapp.PermissionDenied, status: 403},
		{name: "granted less than asked", fake: func(f *fakeGitHub) { f.grant = map[string]string{"issues": "read", "metadata": "read"} }, code: githubapp.PermissionDenied, status: 201},
		{name: "granted without metadata", fake: func(f *fakeGitHub) { f.grant = map[string]string{"issues": "write"} }, code: githubapp.PermissionDenied, status: 201},
		{name: "granted another repository too", fake: func(f *fakeGitHub) { f.extraRepo = "secrets" }, code: githubapp.PermissionDenied, status: 201},
		{name: "secondary limit, 429 with retry-after", fake: func(f *fakeGitHub) {
			f.exchangeReply = &reply{status: 429, header: map[string]string{"Retry-After": "30"}, body: secondary}
		}, code: githubapp.RateLimited, status: 429, retry: 30 * time.Second},
		{name: "secondary limit, 403 with retry-after", fake: func(f *fakeGitHub) {
			f.exchangeReply = &reply{status: 403, header: map[string]string{"Retry-After": "60"}, body: secondary}
		}, code: githubapp.RateLimited, status: 403, retry: time.Minute},
		{name: "secondary limit without a wait", fake: func(f *fakeGitHub) {
			f.exchangeReply = &reply{status: 403, body: secondary}
		}, code: githubapp.RateLimited, status: 403},
		{name: "primary limit on the lookup", fake: func(f *fakeGitHub) {
			f.lookupReply = &reply{status: 403, header: rateHeaders(c, 120*time.Second), body: primary}
		}, code: githubapp.RateLimited, status: 403, retry: 120 * time.Second},
		{name: "primary limit, 429", fake: func(f *fakeGitHub) {
			f.exchangeReply = &reply{status: 429, header: rateHeaders(c, 45*time.Second), body: primary}
		}, code: githubapp.RateLimited, status: 429, retry: 45 * time.Second},
		{name: "server error", fake: func(f *fakeGitHub) { f.exchangeReply = &reply{status: 502, body: "Bad Gateway"} }, code: githubapp.HTTP, status: 502},
		{name: "success without a token", fake: func(f *fakeGitHub) {
			f.exchangeReply = &reply{status: 201, body: `{"expires_at":"2030-01-01T00:00:00Z","permissions":{}}`}
		}, code: githubapp.HTTP, status: 201},
		{name: "lookup without an id", fake: func(f *fakeGitHub) { f.lookupReply = &reply{status: 200, body: `{}`} }, code: githubapp.HTTP, status: 200},
	}
	st := storetest.New(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gh := newFake(t, c, "")
			if tc.fake != nil {
				gh.set(tc.fake)
			}
			opts := []func(*githubapp.Options){}
			if tc.opts != nil {
				opts = append(opts, tc.opts)
			}
			r := newReplica(t, gh, st, opts...)
			scope := tc.scope
			if scope.Owner == "" && scope.Repo == "" {
				scope = widgets
			}
			tok, err := r.src.Token(t.Context(), scope)
			var e *githubapp.Error
			if !errors.As(err, &e) {
				t.Fatalf("Token = %q, %v; want a *githubapp.Error", tok, err)
			}
			if e.Code != tc.code || e.Status != tc.status || e.RetryAfter != tc.retry {
				t.Errorf("got %s (status %d, retry %s), want %s (status %d, retry %s): %v", e.Code, e.Status, e.RetryAfter, tc.code, tc.status, tc.retry, err)
			}
			lookups, _ := gh.counts()
			if tc.code == githubapp.InvalidRequest && lookups != 0 {
				t.Error("an invalid request reached GitHub")
			}
			gh.mu.Lock()
			for issued := range gh.issued {
				if strings.Contains(err.Error(), issued) {
					t.Error("the error quotes the token")
				}
			}
			gh.mu.Unlock()
		})
	}
}

func TestNetworkError(t *testing.T) {
	gh := newFake(t, newClock(), "")
	r := newReplica(t, gh, storetest.New(t))
	gh.srv.Close()
	_, err := r.src.Token(t.Context(), widgets)
	var e *githubapp.Error
	if !errors.As(err, &e) || e.Code != githubapp.Network || e.Err == nil {
		t.Fatalf("err = %v, want network with its cause", err)
	}
}

func TestFailuresAreNotCached(t *testing.T) {
	gh := newFake(t, newClock(), "")
	gh.set(func(f *fakeGitHub) { f.exchangeReply = &reply{status: 502, body: "Bad Gateway"} })
	r := newReplica(t, gh, storetest.New(t))
	if _, err := r.src.Token(t.Context(), widgets); githubapp.CodeOf(err) != githubapp.HTTP {
		t.Fatalf("err = %v", err)
	}
	gh.set(func(f *fakeGitHub) { f.exchangeReply = nil })
	if _, err := r.src.Token(t.Context(), widgets); err != nil {
		t.Fatalf("after GitHub recovered: %v", err)
	}
}

func TestNewRefuses(t *testing.T) {
	gh := newFake(t, newClock(), "")
	st := storetest.New(t)
	for name, tc := range map[string]struct {
		opt  func(o *githubapp.Options)
		code githubapp.Code
	}{
		"garbage key": {func(o *githubapp.Options) {
			o.PrivateKey = "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----"
		}, githubapp.InvalidKey},
		"no app id":      {func(o *githubapp.Options) { o.AppID = " " }, githubapp.InvalidRequest},
		"relative base":  {func(o *githubapp.Options) { o.APIBaseURL = "/api/v3" }, githubapp.InvalidRequest},
		"base with user": {func(o *githubapp.Options) { o.APIBaseURL = "https://u:p@ghe.example/api/v3" }, githubapp.InvalidRequest},
		"no secret key":  {func(o *githubapp.Options) { o.Key = nil }, ""},
		"no redactor":    {func(o *githubapp.Options) { o.Redactor = nil }, ""},
	} {
		t.Run(name, func(t *testing.T) {
			o := githubapp.Options{AppID: testAppID, PrivateKey: pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(testKey())), APIBaseURL: gh.srv.URL, Store: st, Key: testSecret, Redactor: &recorder{}}
			tc.opt(&o)
			_, err := githubapp.New(o)
			if err == nil || githubapp.CodeOf(err) != tc.code {
				t.Fatalf("New = %v, want code %q", err, tc.code)
			}
		})
	}
}

func TestAPIBaseURL(t *testing.T) {
	c := newClock()
	ghes := newFake(t, c, "/api/v3")
	r := newReplica(t, ghes, storetest.New(t), func(o *githubapp.Options) { o.APIBaseURL = ghes.srv.URL + "/api/v3/" })
	if _, err := r.src.Token(t.Context(), widgets); err != nil {
		t.Fatalf("GHES: %v", err)
	}
	if got, want := r.src.APIBaseURL(), ghes.srv.URL+"/api/v3"; got != want {
		t.Errorf("APIBaseURL = %q, want %q", got, want)
	}
	dflt := newReplica(t, ghes, storetest.New(t), func(o *githubapp.Options) { o.APIBaseURL = "" })
	if got := dflt.src.APIBaseURL(); got != githubapp.DefaultAPIBaseURL {
		t.Errorf("default APIBaseURL = %q", got)
	}
}

// Fifty callers on two replicas (separate Redis clients) get one token
// from one exchange: the exchange is held until the second replica is
// waiting for it, so neither could have found the other's result cached.
func TestConcurrentCallsShareOneExchange(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		gh := newFake(t, newClock(), "")
		arrived, release := gh.hold(t)
		a, b := newReplica(t, gh, st), newReplica(t, gh, otherClient(t, st))
		_, _, channel := githubapp.Keys(a.src, widgets)

		tokens := make(chan string, 50)
		errs := make(chan error, 50)
		var wg sync.WaitGroup
		for i := range 50 {
			r := a
			if i%2 == 1 {
				r = b
			}
			wg.Go(func() {
				tok, err := r.src.Token(context.Background(), widgets)
				tokens <- tok
				errs <- err
			})
		}
		<-arrived
		waitFor(t, "the other replica to wait", func() bool {
			return st.Client.PubSubNumSub(t.Context(), channel).Val()[channel] == 1
		})
		release()
		wg.Wait()
		close(tokens)
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		first := <-tokens
		for tok := range tokens {
			if tok != first {
				t.Fatal("callers got different tokens")
			}
		}
		if lookups, n := gh.counts(); n != 1 || lookups != 1 {
			t.Errorf("%d lookups and %d exchanges, want 1 and 1", lookups, n)
		}
		if !a.red.has(first) || !b.red.has(first) {
			t.Error("a replica did not give the token to its redactor")
		}
		// A third replica finds it cached.
		c := newReplica(t, gh, otherClient(t, st))
		if got := must(c.src.Token(t.Context(), widgets)); got != first || !c.red.has(got) {
			t.Error("a new replica did not get the cached token (or did not redact it)")
		}
	})
}

// The winner's error reaches the replica waiting for it, which does not
// ask GitHub again.
func TestWaitersGetTheWinnersError(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		gh := newFake(t, newClock(), "")
		arrived, release := gh.hold(t)
		gh.set(func(f *fakeGitHub) {
			f.exchangeReply = &reply{status: 429, header: map[string]string{"Retry-After": "7"}, body: `{"message":"You have exceeded a secondary rate limit."}`}
		})
		a, b := newReplica(t, gh, st), newReplica(t, gh, otherClient(t, st))
		_, _, channel := githubapp.Keys(a.src, widgets)
		errs := make(chan error, 2)
		for _, r := range []replica{a, b} {
			go func() { _, err := r.src.Token(context.Background(), widgets); errs <- err }()
		}
		<-arrived
		waitFor(t, "the other replica to wait", func() bool {
			return st.Client.PubSubNumSub(t.Context(), channel).Val()[channel] == 1
		})
		release()
		for range 2 {
			var e *githubapp.Error
			if err := <-errs; !errors.As(err, &e) || e.Code != githubapp.RateLimited || e.RetryAfter != 7*time.Second {
				t.Errorf("err = %v, want rate_limited with retry after 7s", err)
			}
		}
		if _, n := gh.counts(); n != 1 {
			t.Errorf("%d exchanges, want 1", n)
		}
	})
}

// A replica that died holding the lock delays the others only until the
// lock goes (here deleted, as its TTL would).
func TestLockOfADeadReplica(t *testing.T) {
	st := storetest.New(t)
	gh := newFake(t, newClock(), "")
	r := newReplica(t, gh, st)
	_, lock, channel := githubapp.Keys(r.src, widgets)
	if err := st.Client.Set(t.Context(), lock, "dead replica", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := r.src.Token(context.Background(), widgets); done <- err }()
	waitFor(t, "the replica to wait", func() bool {
		return st.Client.PubSubNumSub(t.Context(), channel).Val()[channel] == 1
	})
	if _, n := gh.counts(); n != 0 {
		t.Fatal("exchanged while another replica held the lock")
	}
	st.Client.Del(t.Context(), lock)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, n := gh.counts(); n != 1 {
		t.Errorf("%d exchanges, want 1", n)
	}
}

func TestRefreshBeforeExpiry(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		c := newClock()
		gh := newFake(t, c, "")
		r := newReplica(t, gh, st)
		first := must(r.src.Token(t.Context(), widgets))
		c.Add(54 * time.Minute) // 6 minutes left: still served
		if got := must(r.src.Token(t.Context(), widgets)); got != first {
			t.Fatal("replaced a token with 6 minutes left")
		}
		c.Add(2 * time.Minute) // 4 minutes left: replaced
		if got := must(r.src.Token(t.Context(), widgets)); got == first {
			t.Fatal("served a token with 4 minutes left")
		}
		if _, n := gh.counts(); n != 2 {
			t.Errorf("%d exchanges, want 2", n)
		}
	})
}

func TestDoRetriesOnceAfter401(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		gh := newFake(t, newClock(), "")
		r := newReplica(t, gh, st)
		other := newReplica(t, gh, otherClient(t, st))
		first := must(r.src.Token(t.Context(), widgets))
		gh.revoke(first)

		var sent []string
		status, err := r.src.Do(t.Context(), widgets, func(tok string) (int, error) {
			sent = append(sent, tok)
			return getIssues(t, gh.srv.URL, tok), nil
		})
		if err != nil || status != http.StatusOK || len(sent) != 2 || sent[0] != first || sent[1] == first {
			t.Fatalf("Do = %d, %v after sending %d tokens; want 200 on the second, fresh token", status, err, len(sent))
		}
		// The other replica, invalidating the token it saw rejected,
		// keeps the fresh one.
		if err := other.src.Invalidate(t.Context(), widgets, first); err != nil {
			t.Fatal(err)
		}
		if got := must(other.src.Token(t.Context(), widgets)); got != sent[1] {
			t.Error("invalidating a stale token dropped the fresh one")
		}
		if _, n := gh.counts(); n != 2 {
			t.Errorf("%d exchanges, want 2", n)
		}
		// A token still refused after the retry is fn's answer.
		gh.revoke(sent[1])
		gh.set(func(f *fakeGitHub) { f.grant = map[string]string{} })
		status, err = r.src.Do(t.Context(), widgets, func(tok string) (int, error) { return getIssues(t, gh.srv.URL, tok), nil })
		if githubapp.CodeOf(err) != githubapp.PermissionDenied {
			t.Errorf("Do = %d, %v; want the fresh exchange's permission_denied", status, err)
		}
	})
}

func getIssues(t *testing.T, base, tok string) int {
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/repos/acme/widgets/issues", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	return res.StatusCode
}

func TestTransport(t *testing.T) {
	gh := newFake(t, newClock(), "")
	r := newReplica(t, gh, storetest.New(t))
	var elsewhere http.Header
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { elsewhere = req.Header.Clone() }))
	t.Cleanup(other.Close)
	client := &http.Client{Transport: r.src.Transport(widgets, "", nil)}

	get := func(url string) int {
		res, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		return res.StatusCode
	}
	if got := get(gh.srv.URL + "/repos/acme/widgets/issues"); got != http.StatusOK {
		t.Fatalf("GET = %d", got)
	}
	first := must(r.src.Token(t.Context(), widgets))
	gh.revoke(first)
	if got := get(gh.srv.URL + "/repos/acme/widgets/issues"); got != http.StatusOK {
		t.Fatalf("GET after revocation = %d, want a retry with a fresh token", got)
	}
	// A body is sent again with the fresh token.
	second := must(r.src.Token(t.Context(), widgets))
	gh.revoke(second)
	res, err := client.Post(gh.srv.URL+"/repos/acme/widgets/issues", "application/json", strings.NewReader(`{"title":"hello"}`))
	if err != nil {
		t.Fatal(err)
	}
	created, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusCreated || !strings.Contains(string(created), "hello") {
		t.Errorf("POST after revocation = %d %s, want the body sent again", res.StatusCode, created)
	}
	if _, n := gh.counts(); n != 3 {
		t.Errorf("%d exchanges, want 3", n)
	}
	get(other.URL + "/download")
	if elsewhere.Get("Authorization") != "" {
		t.Error("the token went to another origin")
	}
}

// A caller that gives up does not cancel the exchange the others (and
// the cache) wait for.
func TestCallerGivingUpLeavesTheExchange(t *testing.T) {
	gh := newFake(t, newClock(), "")
	arrived, release := gh.hold(t)
	st := storetest.New(t)
	r := newReplica(t, gh, st)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { _, err := r.src.Token(ctx, widgets); done <- err }()
	<-arrived
	cancel()
	if err := <-done; githubapp.CodeOf(err) != githubapp.Network || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want network wrapping context.Canceled", err)
	}
	release()
	key, _, _ := githubapp.Keys(r.src, widgets)
	waitFor(t, "the token to be cached", func() bool { return st.Client.Exists(t.Context(), key).Val() == 1 })
	if _, err := r.src.Token(t.Context(), widgets); err != nil {
		t.Fatal(err)
	}
	if _, n := gh.counts(); n != 1 {
		t.Errorf("%d exchanges, want 1", n)
	}
}

func TestHeadersAndRefresh(t *testing.T) {
	gh := newFake(t, newClock(), "")
	r := newReplica(t, gh, storetest.New(t))
	h, err := r.src.Headers(t.Context(), widgets)
	if err != nil {
		t.Fatal(err)
	}
	tok, ok := strings.CutPrefix(h["Authorization"], "Bearer ")
	if !ok || len(h) != 1 || !r.red.has(tok) {
		t.Fatalf("Headers = %d header(s); want one Authorization with a redacted bearer token", len(h))
	}
	gh.revoke(tok)
	fresh, err := r.src.Refresh(t.Context(), widgets, h)
	if err != nil {
		t.Fatal(err)
	}
	if fresh["Authorization"] == h["Authorization"] {
		t.Fatal("Refresh returned the rejected token")
	}
	if got := getIssues(t, gh.srv.URL, strings.TrimPrefix(fresh["Authorization"], "Bearer ")); got != http.StatusOK {
		t.Errorf("the refreshed token gets %d", got)
	}
}

func TestTransportToAnotherOrigin(t *testing.T) {
	gh := newFake(t, newClock(), "")
	r := newReplica(t, gh, storetest.New(t))
	var got http.Header
	mcp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { got = req.Header.Clone() }))
	t.Cleanup(mcp.Close)
	client := &http.Client{Transport: r.src.Transport(widgets, mcp.URL+"/mcp", nil)}
	res, err := client.Post(mcp.URL+"/mcp", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if tok, ok := strings.CutPrefix(got.Get("Authorization"), "Bearer "); !ok || !r.red.has(tok) {
		t.Error("the MCP server's origin did not get the token")
	}
}
