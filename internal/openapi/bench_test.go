package openapi

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness/connect"
	"github.com/patchbay-dev/patchbay/internal/npmtest"
)

// BenchmarkCallOverhead puts one getPetById call through the provider
// (arguments to a request, the configured headers, the answer read
// bounded and decoded as JSON) beside a plain net/http GET of the same URL
// with the same header (the body read, not decoded), alternating the two
// in one loop so both see the same load. It reports each one's time and
// the ratio, against Prism mocking the Petstore document and against an
// httptest server answering Prism's body, where the server's own time is
// near nothing and the provider's cost shows.
func BenchmarkCallOverhead(b *testing.B) {
	const doc = "testdata/petstore3.yaml"
	prism := npmtest.Prism(b, doc)
	body := fetch(b, prism+"/pet/10")
	local := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	b.Cleanup(local.Close)
	for _, target := range []struct{ name, url string }{{"prism", prism}, {"httptest", local.URL}} {
		b.Run(target.name, func(b *testing.B) {
			headers := map[string]string{"Authorization": "Bearer pst-bench"}
			c, err := New("pets", config.OpenAPI{URL: doc, BaseURL: target.url, Headers: headers}, nil).Connect(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			call := connect.CallRequest{Op: "getPetById", Args: map[string]any{"petId": 10.0}}
			client := &http.Client{}
			var plain, provider time.Duration
			for b.Loop() {
				t0 := time.Now()
				req, _ := http.NewRequest(http.MethodGet, target.url+"/pet/10", nil)
				req.Header.Set("Authorization", headers["Authorization"])
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				t1 := time.Now()
				if _, err := c.Call(context.Background(), call); err != nil {
					b.Fatal(err)
				}
				plain += t1.Sub(t0)
				provider += time.Since(t1)
			}
			n := float64(b.N)
			b.ReportMetric(float64(plain.Microseconds())/n, "plain-µs/call")
			b.ReportMetric(float64(provider.Microseconds())/n, "provider-µs/call")
			b.ReportMetric(float64(provider)/float64(plain), "provider/plain")
		})
	}
}

func fetch(b *testing.B, url string) []byte {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer pst-bench")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("GET %s = %d %s %v", url, resp.StatusCode, data, err)
	}
	return data
}

// BenchmarkGitHubLoad loads GitHub's description (13 MB of JSON, 1,000+
// operations) with include and whole. ns/op is the load time; heap-MB is
// what a loaded connection keeps (live heap after a GC, less before), and
// peak-rss-MB the process's peak resident memory during one load (the
// test binary's own included), both measured on a first load before the
// timed ones.
func BenchmarkGitHubLoad(b *testing.B) {
	dir := npmtest.Require(b, "octokit-openapi", githubOpenAPI)
	path := filepath.Join(dir, "generated", "api.github.com.json")
	// include first: the whole document's load would leave the process's
	// resident memory higher for the smaller one to be measured against.
	for _, tt := range []struct {
		name    string
		include []string
	}{{"include", []string{"issues", "pulls/get"}}, {"all", nil}} {
		b.Run(tt.name, func(b *testing.B) {
			p := New("github", config.OpenAPI{URL: path, Include: config.IncludeNames(tt.include...)}, nil)
			var before, after runtime.MemStats
			debug.FreeOSMemory()
			runtime.ReadMemStats(&before)
			peakReset := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
			c, err := p.Connect(context.Background())
			if err != nil {
				b.Fatal(err)
			}
			peak := vmHWM(b)
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(c)
			ops := len(c.Manifest().Operations)
			for b.Loop() {
				if _, err := p.Connect(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			// After the loop: its first round resets reported metrics.
			b.ReportMetric(float64(ops), "operations")
			b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "heap-MB")
			if peakReset {
				b.ReportMetric(peak, "peak-rss-MB")
			} else {
				b.Log("peak RSS not measured: /proc/self/clear_refs cannot be written")
			}
		})
	}
}

// vmHWM is the process's peak resident set in MiB since it was last reset
// (Linux's VmHWM).
func vmHWM(b *testing.B) float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Logf("no /proc/self/status: %v", err)
		return 0
	}
	lines := bufio.NewScanner(bytes.NewReader(data))
	for lines.Scan() {
		if v, ok := strings.CutPrefix(lines.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}
