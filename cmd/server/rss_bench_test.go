package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkServerRSS reports the resident memory (VmRSS, /proc) of one
// bin/server process, in MB, once it has settled (no sample moved by more
// than 1% over two seconds):
//
//   - idle: started with the quickstart config, examples/patchbay.yaml
//     (the embedded store, the demo server over stdio), nothing submitted:
//     rss-MB;
//   - waiting: the same config with an approve policy on the demo
//     server's echo, on a redis-server of its own (in memory only, no
//     limit), before anything is submitted (rss-0-MB) and with 10,000 and
//     100,000 executions waiting for approval (rss-10k-MB, rss-100k-MB),
//     each a one-call document submitted through POST /v1/executions by
//     32 clients and parked (its approval pending, no work item left).
//     Also Redis's used_memory there (redis-…-MB) and the server's growth
//     per waiting execution from rss-0 (server-KB/waiting, at the last
//     count).
//
// The demo server's own process is not counted. PATCHBAY_BENCH_WAITING
// sets the counts (comma-separated, ascending; default 10000,100000).
// Alone (submitting 100,000 takes minutes):
//
//	go test -run '^$' -bench 'ServerRSS' -benchtime 1x -count=1 -timeout 60m ./cmd/server/
func BenchmarkServerRSS(b *testing.B) {
	b.Run("idle", func(b *testing.B) {
		srv := startQuickstart(b, quickstartConfig(b), "")
		b.ReportMetric(settledRSS(b, srv.pid()), "rss-MB")
	})
	b.Run("waiting", func(b *testing.B) {
		rd := startOwnRedis(b, "--appendonly", "no", "--maxmemory", "0")
		cfg := quickstartConfig(b, "  demo:\n    mcp:\n", "  demo:\n    policy: { approve: [\"echo\"] }\n    mcp:\n")
		srv := startQuickstart(b, cfg, rd.url)
		pid := srv.pid()
		c := newPBClient(srv)
		doc := []byte(`{"workflow":{"version":1,"connections":{"demo":{}},
			"root":{"kind":"call","id":"greet","connection":"demo","op":"echo","args":{"text":"hello"}}}}`)
		base := settledRSS(b, pid)
		submitted := 0
		for _, count := range benchInts(b, "PATCHBAY_BENCH_WAITING", "10000,100000") {
			if count <= submitted {
				b.Fatalf("PATCHBAY_BENCH_WAITING: %d after %d: the counts must ascend", count, submitted)
			}
			start := time.Now()
			submitAll(b, c, doc, count-submitted, 32)
			submitted = count
			waitParked(b, rd, submitted)
			b.Logf("%d waiting after %s", submitted, time.Since(start).Round(time.Second))
			rss := settledRSS(b, pid)
			label := strconv.Itoa(count)
			if count%1000 == 0 {
				label = strconv.Itoa(count/1000) + "k"
			}
			b.ReportMetric(rss, "rss-"+label+"-MB")
			b.ReportMetric(redisUsedMB(b, rd), "redis-"+label+"-MB")
			b.ReportMetric((rss-base)*1024/float64(count), "server-KB/waiting")
		}
		b.ReportMetric(base, "rss-0-MB")
	})
}

// submitAll POSTs doc n times (no wait: each answered 202) from clients
// clients at once.
func submitAll(b *testing.B, c *pbClient, doc []byte, n, clients int) {
	warm(b, clients, n, func() (time.Duration, error) { return 0, c.submit(doc) })
}

// waitParked waits until n approvals are pending and no work item is
// left: every execution submitted has run to its approval and parked.
func waitParked(b *testing.B, rd *ownRedis, n int) {
	ctx := context.Background()
	var pending, work int64
	for deadline := time.Now().Add(20 * time.Minute); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		pending, _ = rd.rdb.ZCard(ctx, "pb:approvals:pending").Result()
		work, _ = rd.rdb.XLen(ctx, "pb:work").Result()
		if pending == int64(n) && work == 0 {
			return
		}
	}
	b.Fatalf("after 20 minutes %d approvals pending and %d work items left; want %d and 0", pending, work, n)
}

// settledRSS samples the VmRSS of process pid every 250 ms until the last
// two seconds of samples lie within 1% of each other (or a minute has
// passed) and returns the last, in MB.
func settledRSS(b *testing.B, pid int) float64 {
	var samples []float64
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
		rss, err := procRSS(pid)
		if err != nil {
			b.Fatal(err)
		}
		samples = append(samples, rss)
		if n := len(samples); n >= 9 {
			last := samples[n-9:]
			lo, hi := last[0], last[0]
			for _, v := range last {
				lo, hi = min(lo, v), max(hi, v)
			}
			if hi-lo <= 0.01*hi || time.Now().After(deadline) {
				return rss
			}
		}
	}
}

// procRSS is the VmRSS of process pid in MB.
func procRSS(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// redisUsedMB is the Redis server's used_memory in MB.
func redisUsedMB(b *testing.B, rd *ownRedis) float64 {
	info, err := rd.rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n / (1 << 20)
		}
	}
	b.Fatal("no used_memory in INFO memory")
	return 0
}
