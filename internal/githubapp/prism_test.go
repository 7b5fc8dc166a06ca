package githubapp_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/githubapp"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// The paths of GitHub's description a Source calls.
const (
	lookupPath   = "/repos/{owner}/{repo}/installation"
	exchangePath = "/app/installations/{installation_id}/access_tokens"
)

// TestOnPrism sends the installation lookup and the token exchange to
// Stoplight Prism mocking GitHub's own description (trimmed to those two
// paths), which answers 4xx with an sl-violations header to any request
// the description does not allow.
func TestOnPrism(t *testing.T) {
	dir := npmtest.Require(t, "octokit-openapi", githubOpenAPI)
	doc := npmtest.TrimDocument(t, filepath.Join(dir, "generated", "api.github.com.json"), lookupPath, exchangePath)
	tap := npmtest.NewTap(t, npmtest.Prism(t, doc))

	t.Run("lookup and exchange validate", func(t *testing.T) {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		src, err := githubapp.New(githubapp.Options{
			AppID: testAppID, PrivateKey: pemOf(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(key)),
			APIBaseURL: tap.URL, Store: storetest.New(t), Key: testSecret, Redactor: &recorder{},
			HTTPClient: &http.Client{Transport: plainAccept{t}},
		})
		if err != nil {
			t.Fatal(err)
		}
		asked := map[string]string{"issues": "write", "contents": "read"}
		_, err = src.Token(t.Context(), githubapp.Scope{Owner: "octocat", Repo: "Hello-World", Permissions: asked})
		seen := tap.Since(0)
		npmtest.CheckClean(t, seen, "GET /repos/octocat/Hello-World/installation", "POST /app/installations/1/access_tokens")
		var body struct {
			Repositories []string          `json:"repositories"`
			Permissions  map[string]string `json:"permissions"`
		}
		if err := json.Unmarshal([]byte(seen[1].Body), &body); err != nil {
			t.Fatalf("exchange body %q: %v", seen[1].Body, err)
		}
		want := maps.Clone(asked)
		want["metadata"] = "read"
		if len(body.Repositories) != 1 || body.Repositories[0] != "Hello-World" || !maps.Equal(body.Permissions, want) {
			t.Fatalf("exchange body = %s, want Hello-World only and %v", seen[1].Body, want)
		}
		// Prism answers with GitHub's example grant, issues: write and
		// contents: read without the metadata: read every token is asked
		// for, so the Source fails closed: the grant is not used.
		var ge *githubapp.Error
		if !errors.As(err, &ge) || ge.Code != githubapp.PermissionDenied || !strings.Contains(ge.Message, "missing metadata:read") {
			t.Fatalf("Token = %v, want permission_denied for the example grant's missing metadata:read", err)
		}
	})

	// Prism finds fault with requests GitHub's description does not
	// allow, so the clean answers above mean something.
	for name, tc := range map[string]struct{ body, field string }{
		"repositories not a list": {`{"repositories":"x","permissions":{"issues":"write"}}`, `"repositories"`},
		"unknown level":           {`{"repositories":["x"],"permissions":{"issues":"delete"}}`, `"permissions","issues"`},
	} {
		t.Run(name, func(t *testing.T) {
			body := tc.body
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tap.URL+"/app/installations/1/access_tokens", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			answer, _ := io.ReadAll(resp.Body)
			if resp.StatusCode/100 != 4 || !strings.Contains(resp.Header.Get("sl-violations"), tc.field) {
				t.Fatalf("Prism answers %s with %d %q %s", body, resp.StatusCode, resp.Header.Get("sl-violations"), answer)
			}
			t.Logf("%s: %d %s", name, resp.StatusCode, resp.Header.Get("sl-violations"))
		})
	}
}

// plainAccept sends requests on with Accept: application/json in place of
// the application/vnd.github+json GitHub asks clients to send (and checks
// that it was sent). GitHub's description declares its answers as
// application/json, and Prism matches media types literally: it answers
// GitHub's own Accept with 406. Accept is content negotiation, not part of
// the request's schema.
type plainAccept struct{ t *testing.T }

func (p plainAccept) RoundTrip(r *http.Request) (*http.Response, error) {
	if got := r.Header.Get("Accept"); got != "application/vnd.github+json" {
		p.t.Errorf("%s %s sent Accept %q, not GitHub's application/vnd.github+json", r.Method, r.URL.Path, got)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Accept", "application/json")
	return http.DefaultTransport.RoundTrip(r)
}
