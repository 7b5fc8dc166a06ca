package api_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/eventstream"
)

// openEvents opens exec's event stream as key and returns the response:
// its body is open while the stream is. A refusal is checked against
// openapi.yaml and returned with its body read.
func (b *bundle) openEvents(t *testing.T, ctx context.Context, key, exec string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", b.url+"/v1/executions/"+exec+"/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		t.Cleanup(func() { resp.Body.Close() })
		return resp, nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	b.conform(t, req, resp, body)
	return resp, body
}

// Past its cap a key's next stream is refused with 429 TOO_MANY_STREAMS
// and Retry-After, while another key may still open one; past the
// process's cap every key is refused; a stream that ends gives its place
// back.
func TestEventStreamCaps(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *api.Options) {
		o.Streams = eventstream.New(o.Executions, &eventstream.Options{PerPrincipal: 2, Total: 3})
	})
	mine := b.submitAs(t, testKey, `{"workflow":`+guardedDoc+`}`)
	bobs := b.submitAs(t, "bob-key", `{"workflow":`+guardedDoc+`}`)
	alices := b.submitAs(t, "alice-key", `{"workflow":`+guardedDoc+`}`)

	first, cancelFirst := context.WithCancel(context.Background())
	defer cancelFirst()
	for range 2 {
		if r, body := b.openEvents(t, first, testKey, mine); r.StatusCode != 200 {
			t.Fatalf("stream = %d %s", r.StatusCode, body)
		}
	}
	refused := func(key, exec, detail string) {
		t.Helper()
		r, body := b.openEvents(t, context.Background(), key, exec)
		p := reply{status: r.StatusCode, header: r.Header, body: body}.json(t)
		if r.StatusCode != 429 || p["code"] != "TOO_MANY_STREAMS" || r.Header.Get("Retry-After") != "5" ||
			r.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("stream as %s = %d %v (Retry-After %q), want 429 TOO_MANY_STREAMS with Retry-After 5", key, r.StatusCode, p, r.Header.Get("Retry-After"))
		}
		if got, _ := p["detail"].(string); !strings.Contains(got, detail) {
			t.Fatalf("detail %q, want it to say %q", got, detail)
		}
	}
	refused(testKey, mine, "you have 2 event streams open")
	if r, body := b.openEvents(t, context.Background(), "bob-key", bobs); r.StatusCode != 200 {
		t.Fatalf("another key's stream = %d %s", r.StatusCode, body)
	}
	refused("alice-key", alices, "the server has 3 event streams open")

	cancelFirst() // both of the first key's streams end
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, _ := b.openEvents(t, context.Background(), "alice-key", alices)
		if r.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream after others ended = %d", r.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
