package webhooks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/patchbay-dev/patchbay/internal/api"
	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/harness/connect/connecttest"
	"github.com/patchbay-dev/patchbay/internal/harness/registry"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
	"github.com/patchbay-dev/patchbay/internal/webhooks"
)

// benchServer is one API server on loopback over the real Redis, with a
// source "jobs" taking webhooks and a trigger echoing on a Memory
// connection.
type benchServer struct {
	url   string
	svc   *triggers.Service
	execs *harness.Executions
	stop  func()
}

func newBenchServer(b *testing.B, workers int) *benchServer {
	b.Helper()
	if storetest.URL(b) == "" {
		b.Skip("needs a real Redis: set " + storetest.EnvURL + " (make bench does)")
	}
	st := storetest.New(b)
	reg := registry.NewRegistry(nil)
	if err := reg.Add("mem", connecttest.NewMemory(connecttest.MemoryOp{Operation: connect.Operation{Name: "echo"}})); err != nil {
		b.Fatal(err)
	}
	if err := reg.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	execs := harness.NewExecutions(st, reg, nil)
	f := &config.File{
		Connections: map[string]config.Connection{
			"jobs": {Source: &config.Source{Events: map[string]any{"job.done": map[string]any{"type": "object"}}},
				Webhooks: &config.Webhooks{Secrets: []string{specSecret}}},
		},
		Triggers: []config.Trigger{{ID: "done", Connection: "jobs", Event: "job.done",
			Input:    map[string]any{"text": map[string]any{"$expr": "event.id"}},
			Document: json.RawMessage(`{"version":1,"connections":{"mem":{}},"root":{"kind":"call","id":"say","connection":"mem","op":"echo","args":{"text":{"$expr":"$input.text"}}}}`)}},
	}
	svc, err := triggers.New(triggers.Options{Store: st, Executions: execs, Registry: reg, File: f})
	if err != nil {
		b.Fatal(err)
	}
	recv, err := webhooks.New(f.Connections, svc, nil)
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Options{Executions: execs, Registry: reg, Triggers: svc, Webhooks: recv}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		if workers > 0 {
			_ = execs.Run(ctx, workers)
		}
		close(done)
	}()
	bs := &benchServer{url: srv.URL, svc: svc, execs: execs}
	bs.stop = func() { srv.Close(); svc.Close(); cancel(); <-done }
	b.Cleanup(bs.stop)
	return bs
}

type hookReq struct {
	id, ts, sig string
	body        []byte
}

func signedRequests(b *testing.B, n int, prefix string) []hookReq {
	wh, err := standardwebhooks.NewWebhook(specSecret)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	out := make([]hookReq, n)
	for i := range out {
		id := fmt.Sprintf("%s-%d", prefix, i)
		body := []byte(fmt.Sprintf(`{"type":"job.done","id":%q,"payload":{"n":%d}}`, id, i))
		sig, _ := wh.Sign(id, now, body)
		out[i] = hookReq{id: id, ts: strconv.FormatInt(now.Unix(), 10), sig: sig, body: body}
	}
	return out
}

func post(c *http.Client, url string, r hookReq) (int, error) {
	req, _ := http.NewRequest("POST", url, bytes.NewReader(r.body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", r.id)
	req.Header.Set("webhook-timestamp", r.ts)
	req.Header.Set("webhook-signature", r.sig)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// BenchmarkWebhookIngest: accepted signed webhooks per second (unique
// ids) against one server on the real Redis, 64 keep-alive clients on
// loopback, triggers not started (ingest alone: verify, dedupe, append).
func BenchmarkWebhookIngest(b *testing.B) {
	const n, clients = 30_000, 64
	s := newBenchServer(b, 0)
	reqs := signedRequests(b, n, "ingest")
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients, MaxConnsPerHost: clients}}
	url := s.url + "/hooks/jobs"
	b.ResetTimer()
	for range b.N {
		var next, accepted atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= n {
						return
					}
					if code, err := post(c, url, reqs[i]); err == nil && code == 204 {
						accepted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		el := time.Since(start)
		if accepted.Load() != n {
			b.Fatalf("accepted %d of %d", accepted.Load(), n)
		}
		b.ReportMetric(float64(n)/el.Seconds(), "webhooks/s")
		b.StopTimer()
		reqs = signedRequests(b, n, fmt.Sprintf("ingest-%d", time.Now().UnixNano()))
		b.StartTimer()
	}
}

// BenchmarkEventToStart: event → execution-start latency at 500 events/s
// (webhook sent → the execution's startedAt, and → its record created by
// the inbox delivery), delivery and 16 workers running in the same server.
func BenchmarkEventToStart(b *testing.B) {
	const rate, seconds = 500, 6
	const n = rate * seconds
	// 16 workers (PATCHBAY_WORKERS=16): at 500 executions/s the default 4
	// are near their capacity and start latency is their queueing.
	s := newBenchServer(b, 16)
	if err := s.svc.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	reqs := signedRequests(b, n, "lat")
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	url := s.url + "/hooks/jobs"
	sent := make([]time.Time, n)
	b.ResetTimer()
	tick := time.NewTicker(time.Second / rate)
	var wg sync.WaitGroup
	for i := range n {
		<-tick.C
		sent[i] = time.Now()
		wg.Go(func() {
			if code, err := post(c, url, reqs[i]); err != nil || code != 204 {
				b.Errorf("event %d: %d %v", i, code, err)
			}
		})
	}
	tick.Stop()
	wg.Wait()
	b.StopTimer()
	idx := map[string]int{}
	for i, r := range reqs {
		idx[r.id] = i
	}
	var lat, created []time.Duration
	deadline := time.Now().Add(30 * time.Second)
	for len(lat) < n && time.Now().Before(deadline) {
		lat, created = lat[:0], created[:0]
		cursor := ""
		for {
			page, err := s.execs.List(context.Background(), harness.ListOptions{Limit: 100, Cursor: cursor})
			if err != nil {
				b.Fatal(err)
			}
			for _, ex := range page.Items {
				if ex.StartedAt == nil {
					continue
				}
				in, _ := ex.Input.(map[string]any)
				i, ok := idx[fmt.Sprint(in["text"])]
				if ok {
					lat = append(lat, ex.StartedAt.Sub(sent[i]))
					created = append(created, ex.CreatedAt.Sub(sent[i]))
				}
			}
			if cursor = page.Next; cursor == "" {
				break
			}
		}
	}
	if len(lat) < n {
		b.Fatalf("%d of %d executions started", len(lat), n)
	}
	slices.Sort(lat)
	slices.Sort(created)
	p := func(d []time.Duration, q float64) float64 {
		return float64(d[int(q*float64(len(d)-1))].Microseconds()) / 1000
	}
	// start: the execution's startedAt (a worker took it); created: the
	// execution record written by the inbox delivery (SubmitOnce).
	b.ReportMetric(p(lat, 0.50), "start-p50-ms")
	b.ReportMetric(p(lat, 0.99), "start-p99-ms")
	b.ReportMetric(p(lat, 1), "start-max-ms")
	b.ReportMetric(p(created, 0.50), "created-p50-ms")
	b.ReportMetric(p(created, 0.99), "created-p99-ms")
}
