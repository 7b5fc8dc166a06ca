package pools

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/store/storetest"
)

// BenchmarkAcquireRelease has 64 waiters, split over two Pool values (two
// replicas' worth of clients on one Redis), take and give back leases of an
// 8-slot pool b.N times in all. It reports acquires/s and the p99 of the
// time spent in Acquire. It runs on the real Redis when
// PATCHBAY_TEST_REDIS_URL is set, else on miniredis.
func BenchmarkAcquireRelease(b *testing.B) {
	const (
		slots   = 8
		waiters = 64
	)
	s := storetest.New(b)
	a, err := New(s, "bench", slots, nil)
	if err != nil {
		b.Fatal(err)
	}
	c, _ := New(s, "bench", slots, nil)
	ctx := b.Context()
	var (
		left  atomic.Int64
		mu    sync.Mutex
		waits = make([]time.Duration, 0, b.N)
		wg    sync.WaitGroup
	)
	left.Store(int64(b.N))
	b.ResetTimer()
	start := time.Now()
	for w := range waiters {
		p := a
		if w%2 == 1 {
			p = c
		}
		wg.Go(func() {
			holder := fmt.Sprintf("w%d", w)
			var mine []time.Duration
			for left.Add(-1) >= 0 {
				t0 := time.Now()
				l, err := p.Acquire(ctx, holder, time.Minute)
				if err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
				if err := p.Release(ctx, l); err != nil {
					b.Error(err)
					return
				}
			}
			mu.Lock()
			waits = append(waits, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	slices.Sort(waits)
	if len(waits) > 0 {
		b.ReportMetric(float64(len(waits))/el.Seconds(), "acquires/s")
		b.ReportMetric(float64(waits[(len(waits)*99)/100].Microseconds())/1000, "p99-wait-ms")
	}
}
