package mcp_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	pbmcp "github.com/patchbay-dev/patchbay/internal/mcp"
)

var update = flag.Bool("update", false, "rewrite golden files")

// recorder keeps the params of every request of one method a server got.
type recorder struct {
	method string
	mu     sync.Mutex
	params []map[string]any
}

func (r *recorder) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string         `json:"method"`
			Params map[string]any `json:"params"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Method == r.method {
			delete(msg.Params, "_meta") // the protocol's, tested elsewhere
			r.mu.Lock()
			r.params = append(r.params, msg.Params)
			r.mu.Unlock()
		}
		next.ServeHTTP(w, req)
	})
}

func (r *recorder) got() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.params)
}

// serveRecorded serves the demo with its events (and opts), recording the
// requests of method.
func serveRecorded(t *testing.T, ev *demo.Events, method string, opts ...server.ServerOption) (config.MCP, *recorder, *server.MCPServer) {
	t.Helper()
	s := demo.NewServer(append([]server.ServerOption{demo.EventsCapability()}, opts...)...)
	s.AddTools(ev.Tool())
	rec := &recorder{method: method}
	ts := httptest.NewServer(rec.wrap(ev.Handler(server.NewStreamableHTTPServer(s))))
	t.Cleanup(ts.Close)
	return config.MCP{URL: ts.URL + "/mcp"}, rec, s
}

func golden(t *testing.T, name string, got any) {
	t.Helper()
	b, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if !bytes.Equal(bytes.TrimSpace(want), b) {
		t.Errorf("%s differs:\n got %s\nwant %s", path, b, want)
	}
}

// TestEventsPollRequestOnTheWire: events/poll carries name, arguments,
// cursor, maxEvents and the long poll's timeoutMs; maxAgeMs only with a
// cursor (without one the poll starts from now anyway).
func TestEventsPollRequestOnTheWire(t *testing.T) {
	t.Parallel()
	ev := demo.NewEvents()
	spec, rec, _ := serveRecorded(t, ev, "events/poll")
	p := poller(t, openConn(t, "tickets", spec, nil))
	req := connect.EventPoll{Name: demo.EventTicketCreated, Arguments: map[string]any{"priority": "high"}, MaxEvents: 50, Timeout: 30 * time.Second, MaxAge: 5 * time.Minute}
	first, err := p.PollEvents(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	ev.Open("an event, so the long poll is answered at once", "high")
	req.Cursor = first.Cursor
	if _, err := p.PollEvents(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	golden(t, "events_poll_requests.json", rec.got())
}

func TestEventsLongPoll(t *testing.T) {
	t.Parallel()
	ev := demo.NewEvents()
	p := poller(t, openConn(t, "tickets", serveEvents(t, ev), nil))
	start, err := p.PollEvents(t.Context(), connect.EventPoll{Name: demo.EventTicketCreated})
	if err != nil {
		t.Fatal(err)
	}
	long := connect.EventPoll{Name: demo.EventTicketCreated, Arguments: map[string]any{"priority": "high"}, Cursor: start.Cursor, Timeout: 20 * time.Second}

	t.Run("answered when a matching event arrives", func(t *testing.T) {
		go func() {
			time.Sleep(200 * time.Millisecond)
			ev.Open("not for this subscription", "low") // does not end the hold
			time.Sleep(100 * time.Millisecond)
			ev.Open("urgent", "high")
		}()
		began := time.Now()
		b, err := p.PollEvents(t.Context(), long)
		took := time.Since(began)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Events) != 1 || b.Events[0].Data["title"] != "urgent" || took < 250*time.Millisecond || took > 10*time.Second {
			t.Errorf("events %+v after %s; want the urgent one after about 300ms", b.Events, took)
		}
		long.Cursor = b.Cursor
	})
	t.Run("empty after timeoutMs", func(t *testing.T) {
		quiet := long
		quiet.Timeout = 300 * time.Millisecond
		began := time.Now()
		b, err := p.PollEvents(t.Context(), quiet)
		if took := time.Since(began); err != nil || len(b.Events) != 0 || took < 250*time.Millisecond {
			t.Errorf("poll = %+v, %v after %s; want empty after about 300ms", b, err, took)
		}
	})
}

// TestEventsMaxAgeSkipsOldEvents: a cursor older than maxAgeMs replays
// only the events within it, and the answer says events were skipped.
func TestEventsMaxAgeSkipsOldEvents(t *testing.T) {
	t.Parallel()
	ev := demo.NewEvents()
	p := poller(t, openConn(t, "tickets", serveEvents(t, ev), nil))
	_, cursor, _ := drain(t, p, nil, nil)
	ev.Open("stale", "low")
	ev.Open("stale too", "low")
	time.Sleep(300 * time.Millisecond)
	ev.Open("fresh", "low")
	b, err := p.PollEvents(t.Context(), connect.EventPoll{Name: demo.EventTicketCreated, Cursor: cursor, MaxAge: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 1 || b.Events[0].Data["title"] != "fresh" || !b.Truncated {
		t.Errorf("events %+v truncated %v; want only the fresh one, truncated", b.Events, b.Truncated)
	}
}

// TestEventsListedToTheLastPage: events/list is read page by page, each
// request carrying the previous page's nextCursor.
func TestEventsListedToTheLastPage(t *testing.T) {
	t.Parallel()
	ev := &demo.Events{PageSize: 2}
	for _, name := range []string{"build.started", "build.finished", "deploy.started", "deploy.finished"} {
		ev.AddType(name)
	}
	spec, rec, _ := serveRecorded(t, ev, "events/list")
	conn := openConn(t, "paged", spec, nil)
	var names []string
	for _, et := range conn.Manifest().Events {
		names = append(names, et.Name)
	}
	want := []string{demo.EventTicketCreated, "build.started", "build.finished", "deploy.started", "deploy.finished"}
	if !slices.Equal(names, want) {
		t.Errorf("events %v, want %v", names, want)
	}
	var cursors []any
	for _, p := range rec.got() {
		cursors = append(cursors, p["cursor"])
	}
	if !slices.Equal(cursors, []any{nil, "2", "4"}) {
		t.Errorf("events/list cursors %v, want none, 2, 4", cursors)
	}
}

// TestEventsListChangedListsAgain: the server's list_changed makes the
// connection list its events again, to the last page: a type added is
// offered, a type removed is not. The notification needs a channel from
// the server: a 2025-11-25 session's GET stream (a 2026-07-28 session has
// none for extension notifications).
func TestEventsListChangedListsAgain(t *testing.T) {
	t.Parallel()
	ev := &demo.Events{PageSize: 1}
	spec, rec, s := serveRecorded(t, ev, "events/list",
		server.WithExtensions(map[string]any{pbmcp.ExtEvents: map[string]any{"listChanged": true}}))
	ev.Notify = s.SendNotificationToAllClients
	conn := openConn(t, "changing", spec, &pbmcp.Options{ProtocolVersion: "2025-11-25"})
	p := poller(t, conn)
	names := func() []string {
		var out []string
		for _, et := range p.EventTypes() {
			out = append(out, et.Name)
		}
		return out
	}
	if got := names(); !slices.Equal(got, []string{demo.EventTicketCreated}) {
		t.Fatalf("events at connect = %v", got)
	}
	lists := len(rec.got())
	ev.AddType("build.finished")
	eventually(t, "build.finished listed", func() bool {
		return slices.Equal(names(), []string{demo.EventTicketCreated, "build.finished"})
	})
	ev.RemoveType(demo.EventTicketCreated)
	eventually(t, "ticket.created gone", func() bool { return slices.Equal(names(), []string{"build.finished"}) })
	if n := len(rec.got()) - lists; n < 3 {
		t.Errorf("%d events/list requests after two changes, want at least 3 (two pages, then one)", n)
	}
	// The manifest read at connect stays as it was; the live list is
	// what subscriptions and waits check.
	if m := conn.Manifest().Events; len(m) != 1 || m[0].Name != demo.EventTicketCreated {
		t.Errorf("manifest events = %+v", m)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
