package api_test

import (
	"bytes"
	"net/http"
	"testing"
)

// BenchmarkThreeCallExecution runs the three-call workflow end to end
// through the HTTP API (POST with wait) on miniredis, from 8 concurrent
// clients, and reports executions per second.
func BenchmarkThreeCallExecution(b *testing.B) {
	bb := setup(b)
	body := []byte(`{"workflow":` + hello + `,"input":{"x":1},"wait":"10s"}`)
	b.SetParallelism(4)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("POST", bb.url+"/v1/executions", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "exec/s")
}
