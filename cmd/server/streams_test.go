package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// streamsConfig is the demo server with note_put behind an approval, so
// an execution waits there for as long as a test likes, and keys for two
// callers and an approver.
func streamsConfig(t *testing.T) string {
	return writeConfig(t, fmt.Sprintf(`
connections:
  demo:
    mcp: { command: %q }
    policy: { approve: ["note_put"] }
allowlists:
  default:
    connections:
      demo: { ops: ["*"] }
apiKeys:
  - { name: streamer, key: streamer-key, allowlist: default }
  - { name: other, key: other-key, allowlist: default }
  - { name: oncall, key: approver-key, allowlist: default, roles: [approve] }
`, demoBin))
}

// withPoolSize is a Redis URL with go-redis's connection pool set to n.
func withPoolSize(url string, n int) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return fmt.Sprintf("%s%spool_size=%d", url, sep, n)
}

// waitingExecution submits hello.json (which waits for the approval of
// note_put) as key and returns its id.
func waitingExecution(t *testing.T, base, key string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(helloFor(t, "demo"), &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "wait")
	body, _ := json.Marshal(m)
	status, ex := postJSON(t, base+"/v1/executions", key, string(body))
	if status != 202 {
		t.Fatalf("POST as %s = %d %v", key, status, ex)
	}
	return ex["id"].(string)
}

// sseStream is one open event stream: its lines, and how to close it.
type sseStream struct {
	lines <-chan string
	close context.CancelFunc
}

// openStream opens an event stream and returns it once its first line
// came (so the server is serving it), or the refusal's status, header and
// body when the server answered other than 200.
func openStream(t *testing.T, c *http.Client, url, key string) (*sseStream, *http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != 200 {
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		cancel()
		return nil, resp, body
	}
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	select {
	case line, ok := <-lines:
		if !ok {
			t.Fatalf("GET %s: the stream ended before its first line", url)
		}
		// Put the first line back in front of the rest.
		all := make(chan string, 64)
		go func() {
			defer close(all)
			all <- line
			for l := range lines {
				all <- l
			}
		}()
		return &sseStream{lines: all, close: cancel}, resp, nil
	case <-time.After(10 * time.Second):
		t.Fatalf("GET %s: no line within 10s", url)
	}
	return nil, nil, nil
}

// timed runs f and fails t when it took longer than within.
func timed(t *testing.T, what string, within time.Duration, f func() int) {
	t.Helper()
	began := time.Now()
	status := f()
	took := time.Since(began)
	t.Logf("%s: %d in %s", what, status, took.Round(time.Millisecond))
	if status >= 500 || took > within {
		t.Errorf("%s = %d after %s, want an answer below 500 within %s", what, status, took.Round(time.Millisecond), within)
	}
}

// TestEventStreamsDoNotStallOtherCallers: one key holds many more event
// streams open on its waiting execution than the Redis pool has
// connections, while another key lists, submits and the load balancer
// probes /readyz: each answers as fast as without the streams (well
// under 2 s; when each stream held a pooled connection in a blocking
// read they took until the pool's timeout, then 503). Every stream then
// delivers the rest of the execution's events once, in order.
func TestEventStreamsDoNotStallOtherCallers(t *testing.T) {
	t.Parallel()
	modes := map[string]string{"miniredis": ""}
	if url := os.Getenv("PATCHBAY_TEST_REDIS_URL"); url != "" {
		modes["redis"] = url
	} else if os.Getenv("CI") == "true" {
		t.Fatal("CI requires PATCHBAY_TEST_REDIS_URL")
	}
	const pool, streams = 4, 30
	for mode, url := range modes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			if url == "" {
				// A server of the test's own, so that the pool can be small.
				url = "redis://" + miniredis.RunT(t).Addr()
			}
			srv := start(t, map[string]string{
				"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": streamsConfig(t),
				"REDIS_URL": withPoolSize(url, pool), "PATCHBAY_REDIS_PREFIX": "pbtest:" + rand.Text()[:10] + ":",
			})
			id := waitingExecution(t, srv.url, "streamer-key")
			var open []*sseStream
			for i := range streams {
				s, resp, body := openStream(t, http.DefaultClient, srv.url+"/v1/executions/"+id+"/events", "streamer-key")
				if s == nil {
					t.Fatalf("stream %d = %d %s", i+1, resp.StatusCode, body)
				}
				open = append(open, s)
			}
			// The streams are open and idle. Ask as the other key, a few
			// times over several seconds (the old blocking reads were
			// renewed every 15 s and held the pool throughout).
			doc := helloFor(t, "demo")
			for round := range 3 {
				timed(t, fmt.Sprintf("round %d: GET /v1/executions", round), 2*time.Second, func() int {
					resp := send(t, http.DefaultClient, "GET", srv.url+"/v1/executions", "other-key", nil)
					resp.Body.Close()
					return resp.StatusCode
				})
				timed(t, fmt.Sprintf("round %d: POST /v1/executions", round), 2*time.Second, func() int {
					var m map[string]any
					_ = json.Unmarshal(doc, &m)
					delete(m, "wait")
					body, _ := json.Marshal(m)
					status, _ := postJSON(t, srv.url+"/v1/executions", "other-key", string(body))
					return status
				})
				timed(t, fmt.Sprintf("round %d: GET /readyz", round), 2*time.Second, func() int {
					resp, err := http.Get(srv.url + "/readyz")
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					return resp.StatusCode
				})
				time.Sleep(time.Second)
			}

			// Approve: every stream delivers the rest, then ends.
			var approval string
			for deadline := time.Now().Add(10 * time.Second); approval == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				approval = pendingApprovalAs(t, srv.url, "streamer-key", id)
			}
			if status, ap := postJSON(t, srv.url+"/v1/approvals/"+approval+"/approve", "approver-key", `{}`); status != 200 {
				t.Fatalf("approve %q = %d %v", approval, status, ap)
			}
			want := eventIDs(t, srv.url, id, "streamer-key")
			for i, s := range open {
				got := drainIDs(t, s.lines, 20*time.Second)
				if strings.Join(got, " ") != strings.Join(want, " ") {
					t.Fatalf("stream %d delivered %v, want every event once, in order: %v", i+1, got, want)
				}
			}
		})
	}
}

