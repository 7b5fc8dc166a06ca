package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/authz"
	"github.com/patchbay-dev/patchbay/internal/eventstream"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/web"
)

// stream opens a live stream of the UI; its lines come on the channel
// until it ends. A refusal is returned with its body read.
func (c *client) stream(ctx context.Context, path string) (*http.Response, <-chan string) {
	c.t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+path, nil)
	must(c.t, err)
	resp, err := c.http.Do(req)
	must(c.t, err)
	lines := make(chan string, 256)
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		close(lines)
		return resp, lines
	}
	go func() {
		defer close(lines)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return resp, lines
}

// The live execution page's stream and the approvals list count against
// the caps of the Streams the server shares with the API: past the
// session's cap the next is refused with 429 and Retry-After. The
// stream says "update" for every event and "finished" at the end.
func TestLiveStreamsAreCapped(t *testing.T) {
	t.Parallel()
	var streams *eventstream.Streams
	b := setupWith(t, func(o *web.Options) {
		streams = eventstream.New(o.Executions, &eventstream.Options{PerPrincipal: 3, Total: 10})
		o.Streams = streams
	})
	c := signIn(t, b)
	ex, err := b.execs.Submit(context.Background(), harness.Request{Workflow: json.RawMessage(guardedDoc), Principal: "ci-bot", Allowlist: "ops"})
	must(t, err)
	ap := waitPending(t, b)

	// One place is taken by an API stream of the same principal.
	apiStream, err := streams.Hold("admin")
	must(t, err)
	defer apiStream()
	resp, live := c.stream(context.Background(), "/admin/executions/"+ex.ID+"/stream")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("execution stream = %d", resp.StatusCode)
	}
	approvalsCtx, closeApprovals := context.WithCancel(context.Background())
	defer closeApprovals()
	if resp, _ := c.stream(approvalsCtx, "/admin/approvals/stream?v=0"); resp.StatusCode != http.StatusOK {
		t.Fatalf("approvals stream = %d", resp.StatusCode)
	}
	if mine, _ := streams.Open("admin"); mine != 3 {
		t.Fatalf("the operator holds %d streams, want 3", mine)
	}
	for _, path := range []string{"/admin/executions/" + ex.ID + "/stream", "/admin/approvals/stream?v=0"} {
		resp, _ := c.stream(context.Background(), path)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "5" {
			t.Fatalf("%s past the cap = %d (Retry-After %q), want 429 with Retry-After 5", path, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	// Another principal is not held up by the operator's cap.
	if _, err := streams.Hold("ci-bot"); err != nil {
		t.Fatalf("another principal's stream = %v", err)
	}

	_, err = b.execs.Approvals().DecideAs(context.Background(), ap.ID, gates.ApprovalApproved, authz.Operator("admin"), "")
	must(t, err)
	var events []string
	deadline := time.After(20 * time.Second)
	for done := false; !done; {
		select {
		case line, ok := <-live:
			if !ok {
				t.Fatalf("the stream ended after %v without finished", events)
			}
			if ev, found := strings.CutPrefix(line, "event: "); found {
				events = append(events, ev)
				done = ev == "finished"
			}
		case <-deadline:
			t.Fatalf("no finished after %v", events)
		}
	}
	if len(events) < 3 || events[0] != "update" || events[len(events)-2] != "update" {
		t.Fatalf("events %v, want updates then finished", events)
	}
	// The ended stream and the closed approvals list give their places
	// back.
	closeApprovals()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if mine, _ := streams.Open("admin"); mine == 1 {
			break
		}
		if time.Now().After(deadline) {
			mine, _ := streams.Open("admin")
			t.Fatalf("the operator still holds %d streams, want the API's 1", mine)
		}
	}
}
