package githubapp_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/githubapp"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// TestAppJWTStaysOnGitHub: GitHub answering the installation lookup or
// the token exchange with a redirect to another port of its host does
// not send the App JWT there; the exchange fails saying why.
func TestAppJWTStaysOnGitHub(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		mu.Unlock()
	}))
	t.Cleanup(other.Close)
	for name, set := range map[string]func(f *fakeGitHub){
		"lookup 302": func(f *fakeGitHub) {
			f.lookupReply = &reply{status: http.StatusFound, header: map[string]string{"Location": other.URL + "/repos/acme/widgets/installation"}}
		},
		"exchange 307": func(f *fakeGitHub) {
			f.exchangeReply = &reply{status: http.StatusTemporaryRedirect, header: map[string]string{"Location": other.URL + "/app/installations/42/access_tokens"}}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			gh := newFake(t, newClock(), "")
			gh.set(set)
			r := newReplica(t, gh, storetest.New(t))
			_, err := r.src.Token(t.Context(), widgets)
			if githubapp.CodeOf(err) != githubapp.HTTP || !strings.Contains(err.Error(), "not followed") {
				t.Fatalf("err = %v", err)
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 0 {
		t.Fatalf("the other port was sent %q", seen)
	}
}

// TestTokenErrorsSayWhy: what GitHub says about a refused exchange, in
// whichever shape, is in the error — without a JWT it echoes.
func TestTokenErrorsSayWhy(t *testing.T) {
	t.Parallel()
	const echoed = "eyJhbGciOiJSUzI1NiJ9.eyJpc3MiOiIxMjM0NTYifQ.c2lnbmF0dXJlLWJ5dGVz"
	for _, tt := range []struct {
		body, want string
	}{
		{`{"message":"'Expiration time' claim ('exp') is too far in the future: ` + echoed + `","documentation_url":"https://docs.github.com/rest"}`,
			"'Expiration time' claim ('exp') is too far in the future: <redacted>"},
		{`{"error":"bad_verification_code","error_description":"The code passed is incorrect or expired."}`,
			"bad_verification_code: The code passed is incorrect or expired."},
		{`{"message":"Validation Failed","errors":[{"resource":"Installation","code":"invalid","field":"permissions","message":"issues is not a permission this App has"}]}`,
			"invalid: Validation Failed (issues is not a permission this App has)"},
	} {
		gh := newFake(t, newClock(), "")
		gh.set(func(f *fakeGitHub) { f.exchangeReply = &reply{status: http.StatusUnauthorized, body: tt.body} })
		r := newReplica(t, gh, storetest.New(t))
		_, err := r.src.Token(t.Context(), widgets)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), echoed) {
			t.Errorf("err = %v\nwant it to say %q", err, tt.want)
		}
	}
}
