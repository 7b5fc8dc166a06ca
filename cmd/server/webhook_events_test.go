package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/server"

	"github.com/patchbay-dev/patchbay/internal/demo"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// balancer stands in for the load balancer in front of the replicas: it
// sends each /hooks delivery to the next replica, or to the other when
// that one is down.
func balancer(t *testing.T, replicas []*replica) string {
	t.Helper()
	var n atomic.Int64
	lb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		start := int(n.Add(1))
		for i := range replicas {
			target := replicas[(start+i)%len(replicas)]
			req, _ := http.NewRequest(r.Method, "http://"+target.addr+r.URL.Path, bytes.NewReader(body))
			req.Header = r.Header.Clone()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				continue // down: the next one
			}
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(answer)
			return
		}
		w.WriteHeader(http.StatusBadGateway)
	}))
	t.Cleanup(lb.Close)
	return lb.URL
}

// TestServerEventsByWebhookAcrossReplicas: two replicas behind one public
// URL share a webhook subscription to the demo's ticket.escalated, granted
// two seconds at a time. Deliveries reach either replica; each is killed
// (SIGKILL) in turn while tickets keep coming, so the lease holder dies at
// least once and the other keeps the subscription refreshed. Each
// escalation starts exactly one turn.
func TestServerEventsByWebhookAcrossReplicas(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") shared by two processes")
	}
	st := storetest.New(t)
	s := demo.NewServer(demo.EventsCapability())
	ev := &demo.Events{Hooks: &demo.Hooks{MaxTTL: 2 * time.Second, RetryBase: 50 * time.Millisecond}}
	s.AddTools(ev.Tool())
	ts := httptest.NewServer(ev.Handler(server.NewStreamableHTTPServer(s)))
	t.Cleanup(ts.Close)
	cfg := writeConfig(t, eventsConfig(ts.URL+"/mcp", "ticket.escalated", "{}"))
	dir := t.TempDir()
	replicas := make([]*replica, 2)
	for i := range replicas {
		replicas[i] = &replica{bin: serverBin, addr: freeAddr(t), logPath: filepath.Join(dir, fmt.Sprintf("replica-%d.log", i))}
	}
	public := balancer(t, replicas)
	for _, r := range replicas {
		r.env = []string{
			"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
			"REDIS_URL=" + storetest.URL(t), "PATCHBAY_REDIS_PREFIX=" + st.Prefix, "PATCHBAY_CONFIG=" + cfg,
			"PATCHBAY_ADDR=" + r.addr, "PATCHBAY_API_KEYS=k1", "PATCHBAY_LOG_LEVEL=warn", "PATCHBAY_CLAIM_TIMEOUT=2s",
			"PATCHBAY_PUBLIC_URL=" + public, "PATCHBAY_SECRET_KEY=0123456789abcdef0123456789abcdef",
		}
		if err := r.start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, r := range replicas {
			r.kill()
		}
	})
	waitUntil(t, "the webhook subscription", func() bool { return ev.Hooks.Subscriptions() == 1 })

	tickets := &ticketStream{ev: ev, gap: 20 * time.Millisecond}
	tickets.killEachInTurn(t, st, replicas)
	// Past several grants: the subscription was kept refreshed.
	time.Sleep(3 * time.Second)
	tickets.open(6)
	want := tickets.checkOneTurnEach(t, st)
	if sub := onlySubscription(t, replicas[0].addr); sub["mode"] != "webhook" || sub["subscriptionId"] == nil || sub["expiresAt"] == nil || sub["events"] != float64(len(want)) {
		t.Errorf("subscription = %v", sub)
	}
}
