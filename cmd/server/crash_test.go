package main

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

const crashSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// replica is one server process of the crash test.
type replica struct {
	bin, addr string
	env       []string
	logPath   string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// newReplicas makes n server processes of bin over one Redis (redisURL,
// prefix) and config cfg, answering the API key key, each on a free
// loopback port with a log of its own, and kills them at cleanup. extra
// env entries come last, so one may override a default (the log level).
// None is started: start the ones the test needs, or startAll.
func newReplicas(t *testing.T, n int, bin, redisURL, prefix, cfg, key string, extra ...string) []*replica {
	t.Helper()
	dir := t.TempDir()
	rs := make([]*replica, n)
	for i := range rs {
		addr := freeAddr(t)
		rs[i] = &replica{bin: bin, addr: addr, logPath: filepath.Join(dir, fmt.Sprintf("replica-%d.log", i)), env: append([]string{
			"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
			"REDIS_URL=" + redisURL, "PATCHBAY_REDIS_PREFIX=" + prefix, "PATCHBAY_CONFIG=" + cfg,
			"PATCHBAY_ADDR=" + addr, "PATCHBAY_API_KEYS=" + key, "PATCHBAY_LOG_LEVEL=warn",
		}, extra...)}
	}
	t.Cleanup(func() {
		for _, r := range rs {
			r.kill()
		}
	})
	return rs
}

// startAll starts every replica in turn.
func startAll(t *testing.T, rs []*replica) {
	t.Helper()
	for _, r := range rs {
		if err := r.start(); err != nil {
			t.Fatal(err)
		}
	}
}

// start runs the server and waits until it is ready. It is called from
// the killer goroutine too, so it reports rather than calls t.Fatal.
func (r *replica) start() error {
	logf, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(r.bin)
	cmd.Env = r.env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
	r.mu.Lock()
	r.cmd, r.exited = cmd, exited
	r.mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + r.addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	out, _ := os.ReadFile(r.logPath)
	return fmt.Errorf("replica on %s not ready:\n%s", r.addr, out)
}

// kill sends SIGKILL (no shutdown, no acknowledgements, nothing flushed)
// and waits for the process to be gone, so its port is free.
func (r *replica) kill() {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// oneReplica starts one server process with cfg on st's Redis (a real
// one, which outlives the process) and a 2 s claim timeout, so a run it
// was killed in is taken over soon after it restarts; env adds to its
// environment.
func oneReplica(t *testing.T, st *store.Store, cfg string, env ...string) *replica {
	t.Helper()
	addr := freeAddr(t)
	srv := &replica{bin: serverBin, addr: addr, logPath: filepath.Join(t.TempDir(), "server.log"), env: append([]string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
		"REDIS_URL=" + storetest.URL(t), "PATCHBAY_REDIS_PREFIX=" + st.Prefix, "PATCHBAY_CONFIG=" + cfg,
		"PATCHBAY_ADDR=" + addr, "PATCHBAY_API_KEYS=k1", "PATCHBAY_LOG_LEVEL=warn", "PATCHBAY_CLAIM_TIMEOUT=2s",
	}, env...)}
	if err := srv.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.kill)
	return srv
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestCrashExactlyOnce: two server processes on one Redis take 500 signed
// webhooks spread over both while replicas are killed with SIGKILL (and
// restarted) ten times; the sender retries like a real one. Every event
// must end with exactly one execution, counted by message id; every
// execution must be listed by GET /v1/executions and none left queued
// without a work item. Takeover latency at the default claim timeout is
// reported.
func TestCrashExactlyOnce(t *testing.T) {
	if storetest.URL(t) == "" {
		t.Skip("needs a real Redis (" + storetest.EnvURL + ") shared by two processes")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	st := storetest.New(t)
	bin := serverBin // built by TestMain
	const events = 500
	cfg := writeConfig(t, fmt.Sprintf(`
connections:
  demo: { mcp: { command: %q } }
  jobs:
    source: { events: { job.done: { type: object } } }
    webhooks: { secrets: [%q] }
triggers:
  - id: done
    connection: jobs
    event: job.done
    input: { text: { $expr: "event.id" } }
    workflow:
      version: 1
      connections: { demo: {} }
      root: { kind: call, id: say, connection: demo, op: echo, args: { text: { $expr: "$input.text" } } }
inbox: { reclaimAfter: 2s, maxDeliveries: 50 }
apiKeys:
  - { name: reader, key: crash-reader-key, allowlist: none, roles: [read] } # lists the triggers' executions
`, demoBin, crashSecret))
	// The default claim timeout: its takeover latency is reported.
	replicas := newReplicas(t, 2, bin, storetest.URL(t), st.Prefix, cfg, "crash-key", "PATCHBAY_WORKERS=4")
	startAll(t, replicas)

	wh, err := standardwebhooks.NewWebhook(crashSecret)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second}
	var accepted, duplicates, retries atomic.Int64
	send := func(i int) {
		id := fmt.Sprintf("msg-%d", i)
		body := []byte(fmt.Sprintf(`{"type":"job.done","id":"evt-%d","payload":{"n":%d}}`, i, i))
		for attempt := 0; ; attempt++ {
			now := time.Now()
			sig, _ := wh.Sign(id, now, body)
			r := replicas[(i+attempt)%2]
			req, _ := http.NewRequest("POST", "http://"+r.addr+"/hooks/jobs", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("webhook-id", id)
			req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
			req.Header.Set("webhook-signature", sig)
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
				switch resp.StatusCode {
				case 204:
					accepted.Add(1)
					return
				case 200:
					duplicates.Add(1)
					return
				}
				if resp.StatusCode < 500 {
					t.Errorf("event %d: answer %d", i, resp.StatusCode)
					return
				}
			}
			retries.Add(1)
			time.Sleep(50 * time.Millisecond)
		}
	}

	start := time.Now()
	var senders sync.WaitGroup
	next := make(chan int)
	for range 8 {
		senders.Go(func() {
			for i := range next {
				send(i)
			}
		})
	}
	killerDone := make(chan struct{})
	kills := 0
	go func() {
		defer close(killerDone)
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
		for kills < 10 {
			time.Sleep(time.Duration(300+rng.IntN(500)) * time.Millisecond)
			r := replicas[rng.IntN(2)]
			r.kill()
			kills++
			if err := r.start(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := range events {
		next <- i
		time.Sleep(20 * time.Millisecond) // ~50 events/s: the kills land during the run
	}
	close(next)
	senders.Wait()
	<-killerDone
	sent := time.Since(start)
	if got := accepted.Load() + duplicates.Load(); got != events {
		t.Fatalf("the sender saw %d of %d events accepted", got, events)
	}

	// Every event gets exactly one execution, whichever replica ingested
	// it and whichever delivered it.
	ctx := context.Background()
	var recs []execRecord
	deadline := time.Now().Add(45 * time.Second)
	for {
		recs = scanRecords(t, ctx, st.Client, st.Prefix)
		if len(recs) >= events || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	byEvent := map[string]string{}
	terminal := 0
	for _, r := range recs {
		if prev, dup := byEvent[r.Input.Event.ID]; dup {
			t.Errorf("event %s has two executions: %s and %s", r.Input.Event.ID, prev, r.ID)
		}
		byEvent[r.Input.Event.ID] = r.ID
		if r.Status == "succeeded" || r.Status == "failed" {
			terminal++
		}
	}
	// Counted by message id: each names the one execution of its event.
	for i := range events {
		ev := fmt.Sprintf("evt-%d", i)
		id, err := st.Client.Get(ctx, st.Key("msg", "jobs:done:"+ev)).Result()
		if err != nil {
			t.Errorf("message jobs:done:%s: %v", ev, err)
		} else if byEvent[ev] != id {
			t.Errorf("message jobs:done:%s names %s, the execution of the event is %q", ev, id, byEvent[ev])
		}
	}
	if len(recs) != events {
		t.Errorf("%d executions for %d events", len(recs), events)
	}
	records := len(recs)
	// Completion depends on the execution workers' own recovery; it is
	// reported, not required, here.
	var open []string
	for wait := time.Now().Add(20 * time.Second); terminal < records && time.Now().Before(wait); {
		time.Sleep(250 * time.Millisecond)
		terminal, open = 0, nil
		for _, r := range scanRecords(t, ctx, st.Client, st.Prefix) {
			if r.Status == "succeeded" || r.Status == "failed" {
				terminal++
			} else {
				open = append(open, r.ID+" "+r.Status+" ("+r.Input.Event.ID+")")
			}
		}
	}
	if len(open) > 0 {
		t.Logf("not finished after 20 s: %s", strings.Join(open, ", "))
	}
	unlisted, orphaned := checkListedAndQueued(t, ctx, st.Client, st.Prefix, replicas[0].addr, "crash-reader-key")
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	lat := takeoverLatencies(t, ctx, st.Client, st.Prefix, ids)
	med, worst := medianMax(lat)
	t.Logf("takeover latency at the default claim timeout (%s): median %s, max %s over %d takeovers; %d unlisted, %d queued without a work item",
		config.DefaultClaimTimeout, med, worst, len(lat), unlisted, orphaned)
	t.Logf("%d events over %s with %d kills: %d accepted, %d duplicate answers, %d sender retries; %d executions, %d terminal after %s",
		events, sent.Round(time.Millisecond), kills, accepted.Load(), duplicates.Load(), retries.Load(), records, terminal, time.Since(start).Round(time.Millisecond))
}

type execRecord struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Input  struct {
		Event struct {
			ID string `json:"id"`
		} `json:"connection_event"`
	} `json:"input"`
}

// scanRecords reads every execution record under prefix that a webhook
// event of the test started.
func scanRecords(t *testing.T, ctx context.Context, c redis.UniversalClient, prefix string) []execRecord {
	t.Helper()
	return records(t, ctx, c, prefix, func(r execRecord) bool { return strings.HasPrefix(r.Input.Event.ID, "evt-") })
}
