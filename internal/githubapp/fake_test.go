package githubapp_test

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/hex"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// testKey is one 2048-bit key for the whole package (generating one
// under the race detector is slow).
var testKey = sync.OnceValue(func() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
})

const testAppID = "123456"

// clock is a settable time shared by the Source and the fake.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now().Truncate(time.Second)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// reply is a canned response.
type reply struct {
	status int
	header map[string]string
	body   string
}

// fakeGitHub follows GitHub's documented REST responses for what this
// package calls: the installation lookup, the token exchange, and one
// repository endpoint (issues) that checks the token, under an optional
// path prefix (GHES's /api/v3).
type fakeGitHub struct {
	t     testing.TB
	srv   *httptest.Server
	clock *clock

	mu            sync.Mutex
	installations map[string]int64 // lower-cased owner/repo
	lookups       int
	exchanges     int
	exchangeBody  []byte
	headers       http.Header
	issued        map[string]bool // token → still valid
	lookupReply   *reply
	exchangeReply *reply
	// grant, when set, replaces the granted permissions.
	grant map[string]string
	// extraRepo, when set, is listed in the grant besides the asked one.
	extraRepo string
	// arrived and gate, when set, hold each exchange until the test
	// lets it go.
	arrived chan struct{}
	gate    chan struct{}
}

// Routes of the fake, under its prefix.
const (
	lookupRoute   = "GET /repos/{owner}/{repo}/installation"
	exchangeRoute = "POST /app/installations/{installation_id}/access_tokens"
)

func newFake(t testing.TB, c *clock, prefix string) *fakeGitHub {
	return newFakeChecked(t, c, prefix, nil)
}

// newFakeChecked is newFake with check wrapping the handler of each of
// GitHub's App routes (named by route).
func newFakeChecked(t testing.TB, c *clock, prefix string, check func(route string, h http.HandlerFunc) http.HandlerFunc) *fakeGitHub {
	f := &fakeGitHub{t: t, clock: c, installations: map[string]int64{"acme/widgets": 42}, issued: map[string]bool{}}
	if check == nil {
		check = func(_ string, h http.HandlerFunc) http.HandlerFunc { return h }
	}
	method, path, _ := strings.Cut(lookupRoute, " ")
	mux := http.NewServeMux()
	mux.HandleFunc(method+" "+prefix+path, check(lookupRoute, f.lookup))
	method, path, _ = strings.Cut(exchangeRoute, " ")
	mux.HandleFunc(method+" "+prefix+path, check(exchangeRoute, f.exchange))
	mux.HandleFunc("GET "+prefix+"/repos/{owner}/{repo}/issues", f.issues)
	mux.HandleFunc("POST "+prefix+"/repos/{owner}/{repo}/issues", f.issues)
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (r *reply) write(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(r.status)
	_, _ = w.Write([]byte(r.body))
}

// appAuth checks the App JWT as GitHub does: RS256 by the App's key, iss
// the App id, issued in the past, expiring at most 10 minutes on.
func (f *fakeGitHub) appAuth(w http.ResponseWriter, r *http.Request) bool {
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	var claims jwt.RegisteredClaims
	_, err := jwt.ParseWithClaims(raw, &claims, func(*jwt.Token) (any, error) { return &testKey().PublicKey, nil },
		jwt.WithValidMethods([]string{"RS256"}), jwt.WithTimeFunc(f.clock.Now), jwt.WithIssuer(testAppID),
		jwt.WithIssuedAt(), jwt.WithExpirationRequired())
	if !ok || err != nil || claims.ExpiresAt.Sub(f.clock.Now()) > 10*time.Minute {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"message": "A JSON web token could not be decoded", "documentation_url": "https://docs.github.com/rest"})
		return false
	}
	f.mu.Lock()
	f.headers = r.Header.Clone()
	f.mu.Unlock()
	return true
}

