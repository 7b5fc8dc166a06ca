package githubapp_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"

	"github.com/patchbay-dev/patchbay/internal/npmtest"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// githubOpenAPI pins GitHub's own OpenAPI description (npm
// @octokit/openapi), as internal/openapi's tests do.
const githubOpenAPI = "@octokit/openapi@23.0.2"

// TestAgainstGitHubsDescription checks, with GitHub's own description,
// that the fake's answers the other tests rely on are valid responses
// (which TestOnPrism cannot: there Prism answers). It checks the requests
// too, as the response check needs them; TestOnPrism is the authority on
// those, with a validator nobody here configured.
func TestAgainstGitHubsDescription(t *testing.T) {
	dir := npmtest.Require(t, "octokit-openapi", githubOpenAPI)
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(filepath.Join(dir, "generated", "api.github.com.json"))
	if err != nil {
		t.Fatalf("load GitHub's description: %v", err)
	}
	var mu sync.Mutex
	checked := map[string]bool{}
	check := func(route string, h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			in := validate(t, doc, route, r)
			rec := httptest.NewRecorder()
			h(rec, r)
			out := &openapi3filter.ResponseValidationInput{
				RequestValidationInput: in, Status: rec.Code, Header: rec.Header(),
				Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
			}
			out.SetBodyBytes(rec.Body.Bytes())
			if rec.Code < 400 {
				if err := openapi3filter.ValidateResponse(r.Context(), out); err != nil {
					t.Errorf("the fake's answer to %s is not what GitHub documents: %v", route, err)
				}
			}
			mu.Lock()
			checked[route] = true
			mu.Unlock()
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
		}
	}
	gh := newFakeChecked(t, newClock(), "", check)
	r := newReplica(t, gh, storetest.New(t))
	if _, err := r.src.Token(t.Context(), widgets); err != nil {
		t.Fatal(err)
	}
	if !checked[lookupRoute] || !checked[exchangeRoute] {
		t.Fatalf("checked %v, want both routes", checked)
	}
}

// validate checks r against the operation of route in GitHub's
// description and returns what response validation needs.
func validate(t *testing.T, doc *openapi3.T, route string, r *http.Request) *openapi3filter.RequestValidationInput {
	method, path, _ := strings.Cut(route, " ")
	item := doc.Paths.Find(path)
	if item == nil || item.GetOperation(method) == nil {
		t.Fatalf("GitHub's description has no %s", route)
	}
	params := map[string]string{}
	for _, name := range pathParams(path) {
		params[name] = r.PathValue(name)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	check := r.Clone(context.WithoutCancel(r.Context()))
	check.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.RequestValidationInput{
		Request: check, PathParams: params,
		Route:   &routers.Route{Spec: doc, Path: path, PathItem: item, Method: method, Operation: item.GetOperation(method)},
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true},
	}
	if err := openapi3filter.ValidateRequest(r.Context(), in); err != nil {
		t.Errorf("%s is not a request GitHub documents: %v", route, err)
	}
	return in
}

// pathParams are the {names} in a path template.
func pathParams(path string) []string {
	var names []string
	for _, seg := range strings.Split(path, "/") {
		if name, ok := strings.CutPrefix(seg, "{"); ok {
			names = append(names, strings.TrimSuffix(name, "}"))
		}
	}
	return names
}
