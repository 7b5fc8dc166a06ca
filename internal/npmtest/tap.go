package npmtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Tap is a reverse proxy in front of a server under test (Prism, mostly)
// that keeps every exchange, so a test can say what the server was sent
// and whether it found fault with it. It listens on loopback.
type Tap struct {
	*httptest.Server
	mu   sync.Mutex
	seen []Exchange
}

// Exchange is one request through a Tap and its answer.
type Exchange struct {
	Method, Path string // Path holds the query too
	Body         string // the request body
	Status       int
	// Violations is Prism's sl-violations header: what it found wrong
	// with the request (or its own answer), empty when nothing.
	Violations string
}

func (e Exchange) String() string {
	return fmt.Sprintf("%s %s → %d %s", e.Method, e.Path, e.Status, e.Violations)
}

type bodyKey struct{}

// NewTap starts a Tap forwarding to target, closed when the test ends.
func NewTap(t testing.TB, target string) *Tap {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	tap := &Tap{}
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.ModifyResponse = func(resp *http.Response) error {
		body, _ := resp.Request.Context().Value(bodyKey{}).([]byte)
		tap.mu.Lock()
		defer tap.mu.Unlock()
		tap.seen = append(tap.seen, Exchange{
			Method: resp.Request.Method, Path: resp.Request.URL.RequestURI(), Body: string(body),
			Status: resp.StatusCode, Violations: resp.Header.Get("sl-violations"),
		})
		return nil
	}
	tap.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The body is read here, before the proxy sends it on, and
		// travels to ModifyResponse in the request's context.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), bodyKey{}, body)))
	}))
	t.Cleanup(tap.Close)
	return tap
}

// Since returns the exchanges after the first n.
func (p *Tap) Since(n int) []Exchange {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.seen[n:])
}

// Count is how many exchanges the Tap has kept.
func (p *Tap) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.seen)
}

// CheckClean fails unless exchanges are the requests want ("METHOD
// /path", query left out), each answered 2xx with no violation.
func CheckClean(t testing.TB, exchanges []Exchange, want ...string) {
	t.Helper()
	var got []string
	for _, e := range exchanges {
		if e.Status/100 != 2 || e.Violations != "" {
			t.Errorf("Prism found fault with %s", e)
		}
		path, _, _ := strings.Cut(e.Path, "?")
		got = append(got, e.Method+" "+path)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Prism was sent %q, want %q", got, want)
	}
}
