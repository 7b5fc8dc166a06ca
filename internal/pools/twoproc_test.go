package pools

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// Environment of the benchmark's second process.
const (
	childEnv  = "PATCHBAY_POOL_BENCH_CHILD" // "<prefix> <ops> <waiters>"
	benchPool = "bench2"
)

// waitersRun runs waiters goroutines that take and give back leases of the
// 8-slot pool until ops acquires were made in all, and returns how long
// each Acquire waited.
func waitersRun(ctx context.Context, p *Pool, name string, ops, waiters int) ([]time.Duration, error) {
	var (
		left  atomic.Int64
		mu    sync.Mutex
		waits = make([]time.Duration, 0, ops)
		first error
		wg    sync.WaitGroup
	)
	left.Store(int64(ops))
	for w := range waiters {
		wg.Go(func() {
			holder := fmt.Sprintf("%s-w%d", name, w)
			var mine []time.Duration
			var err error
			for left.Add(-1) >= 0 {
				t0 := time.Now()
				var l *Lease
				if l, err = p.Acquire(ctx, holder, time.Minute); err != nil {
					break
				}
				mine = append(mine, time.Since(t0))
				if err = p.Release(ctx, l); err != nil {
					break
				}
			}
			mu.Lock()
			waits = append(waits, mine...)
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	return waits, first
}

// TestBenchChild is the second process of BenchmarkAcquireReleaseTwoProcesses;
// it does nothing unless started by it. It prints "ready", waits for a
// line on stdin, runs its waiters and prints their waits as JSON.
func TestBenchChild(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return // only does something as the benchmark's second process
	}
	var prefix string
	var ops, waiters int
	if _, err := fmt.Sscan(spec, &prefix, &ops, &waiters); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := store.Open(ctx, os.Getenv(storetest.EnvURL), prefix, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := New(st, benchPool, 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	waits, err := waitersRun(ctx, p, "child", ops, waiters)
	if err != nil {
		t.Fatal(err)
	}
	ns := make([]int64, len(waits))
	for i, w := range waits {
		ns[i] = int64(w)
	}
	out, _ := json.Marshal(ns)
	fmt.Println("waits " + string(out))
}

// BenchmarkAcquireReleaseTwoProcesses is BenchmarkAcquireRelease across
// two processes on one real Redis: 64 waiters, 32 in this process and 32
// in a child process, share an 8-slot pool and make b.N acquires (and
// releases) in all. It reports acquires/s and the p99 wait over both.
func BenchmarkAcquireReleaseTwoProcesses(b *testing.B) {
	if storetest.URL(b) == "" {
		b.Skip("needs a real Redis (" + storetest.EnvURL + ") shared by two processes")
	}
	const waiters = 64
	st := storetest.New(b)
	p, err := New(st, benchPool, 8, nil)
	if err != nil {
		b.Fatal(err)
	}
	half := b.N / 2
	child := exec.Command(os.Args[0], "-test.run=^TestBenchChild$", "-test.v=false")
	child.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d", childEnv, st.Prefix, half, waiters/2))
	stdin, _ := child.StdinPipe()
	stdout, _ := child.StdoutPipe()
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	lines.Buffer(make([]byte, 1<<20), 64<<20)
	if !lines.Scan() || lines.Text() != "ready" {
		b.Fatalf("child did not start: %q", lines.Text())
	}
	b.ResetTimer()
	start := time.Now()
	fmt.Fprintln(stdin, "go")
	mine, err := waitersRun(b.Context(), p, "parent", b.N-half, waiters/2)
	if err != nil {
		b.Fatal(err)
	}
	var theirs []int64
	for lines.Scan() {
		if raw, ok := strings.CutPrefix(lines.Text(), "waits "); ok {
			if err := json.Unmarshal([]byte(raw), &theirs); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := child.Wait(); err != nil {
		b.Fatalf("child: %v", err)
	}
	el := time.Since(start)
	b.StopTimer()
	all := slices.Clone(mine)
	for _, ns := range theirs {
		all = append(all, time.Duration(ns))
	}
	if len(all) != b.N {
		b.Fatalf("%d acquires recorded, want %d", len(all), b.N)
	}
	slices.Sort(all)
	b.ReportMetric(float64(len(all))/el.Seconds(), "acquires/s")
	b.ReportMetric(float64(all[(len(all)*99)/100].Microseconds())/1000, "p99-wait-ms")
	b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-wait-ms")
}