// drainIDs reads a stream to its end (or for at most d) and returns the
// ids of its events.
func drainIDs(t *testing.T, lines <-chan string, d time.Duration) []string {
	t.Helper()
	var ids []string
	timeout := time.After(d)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				return ids
			}
			if id, found := strings.CutPrefix(line, "id: "); found {
				ids = append(ids, id)
			}
		case <-timeout:
			t.Fatalf("the stream did not end within %s; ids so far %v", d, ids)
		}
	}
}

// eventIDs reads a finished execution's whole stream and returns its ids.
func eventIDs(t *testing.T, base, id, key string) []string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp := send(t, http.DefaultClient, "GET", base+"/v1/executions/"+id, key, nil)
		var ex struct{ Status string }
		_ = json.NewDecoder(resp.Body).Decode(&ex)
		resp.Body.Close()
		if ex.Status == "succeeded" || ex.Status == "failed" || ex.Status == "cancelled" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s still %s", id, ex.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s, resp, body := openStream(t, http.DefaultClient, base+"/v1/executions/"+id+"/events", key)
	if s == nil {
		t.Fatalf("events of %s = %d %s", id, resp.StatusCode, body)
	}
	return drainIDs(t, s.lines, 10*time.Second)
}

func pendingApprovalAs(t *testing.T, base, key, exec string) string {
	t.Helper()
	resp := send(t, http.DefaultClient, "GET", base+"/v1/approvals?state=pending", key, nil)
	defer resp.Body.Close()
	var list struct {
		Items []struct{ ID, Execution string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	for _, ap := range list.Items {
		if ap.Execution == exec {
			return ap.ID
		}
	}
	return ""
}

// TestEventStreamCapsAcrossAPIAndUI: the caps come from the environment
// and count the API's streams and the admin UI's live pages together.
// Past a key's cap its next stream is 429 TOO_MANY_STREAMS with
// Retry-After while another key's is served; past the process's cap
// everyone's is refused, the UI's too; a closed stream frees its place.
func TestEventStreamCapsAcrossAPIAndUI(t *testing.T) {
	t.Parallel()
	srv := start(t, map[string]string{
		"PATCHBAY_ADDR": "127.0.0.1:0", "PATCHBAY_CONFIG": streamsConfig(t), "PATCHBAY_ADMIN_TOKEN": "the-admin-token",
		"PATCHBAY_MAX_STREAMS_PER_PRINCIPAL": "3", "PATCHBAY_MAX_STREAMS": "5",
	})
	mine := waitingExecution(t, srv.url, "streamer-key")
	others := waitingExecution(t, srv.url, "other-key")
	events := func(id string) string { return srv.url + "/v1/executions/" + id + "/events" }
	refused := func(t *testing.T, resp *http.Response, body []byte, detail string) {
		t.Helper()
		var p map[string]any
		_ = json.Unmarshal(body, &p)
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || p["code"] != "TOO_MANY_STREAMS" ||
			!strings.Contains(fmt.Sprint(p["detail"]), detail) || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("got %d %s (Retry-After %q), want 429 TOO_MANY_STREAMS saying %q", resp.StatusCode, body, resp.Header.Get("Retry-After"), detail)
		}
	}

	var streamer []*sseStream
	for range 3 {
		s, resp, body := openStream(t, http.DefaultClient, events(mine), "streamer-key")
		if s == nil {
			t.Fatalf("stream = %d %s", resp.StatusCode, body)
		}
		streamer = append(streamer, s)
	}
	_, resp, body := openStream(t, http.DefaultClient, events(mine), "streamer-key")
	refused(t, resp, body, "you have 3 event streams open")
	if s, resp, body := openStream(t, http.DefaultClient, events(others), "other-key"); s == nil {
		t.Fatalf("another key's stream = %d %s", resp.StatusCode, body)
	}

	// The admin UI's live execution page takes the last place; then the
	// UI, and every key, are refused.
	admin := adminSession(t, srv.url, "the-admin-token")
	if s, resp, body := openStream(t, admin, srv.url+"/admin/executions/"+mine+"/stream", ""); s == nil {
		t.Fatalf("admin UI stream = %d %s", resp.StatusCode, body)
	}
	if _, resp, _ := openStream(t, admin, srv.url+"/admin/executions/"+mine+"/stream", ""); resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("admin UI stream past the process's cap = %d (Retry-After %q), want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	_, resp, body = openStream(t, http.DefaultClient, events(others), "other-key")
	refused(t, resp, body, "the server has 5 event streams open")

	// Closing one of the streamer's streams frees a place.
	streamer[0].close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		s, resp, _ := openStream(t, http.DefaultClient, events(others), "other-key")
		if s != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream after another closed = %d", resp.StatusCode)
		}
	}
}
