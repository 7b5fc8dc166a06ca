package eventstream_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/eventstream"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/fault"
	"github.com/patchbay-dev/patchbay/internal/harness/gates"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

func TestHoldCaps(t *testing.T) {
	t.Parallel()
	type hold struct {
		who     string
		refused bool // and by which cap:
		mine    bool
	}
	tests := []struct {
		name         string
		per, total   int
		holds        []hold
		releaseFirst bool // release the first hold, then hold again as its principal
	}{
		{name: "per principal", per: 2, total: 10, holds: []hold{{who: "a"}, {who: "a"}, {who: "a", refused: true, mine: true}, {who: "b"}}},
		{name: "per process", per: 2, total: 3, holds: []hold{{who: "a"}, {who: "a"}, {who: "b"}, {who: "b", refused: true}, {who: "c", refused: true}}},
		{name: "principal first", per: 1, total: 1, holds: []hold{{who: "a"}, {who: "a", refused: true, mine: true}, {who: "b", refused: true}}},
		{name: "release frees", per: 1, total: 1, holds: []hold{{who: "a"}}, releaseFirst: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := eventstream.New(nil, &eventstream.Options{PerPrincipal: tt.per, Total: tt.total})
			var releases []func()
			for i, h := range tt.holds {
				release, err := s.Hold(h.who)
				var le *eventstream.LimitError
				switch {
				case !h.refused && err != nil:
					t.Fatalf("hold %d (%s) = %v", i, h.who, err)
				case h.refused && (!errors.As(err, &le) || !errors.Is(err, eventstream.ErrTooManyStreams)):
					t.Fatalf("hold %d (%s) = %v, want a *LimitError", i, h.who, err)
				case h.refused && le.PerPrincipal != h.mine:
					t.Fatalf("hold %d (%s) refused by the principal's cap: %v, want %v", i, h.who, le.PerPrincipal, h.mine)
				case h.refused && le.PerPrincipal && le.Limit != tt.per, h.refused && !le.PerPrincipal && le.Limit != tt.total:
					t.Fatalf("hold %d: limit %d", i, le.Limit)
				case err == nil:
					releases = append(releases, release)
				}
			}
			if tt.releaseFirst {
				first := tt.holds[0].who
				releases[0]()
				releases[0]() // a second release counts nothing
				if mine, total := s.Open(first); mine != 0 || total != 0 {
					t.Fatalf("after release: %d of %s, %d in all", mine, first, total)
				}
				if _, err := s.Hold(first); err != nil {
					t.Fatalf("hold after release = %v", err)
				}
				if _, err := s.Hold("other"); err == nil {
					t.Fatal("a double release freed a second place")
				}
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	s := eventstream.New(nil, nil)
	for range eventstream.DefaultPerPrincipal {
		if _, err := s.Hold("a"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Hold("a"); err == nil {
		t.Fatalf("hold %d of one principal was allowed", eventstream.DefaultPerPrincipal+1)
	}
	for i := eventstream.DefaultPerPrincipal; i < eventstream.DefaultTotal; i++ {
		if _, err := s.Hold(fmt.Sprint("p", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Hold("z"); err == nil {
		t.Fatalf("stream %d of the process was allowed", eventstream.DefaultTotal+1)
	}
}

// bundle is an execution service whose "hold" operation waits for
// release, and a test server relaying an execution's events with
// Streams.Serve as principal "alice".
type bundle struct {
	execs   *harness.Executions
	streams *eventstream.Streams
	url     string
	release func()
}

// testFormat writes the event type as the message's data, and "end"
// with the last event's type (or "none") when the stream ends.
var testFormat = eventstream.Format{
	Event: func(w io.Writer, ev harness.Event) error {
		_, err := fmt.Fprintf(w, "id: %s\ndata: %s\n\n", ev.ID, ev.Type)
		return err
	},
	End: func(w io.Writer, last *harness.Event) error {
		what := "none"
		if last != nil {
			what = last.Type
		}
		_, err := fmt.Fprintf(w, "event: end\ndata: %s\n\n", what)
		return err
	},
}

func setup(t *testing.T, st *store.Store, o *eventstream.Options) bundle {
	t.Helper()
	hold, release := connecttest.Held("hold")
	mem := connecttest.NewMemory(hold, connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})
	reg := registry.NewRegistry(nil)
	if err := reg.Add("mem", mem); err != nil {
		t.Fatal(err)
	}
	if err := reg.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	als := gates.NewAllowlists(st)
	al, err := gates.ParseAllowlist("test", []byte(`{"connections":{"mem":{"ops":["*"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := als.Put(context.Background(), al, "setup"); err != nil {
		t.Fatal(err)
	}
	execs := harness.NewExecutions(st, reg, &harness.ExecutionsOptions{Allowlists: als})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = execs.Run(ctx, 2); close(done) }()
	streams := eventstream.New(execs, o)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := streams.Serve(r.Context(), w, "alice", r.URL.Query().Get("id"), r.Header.Get("Last-Event-ID"), testFormat)
		switch {
		case errors.Is(err, eventstream.ErrTooManyStreams):
			http.Error(w, err.Error(), http.StatusTooManyRequests)
		case errors.Is(err, fault.ErrNotFound):
			http.Error(w, err.Error(), http.StatusNotFound)
		case errors.Is(err, harness.ErrInvalidEventID):
			http.Error(w, err.Error(), http.StatusBadRequest)
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	t.Cleanup(func() {
		release()
		srv.CloseClientConnections()
		srv.Close()
		cancel()
		<-done
		_ = reg.Close()
	})
	return bundle{execs: execs, streams: streams, url: srv.URL, release: release}
}

const holdThenEcho = `{"version":1,"connections":{"mem":{}},"root":{"kind":"sequence","id":"main","steps":[
	{"kind":"call","id":"h","connection":"mem","op":"hold"},
	{"kind":"call","id":"e","connection":"mem","op":"echo","args":{"n":1}}]}}`

func (b bundle) submit(t *testing.T) string {
	t.Helper()
	ex, err := b.execs.Submit(context.Background(), harness.Request{Workflow: []byte(holdThenEcho), Principal: "alice", Allowlist: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return ex.ID
}

// open starts a stream; its lines come on the channel until it ends.
func (b bundle) open(t *testing.T, ctx context.Context, id, lastEventID string) (int, <-chan string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", b.url+"?id="+id, nil)
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 256)
	go func() {
		defer close(lines)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return resp.StatusCode, lines
}

// collect reads a stream to its end: its event ids, its data lines and
// whether it sent a keep-alive.
func collect(t *testing.T, lines <-chan string) (ids, data []string, keepAlive bool) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			switch {
			case !ok:
				return ids, data, keepAlive
			case strings.HasPrefix(line, "id: "):
				ids = append(ids, strings.TrimPrefix(line, "id: "))
			case strings.HasPrefix(line, "data: "):
				data = append(data, strings.TrimPrefix(line, "data: "))
			case line == ": keep-alive":
				keepAlive = true
			}
		case <-timeout:
			t.Fatalf("the stream did not end; ids so far %v", ids)
		}
	}
}

// A live stream sends every event once and in order, keep-alives while
// nothing happens, and its end after execution.finished; resumed after an
// event it sends the rest; resumed after the last it ends at once. A
// stream that ends gives its place back.
func TestServe(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		b := setup(t, st, &eventstream.Options{Heartbeat: 50 * time.Millisecond})
		id := b.submit(t)
		status, lines := b.open(t, context.Background(), id, "")
		if status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
		time.Sleep(200 * time.Millisecond) // a few heartbeats while the step is held
		b.release()
		ids, data, keepAlive := collect(t, lines)
		evs, err := b.execs.Events(context.Background(), id, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		var want, wantData []string
		for _, ev := range evs {
			want, wantData = append(want, ev.ID), append(wantData, ev.Type)
		}
		wantData = append(wantData, harness.EventFinished) // the end names the last event
		if strings.Join(ids, " ") != strings.Join(want, " ") || strings.Join(data, " ") != strings.Join(wantData, " ") {
			t.Fatalf("stream: ids %v data %v\nwant ids %v data %v", ids, data, want, wantData)
		}
		if !keepAlive {
			t.Error("no keep-alive while the step was held")
		}

		_, lines = b.open(t, context.Background(), id, want[1])
		ids, _, _ = collect(t, lines)
		if strings.Join(ids, " ") != strings.Join(want[2:], " ") {
			t.Fatalf("after %s: %v, want %v", want[1], ids, want[2:])
		}
		_, lines = b.open(t, context.Background(), id, want[len(want)-1])
		ids, data, _ = collect(t, lines)
		if len(ids) != 0 || strings.Join(data, " ") != "none" {
			t.Fatalf("after the last event: ids %v data %v, want only the end", ids, data)
		}
		if mine, total := b.streams.Open("alice"); mine != 0 || total != 0 {
			t.Fatalf("after the streams ended: %d of alice's, %d in all still counted", mine, total)
		}
	})
}

// Refusals come before anything is written; a client that leaves gives
// its place back.
func TestServeRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t, storetest.NewEmbedded(t), &eventstream.Options{PerPrincipal: 2, Total: 5})
	id := b.submit(t)
	for _, tt := range []struct {
		id, after string
		want      int
	}{
		{"ex_missing", "", http.StatusNotFound},
		{id, "garbage", http.StatusBadRequest},
	} {
		if status, _ := b.open(t, context.Background(), tt.id, tt.after); status != tt.want {
			t.Errorf("stream of %s after %q = %d, want %d", tt.id, tt.after, status, tt.want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	for range 2 {
		if status, _ := b.open(t, ctx, id, ""); status != http.StatusOK {
			t.Fatalf("stream = %d", status)
		}
	}
	if status, _ := b.open(t, context.Background(), id, ""); status != http.StatusTooManyRequests {
		t.Fatalf("third stream of alice = %d, want 429", status)
	}
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if mine, _ := b.streams.Open("alice"); mine == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the streams of a client that left are still counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if status, _ := b.open(t, context.Background(), id, ""); status != http.StatusOK {
		t.Fatalf("stream after the others left = %d", status)
	}
}
