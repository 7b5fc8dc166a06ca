package openapi

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
)

// A connection's identity is its document's URL and a hash of what the
// document declares: reloading the same document keeps it; a changed
// document changes the instance and moves the epoch.
func TestIdentityFollowsTheDocument(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	doc := callsDoc
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = io.WriteString(w, doc)
	}))
	t.Cleanup(ts.Close)
	p := New("api", config.OpenAPI{URL: ts.URL + "/openapi.json?token=abc"}, nil)
	load := func() connect.Identity {
		t.Helper()
		c, err := p.Connect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return c.Identity()
	}
	first := load()
	if first.Surface != "openapi" || first.Epoch != 1 || !strings.HasPrefix(first.Instance, ts.URL+"/openapi.json#") || strings.Contains(first.Instance, "abc") {
		t.Fatalf("identity = %+v", first)
	}
	if again := load(); again != first {
		t.Fatalf("same document: %+v, then %+v", first, again)
	}
	// Another process loading the same document agrees on the instance.
	if c, err := New("api", config.OpenAPI{URL: ts.URL + "/openapi.json?token=abc"}, nil).Connect(context.Background()); err != nil || c.Identity() != first {
		t.Fatalf("another provider: %+v, %v", c, err)
	}

	opGone := strings.Replace(callsDoc, `"/text":{"get":{"operationId":"text","responses":{"200":{"description":"ok"}}}},`, "", 1)
	steps := []struct {
		name  string
		doc   string
		epoch int64
	}{
		{"a parameter's type changes", strings.Replace(callsDoc, `"X-Trace","in":"header","schema":{"type":"string"}`, `"X-Trace","in":"header","schema":{"type":"integer"}`, 1), 2},
		{"the same again", "", 2},
		{"an operation goes", opGone, 3},
		{"only a description changes", strings.Replace(opGone, `"version":"1"`, `"version":"2","description":"new words"`, 1), 3},
	}
	prev := first
	for _, st := range steps {
		if st.doc != "" {
			mu.Lock()
			doc = st.doc
			mu.Unlock()
		}
		id := load()
		if id.Epoch != st.epoch {
			t.Fatalf("%s: epoch %d, want %d", st.name, id.Epoch, st.epoch)
		}
		if changed := id.Instance != prev.Instance; changed != (st.doc != "" && st.name != "only a description changes") {
			t.Fatalf("%s: instance %s after %s", st.name, id.Instance, prev.Instance)
		}
		prev = id
	}
}
