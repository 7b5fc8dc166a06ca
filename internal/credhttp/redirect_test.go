package credhttp_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/credhttp"
)

// seen is what one server received: "<method> <path> key=<X-Key>
// auth=<Authorization> ref=<Referer>" per request.
type seen struct {
	mu   sync.Mutex
	reqs []string
}

func (s *seen) add(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, r.Method+" "+r.URL.Path+" key="+r.Header.Get("X-Key")+" auth="+r.Header.Get("Authorization")+" ref="+r.Header.Get("Referer")+" accept="+r.Header.Get("Accept"))
}

func (s *seen) all() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.reqs, "; ")
}

// twoOrigins starts the API and another origin on loopback (two ports of
// one host, which net/http treats as one for Authorization). The API
// redirects as its paths say; the other origin answers, or sends the
// request back to the API.
func twoOrigins(t *testing.T) (api, other *httptest.Server, apiSeen, otherSeen *seen) {
	t.Helper()
	apiSeen, otherSeen = &seen{}, &seen{}
	other = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		otherSeen.add(r)
		if r.URL.Path == "/back" {
			http.Redirect(w, r, api.URL+"/final", http.StatusFound)
			return
		}
		io.WriteString(w, "other")
	}))
	t.Cleanup(other.Close)
	api = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		apiSeen.add(r)
		switch r.URL.Path {
		case "/same":
			http.Redirect(w, r, "/final?sig=abc", http.StatusFound)
		case "/same-307":
			http.Redirect(w, r, "/final", http.StatusTemporaryRedirect)
		case "/same-303":
			http.Redirect(w, r, "/final", http.StatusSeeOther)
		case "/other":
			http.Redirect(w, r, other.URL+"/landing?sig=abc", http.StatusFound)
		case "/other-307":
			http.Redirect(w, r, other.URL+"/landing", http.StatusTemporaryRedirect)
		case "/round-trip":
			http.Redirect(w, r, other.URL+"/back", http.StatusFound)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		default:
			io.WriteString(w, "api")
		}
	}))
	t.Cleanup(api.Close)
	return api, other, apiSeen, otherSeen
}

// TestRedirects: a credential never reaches another origin, whatever its
// header's name; same-origin redirects keep it for GET and HEAD only; a
// write is not redirected anywhere; the modes choose what is followed.
func TestRedirects(t *testing.T) {
	t.Parallel()
	const k = "key=s3cret auth=Bearer tok"
	tests := []struct {
		mode      credhttp.Redirects
		method    string
		path      string
		wantBody  string // "" when the request must fail
		wantErr   string
		wantAPI   string
		wantOther string
	}{
		{credhttp.FollowSameOrigin, "GET", "/same", "api", "",
			"GET /same " + k + " ref= accept=text/plain; GET /final " + k + " ref=API/same accept=text/plain", ""},
		{credhttp.FollowSameOrigin, "HEAD", "/same", "", "", "HEAD /same " + k + " ref= accept=text/plain; HEAD /final " + k + " ref=API/same accept=text/plain", ""},
		{credhttp.FollowSameOrigin, "GET", "/other", "", "leads away from API", "GET /other " + k + " ref= accept=text/plain", ""},
		{credhttp.FollowSameOrigin, "POST", "/same-307", "", "a POST goes only where it was addressed", "POST /same-307 " + k + " ref= accept=text/plain", ""},
		// net/http turns a 303 to a POST into a GET, without the body.
		{credhttp.FollowSameOrigin, "POST", "/same-303", "api", "",
			"POST /same-303 " + k + " ref= accept=text/plain; GET /final " + k + " ref=API/same-303 accept=text/plain", ""},
		{credhttp.FollowSameOrigin, "GET", "/loop", "", "more than 10 redirects", "", ""},
		{credhttp.FollowNone, "GET", "/same", "", "follows no redirects", "GET /same " + k + " ref= accept=text/plain", ""},
		{credhttp.FollowAnyOrigin, "GET", "/other", "other", "",
			"GET /other " + k + " ref= accept=text/plain", "GET /landing key= auth= ref= accept=text/plain"},
		{credhttp.FollowAnyOrigin, "POST", "/other-307", "", "a POST goes only where it was addressed", "POST /other-307 " + k + " ref= accept=text/plain", ""},
		// Back at the API after another origin: the chain has crossed,
		// so the credential does not come back either.
		{credhttp.FollowAnyOrigin, "GET", "/round-trip", "api", "",
			"GET /round-trip " + k + " ref= accept=text/plain; GET /final key= auth= ref= accept=text/plain", "GET /back key= auth= ref= accept=text/plain"},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode)+" "+tt.method+" "+tt.path, func(t *testing.T) {
			t.Parallel()
			api, other, apiSeen, otherSeen := twoOrigins(t)
			req, err := http.NewRequest(tt.method, api.URL+tt.path, strings.NewReader("body"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("X-Key", "s3cret")
			req.Header.Set("Authorization", "Bearer tok")
			req.Header.Set("Accept", "text/plain")
			resp, err := credhttp.Client(nil, tt.mode).Do(req)
			if tt.wantErr != "" {
				re, ok := credhttp.AsRedirect(err)
				if !ok || !strings.Contains(strings.ReplaceAll(err.Error(), api.URL, "API"), tt.wantErr) {
					t.Fatalf("err = %v, want a redirect refused: %s", err, tt.wantErr)
				}
				if strings.Contains(re.Error(), "sig=") {
					t.Fatalf("the error shows the query: %v", re)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(body) != tt.wantBody {
					t.Fatalf("body = %q, want %q", body, tt.wantBody)
				}
			}
			if tt.path == "/loop" {
				return
			}
			if got := strings.ReplaceAll(apiSeen.all(), api.URL, "API"); got != tt.wantAPI {
				t.Errorf("the API saw %q\nwant %q", got, tt.wantAPI)
			}
			if got := strings.ReplaceAll(otherSeen.all(), other.URL, "OTHER"); got != tt.wantOther {
				t.Errorf("the other origin saw %q\nwant %q", got, tt.wantOther)
			}
		})
	}
}

// TestRedirectNeverLeavesHTTPS: an https API redirecting to http is not
// followed, even on its own host name.
func TestRedirectNeverLeavesHTTPS(t *testing.T) {
	t.Parallel()
	plain := &seen{}
	insecure := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { plain.add(r) }))
	t.Cleanup(insecure.Close)
	secure := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, insecure.URL+"/x", http.StatusFound)
	}))
	t.Cleanup(secure.Close)
	req, _ := http.NewRequest(http.MethodGet, secure.URL+"/", nil)
	req.Header.Set("X-Key", "s3cret")
	_, err := credhttp.Client(secure.Client(), credhttp.FollowAnyOrigin).Do(req)
	if _, ok := credhttp.AsRedirect(err); !ok || !strings.Contains(err.Error(), "leaves https for http") {
		t.Fatalf("err = %v", err)
	}
	if plain.all() != "" {
		t.Fatalf("the http server saw %s", plain.all())
	}
}

