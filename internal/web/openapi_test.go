package web_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/openapi"
)

// openAPIDoc has three issue operations and n more "extra" ones.
func openAPIDoc(n int) string {
	var extra strings.Builder
	for i := range n {
		fmt.Fprintf(&extra, `,"/extra/%d":{"get":{"operationId":"extra-%d","tags":["extra"],"responses":{"200":{"description":"ok"}}}}`, i, i)
	}
	return `{"openapi":"3.1.0","info":{"title":"t","version":"1"},"servers":[{"url":"https://api.example.test/v3"}],"paths":{
 "/repos/{owner}/{repo}/issues":{"parameters":[{"name":"owner","in":"path","required":true,"schema":{"type":"string"}},{"name":"repo","in":"path","required":true,"schema":{"type":"string"}}],
  "get":{"operationId":"issues/list-for-repo","tags":["issues"],"parameters":[{"name":"state","in":"query","schema":{"enum":["open","closed"]}}],"responses":{"200":{"description":"ok"}}},
  "post":{"operationId":"issues/create","tags":["issues"],"requestBody":{"content":{"application/json":{"schema":{"type":"object","properties":{"title":{"type":"string"}},"required":["title"]}}}},"responses":{"201":{"description":"made"}}}},
 "/issues/{n}":{"delete":{"operationId":"issues/remove","tags":["issues"],"parameters":[{"name":"n","in":"path","required":true,"schema":{"type":"integer"}}],"responses":{"204":{"description":"gone"}}}}` +
		extra.String() + `}}`
}

// The connection page of an OpenAPI connection shows its kind, document,
// base URL, operation count and the include in force (an expression
// among the names, and what selected nothing), and each operation's
// method, path and input schema; one with more than 100 operations and no
// include shows the warning.
func TestOpenAPIConnectionPage(t *testing.T) {
	t.Parallel()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := 0
		if r.URL.Path == "/many.json" {
			n = openapi.WarnOperations
		}
		_, _ = io.WriteString(w, openAPIDoc(n))
	}))
	t.Cleanup(api.Close)
	b := setupConns(t, nil, func(reg *registry.Registry) {
		gh := openapi.New("gh", config.OpenAPI{URL: api.URL + "/doc.json?key=s3cret", Include: []config.Include{
			{Name: "issues/create"}, config.IncludeExpr("method == 'GET' && 'issues' in tags"), {Name: "pulls/get"},
		}}, nil)
		must(t, reg.Add("gh", gh))
		must(t, reg.SetKind("gh", "openapi", api.URL+"/doc.json"))
		must(t, reg.Add("many", openapi.New("many", config.OpenAPI{URL: api.URL + "/many.json"}, nil)))
		must(t, reg.SetKind("many", "openapi", api.URL+"/many.json"))
	})
	c := signIn(t, b)

	p := c.get("/admin/connections/gh")
	if p.status != http.StatusOK {
		t.Fatalf("gh: %d", p.status)
	}
	for sel, want := range map[string]string{
		"#kind":               "openapi",
		"#openapi-document":   api.URL + "/doc.json",
		"#openapi-base-url":   "https://api.example.test/v3",
		"#openapi-operations": "2",
		"#openapi-unmatched":  "pulls/get",
	} {
		if got := text(p.doc.Find(sel)); got != want {
			t.Errorf("%s = %q, want %q", sel, got, want)
		}
	}
	var include []string
	p.doc.Find("#openapi-include li").Each(func(_ int, li *goquery.Selection) { include = append(include, text(li)) })
	if got, want := strings.Join(include, " | "), "issues/create | $expr: method == 'GET' && 'issues' in tags | pulls/get"; got != want {
		t.Errorf("include = %q, want %q", got, want)
	}
	if p.doc.Find("#openapi-warning").Length() != 0 {
		t.Error("a warning for two operations")
	}
	if strings.Contains(p.doc.Text(), "s3cret") {
		t.Error("the page shows the document URL's query")
	}
	for op, want := range map[string]string{"issues/list-for-repo": "GET /repos/{owner}/{repo}/issues", "issues/create": "POST /repos/{owner}/{repo}/issues"} {
		row := p.doc.Find(`#operations tr[data-op="` + op + `"]`)
		if got := text(row.Find("td.request")); got != want {
			t.Errorf("%s request = %q, want %q", op, got, want)
		}
		if row.Find("details summary").Length() != 1 {
			t.Errorf("%s: schema not in a <details>", op)
		}
	}
	schema := p.doc.Find(`#operations tr[data-op="issues/create"] details pre`).Text()
	for _, w := range []string{`"title"`, `"owner"`, `"required"`} {
		if !strings.Contains(schema, w) {
			t.Errorf("issues/create schema lacks %s:\n%s", w, schema)
		}
	}
	if p.doc.Find(`#operations tr[data-op="issues/remove"]`).Length() != 0 {
		t.Error("an operation include left out is listed")
	}

	p = c.get("/admin/connections/many")
	if got := text(p.doc.Find("#openapi-warning")); !strings.Contains(got, "103 operations without include") {
		t.Errorf("warning = %q", got)
	}
	if got := text(p.doc.Find("#openapi-include")); !strings.Contains(got, "every operation") {
		t.Errorf("include = %q", got)
	}

	// Other kinds have no OpenAPI panel and no request column.
	p = c.get("/admin/connections/mem")
	if p.doc.Find("#openapi").Length() != 0 || p.doc.Find("#operations td.request").Length() != 0 {
		t.Error("the memory connection shows OpenAPI parts")
	}
}
