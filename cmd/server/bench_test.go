package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// BenchmarkExecutions measures executions per second of a three-call
// workflow through the HTTP API (POST with wait) with one and with two
// server processes on one real Redis, 16 clients spread over them. The
// MCP server is in this process, over Streamable HTTP.
func BenchmarkExecutions(b *testing.B) {
	if storetest.URL(b) == "" {
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
	for _, procs := range []int{1, 2} {
		b.Run(fmt.Sprintf("processes=%d", procs), func(b *testing.B) {
			st := storetest.New(b)
			dir := b.TempDir()
			addrs := make([]string, procs)
			for i := range procs {
				addrs[i] = freeAddr(b)
				r := &replica{bin: serverBin, addr: addrs[i], logPath: filepath.Join(dir, fmt.Sprintf("r%d.log", i)), env: []string{
					"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"),
					"REDIS_URL=" + storetest.URL(b), "PATCHBAY_REDIS_PREFIX=" + st.Prefix, "PATCHBAY_CONFIG=" + cfg,
					"PATCHBAY_ADDR=" + addrs[i], "PATCHBAY_API_KEYS=bench-key", "PATCHBAY_LOG_LEVEL=warn", "PATCHBAY_WORKERS=8",
				}}
				if err := r.start(); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(r.kill)
			}
			var next atomic.Int64
			b.SetParallelism(8) // 16 clients on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					addr := addrs[int(next.Add(1))%len(addrs)]
					status, ex := post2(addr, "bench-key", body)
					if status != http.StatusOK || ex["status"] != "succeeded" {
						b.Errorf("status %d: %v", status, ex)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "exec/s")
		})
	}
}