// TestClientKeepsItsOwnRule: the wrapped client's CheckRedirect still
// has its say after these rules.
func TestClientKeepsItsOwnRule(t *testing.T) {
	t.Parallel()
	api, _, apiSeen, _ := twoOrigins(t)
	stop := errors.New("stop here")
	c := credhttp.Client(&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return stop }}, credhttp.FollowSameOrigin)
	if _, err := c.Get(api.URL + "/same"); !errors.Is(err, stop) {
		t.Fatalf("err = %v", err)
	}
	if n := strings.Count(apiSeen.all(), "GET"); n != 1 {
		t.Fatalf("%d requests", n)
	}
}

func TestParseRedirects(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]credhttp.Redirects{"": credhttp.FollowSameOrigin, "none": credhttp.FollowNone, "any": credhttp.FollowAnyOrigin, "same-origin": credhttp.FollowSameOrigin} {
		if got, err := credhttp.ParseRedirects(in); err != nil || got != want {
			t.Errorf("ParseRedirects(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := credhttp.ParseRedirects("always"); err == nil || !strings.Contains(err.Error(), "none, same-origin or any") {
		t.Fatalf("err = %v", err)
	}
}

func TestSameOrigin(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		a, b string
		want bool
	}{
		{"https://api.example.com/v3", "https://API.example.com:443/x", true},
		{"http://127.0.0.1:8080/a", "http://127.0.0.1:8081/a", false},
		{"https://api.example.com", "http://api.example.com", false},
		{"./doc.json", "https://api.example.com", false},
	} {
		if got := credhttp.SameOrigin(tt.a, tt.b); got != tt.want {
			t.Errorf("SameOrigin(%q, %q) = %v", tt.a, tt.b, got)
		}
	}
}

// TestKeepOrigin: within the origin any method follows, its body and
// credential with it; nothing crosses to another origin, not even a
// chain that would come back.
func TestKeepOrigin(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		method, path string
		followed     bool
	}{
		{http.MethodPost, "/same-307", true},
		{http.MethodGet, "/same", true},
		{http.MethodPost, "/other-307", false},
		{http.MethodGet, "/other", false},
		{http.MethodGet, "/round-trip", false},
		{http.MethodGet, "/loop", false},
	} {
		t.Run(tt.method+tt.path, func(t *testing.T) {
			t.Parallel()
			api, _, apiSeen, otherSeen := twoOrigins(t)
			req, _ := http.NewRequest(tt.method, api.URL+tt.path, strings.NewReader("{}"))
			req.Header.Set("X-Key", "s3cret")
			resp, err := credhttp.KeepOrigin(nil).Do(req)
			if tt.followed {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				resp.Body.Close()
				if !strings.Contains(apiSeen.all(), tt.method+" /final key=s3cret") {
					t.Fatalf("the API saw %s", apiSeen.all())
				}
				return
			}
			if _, ok := credhttp.AsRedirect(err); !ok {
				t.Fatalf("err = %v, want a redirect not followed", err)
			}
			if otherSeen.all() != "" {
				t.Fatalf("the other origin saw %s", otherSeen.all())
			}
		})
	}
}
