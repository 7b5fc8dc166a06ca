package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// BenchmarkExecutions measures executions per second of a three-call
// workflow through the HTTP API (POST with wait), with one and with two
// server processes on one real Redis and 64 clients spread over them. The
// MCP server is in this process, over Streamable HTTP.
//
// PATCHBAY_WORKERS is 16 per process: each idle worker holds a Redis pool
// connection in a blocking XREADGROUP, and with more workers than the pool
// has connections (20 on two cores) the steps wait seconds for one.
//
// Besides exec/s it reports the p50 and p99 of a POST (submit, run, and
// answer), and per execution the Redis commands the servers sent and the
// Redis connections they opened, from the server's INFO totals before and
// after (commands run inside scripts included). Those totals are the
// server's: on a Redis that others use at the same time they include
// their commands too, so measure on a quiet one.
func BenchmarkExecutions(b *testing.B) {
	url := storetest.URL(b)
	if url == "" {
		b.Skip("needs a real Redis (" + storetest.EnvURL + ")")
	}
	_, mcpSrv := newCounter()
	b.Cleanup(mcpSrv.Close)
	cfg := writeConfig(b, fmt.Sprintf(`
connections:
  counter: { mcp: { type: http, url: %q } }
allowlists:
  default: { connections: { counter: { ops: ["*"] } } }
`, mcpSrv.URL+"/mcp"))
	body := []byte(`{"wait":"30s","workflow":{"version":1,"connections":{"counter":{}},"root":{"kind":"sequence","id":"m","steps":[
		{"effect":{"step":"one"}},{"effect":{"step":"two"}},{"effect":{"step":"three"}}]}}}`)
	// Keep-alive connections for every client: the default transport keeps
	// two per host, and the rest would reconnect on every request.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	for _, procs := range []int{1, 2} {
		b.Run(fmt.Sprintf("processes=%d", procs), func(b *testing.B) {
			prefix := storetest.Prefix()
			rdb := benchClient(b, url)
			b.Cleanup(func() { cleanPrefix(rdb, prefix) })
			dir := b.TempDir()
			addrs := make([]string, procs)
			for i := range procs {
				addrs[i] = freeAddr(b)
				r := &replica{bin: serverBin, addr: addrs[i], logPath: filepath.Join(dir, fmt.Sprintf("r%d.log", i)), env: []string{
					"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
					"REDIS_URL=" + url, "PATCHBAY_REDIS_PREFIX=" + prefix, "PATCHBAY_CONFIG=" + cfg,
					"PATCHBAY_ADDR=" + addrs[i], "PATCHBAY_API_KEYS=bench-key", "PATCHBAY_LOG_LEVEL=warn", "PATCHBAY_WORKERS=16",
				}}
				if err := r.start(); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(r.kill)
			}
			post := func(addr string) (time.Duration, error) {
				req, _ := http.NewRequest("POST", "http://"+addr+"/v1/executions", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer bench-key")
				req.Header.Set("Content-Type", "application/json")
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					return 0, err
				}
				defer resp.Body.Close()
				var ex map[string]any
				_ = json.NewDecoder(resp.Body).Decode(&ex)
				if resp.StatusCode != http.StatusOK || ex["status"] != "succeeded" {
					return 0, fmt.Errorf("status %d: %v", resp.StatusCode, ex)
				}
				return time.Since(start), nil
			}
			// Warm up: connections to Redis, to the MCP server and from
			// the clients are opened before the counting starts.
			for i := range 64 {
				if _, err := post(addrs[i%len(addrs)]); err != nil {
					log, _ := os.ReadFile(filepath.Join(dir, "r0.log"))
					b.Fatalf("%v\n%s", err, log)
				}
			}
			before := redisCounts(b, rdb)
			var next atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			b.SetParallelism(32) // 64 clients on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				for pb.Next() {
					d, err := post(addrs[int(next.Add(1))%len(addrs)])
					if err != nil {
						b.Error(err)
						return
					}
					mine = append(mine, d)
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			after := redisCounts(b, rdb)
			n := float64(b.N)
			b.ReportMetric(n/b.Elapsed().Seconds(), "exec/s")
			// INFO itself is one command, and the counting client's
			// own connection was opened before.
			b.ReportMetric(float64(after.commands-before.commands-1)/n, "cmds/exec")
			b.ReportMetric(float64(after.connections-before.connections)/n, "conns/exec")
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			}
		})
	}
}

func benchClient(b *testing.B, url string) *redis.Client {
	opt, err := redis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	opt.PoolSize = 1
	rdb := redis.NewClient(opt)
	b.Cleanup(func() { rdb.Close() })
	return rdb
}

func cleanPrefix(rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}

type counts struct{ commands, connections int64 }

// redisCounts reads the server's totals of commands processed (summed over
// INFO commandstats) and connections received.
func redisCounts(b *testing.B, rdb *redis.Client) counts {
	info, err := rdb.Info(context.Background(), "commandstats", "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var c counts
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
			c.connections, _ = strconv.ParseInt(v, 10, 64)
		}
		if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
			_, stats, _ := strings.Cut(rest, ":")
			calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
			n, _ := strconv.ParseInt(calls, 10, 64)
			c.commands += n
		}
	}
	return c
}