func (f *fakeGitHub) lookup(w http.ResponseWriter, r *http.Request) {
	if !f.appAuth(w, r) {
		return
	}
	f.mu.Lock()
	f.lookups++
	canned := f.lookupReply
	id, ok := f.installations[strings.ToLower(r.PathValue("owner")+"/"+r.PathValue("repo"))]
	f.mu.Unlock()
	switch {
	case canned != nil:
		canned.write(w)
	case !ok:
		writeJSON(w, http.StatusNotFound, map[string]string{"message": "Not Found", "documentation_url": "https://docs.github.com/rest/apps/apps#get-a-repository-installation-for-the-authenticated-app"})
	default:
		inst := example(f.t, "installation.json")
		inst["id"] = id
		inst["account"].(map[string]any)["login"] = r.PathValue("owner")
		writeJSON(w, http.StatusOK, inst)
	}
}

func (f *fakeGitHub) exchange(w http.ResponseWriter, r *http.Request) {
	if !f.appAuth(w, r) {
		return
	}
	var req struct {
		Repositories []string          `json:"repositories"`
		Permissions  map[string]string `json:"permissions"`
	}
	body, err := io.ReadAll(r.Body)
	if err != nil || json.Unmarshal(body, &req) != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"message": "Problems parsing JSON"})
		return
	}
	f.mu.Lock()
	canned, grant, extra, arrived, gate := f.exchangeReply, f.grant, f.extraRepo, f.arrived, f.gate
	f.exchangeBody = body
	f.exchanges++
	f.mu.Unlock()
	if arrived != nil {
		arrived <- struct{}{}
		<-gate
	}
	if canned != nil {
		canned.write(w)
		return
	}
	if grant == nil {
		grant = req.Permissions
	}
	tok := "ghs_" + randomHex(18)
	f.mu.Lock()
	f.issued[tok] = true
	f.mu.Unlock()
	answer := example(f.t, "installation-token.json")
	documented := answer["repositories"].([]any)[0].(map[string]any)
	repos := []any{}
	for _, name := range append(req.Repositories, extra) {
		if name != "" {
			repo := maps.Clone(documented)
			repo["name"], repo["full_name"] = name, "acme/"+name
			repos = append(repos, repo)
		}
	}
	answer["token"], answer["expires_at"] = tok, f.clock.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	answer["permissions"], answer["repositories"] = grant, repos
	writeJSON(w, http.StatusCreated, answer)
}

// example is one of GitHub's documented example responses (testdata,
// from the examples of GitHub's OpenAPI description), for the fake to
// fill in.
func example(t testing.TB, name string) map[string]any {
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Error(err)
		return map[string]any{}
	}
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Error(err)
	}
	return v
}

// issues stands for any API call made with an installation token.
func (f *fakeGitHub) issues(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body) // read before the token is checked, so a refused body is spent
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	f.mu.Lock()
	valid := f.issued[tok]
	f.mu.Unlock()
	if !valid {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"message": "Bad credentials"})
		return
	}
	if r.Method == http.MethodPost {
		var issue map[string]any
		if err := json.Unmarshal(body, &issue); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"message": "Problems parsing JSON"})
			return
		}
		writeJSON(w, http.StatusCreated, issue)
		return
	}
	writeJSON(w, http.StatusOK, []any{})
}

// revoke makes GitHub refuse a token before its expiry.
func (f *fakeGitHub) revoke(tok string) {
	f.mu.Lock()
	f.issued[tok] = false
	f.mu.Unlock()
}

// hold makes exchanges wait until release is called (at the latest when
// the test ends, so a failing test does not leave handlers blocked); each
// exchange arriving is sent on the returned channel.
func (f *fakeGitHub) hold(t *testing.T) (arrived <-chan struct{}, release func()) {
	ch, gate := make(chan struct{}, 8), make(chan struct{})
	f.set(func(f *fakeGitHub) { f.arrived, f.gate = ch, gate })
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release)
	return ch, release
}

func (f *fakeGitHub) counts() (lookups, exchanges int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups, f.exchanges
}

func (f *fakeGitHub) set(fn func(f *fakeGitHub)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// rateHeaders are the primary limit's headers, exhausted, resetting in d.
func rateHeaders(c *clock, d time.Duration) map[string]string {
	return map[string]string{
		"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "0", "X-RateLimit-Used": "5000",
		"X-RateLimit-Reset": strconv.FormatInt(c.Now().Add(d).Unix(), 10), "X-RateLimit-Resource": "core",
	}
}
