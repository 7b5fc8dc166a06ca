package triggers_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/store"
	"github.com/patchbay-dev/patchbay/internal/store/storetest"
	"github.com/patchbay-dev/patchbay/internal/triggers"
)

// clock is a settable clock shared by replicas.
type clock struct{ ns atomic.Int64 }

func (c *clock) set(t time.Time) { c.ns.Store(t.UnixNano()) }
func (c *clock) now(context.Context) (time.Time, error) {
	return time.Unix(0, c.ns.Load()).UTC(), nil
}

func cronFile(schedule, tz, catchUp string, max int) *config.File {
	return &config.File{
		Connections: map[string]config.Connection{
			"morning": {Cron: &config.Cron{Schedule: schedule, Timezone: tz, CatchUp: catchUp, MaxCatchUp: max}},
		},
		Triggers: []config.Trigger{{
			ID: "daily", Connection: "morning", Event: "tick",
			Input:    map[string]any{"text": map[string]any{"$expr": "event.payload.scheduledAt"}},
			Document: json.RawMessage(echoWorkflow),
		}},
	}
}

// TestCronDowntimeTwoReplicas: an hour with no replica running on
// */15 * * * *, then two replicas wake at once: four ticks, each once.
func TestCronDowntimeTwoReplicas(t *testing.T) {
	t.Parallel()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		t.Parallel()
		clk := &clock{}
		t0 := time.Date(2026, 1, 5, 10, 0, 0, 0, time.UTC)
		clk.set(t0)
		f := cronFile("*/15 * * * *", "", "", 0)
		a := setup(t, st, f, clk.now)
		b := setup(t, st, f, clk.now)
		ctx := context.Background()
		// The first pass ever sets the watermark at now and fires nothing.
		if fired, err := a.svc.CronTick(ctx, "morning"); err != nil || len(fired) != 0 {
			t.Fatalf("first pass: %v, %v", fired, err)
		}
		clk.set(t0.Add(time.Hour + 30*time.Second))
		var mu sync.Mutex
		var all []time.Time
		var wg sync.WaitGroup
		for _, r := range []*bundle{a, b, a, b} {
			wg.Go(func() {
				fired, err := r.svc.CronTick(ctx, "morning")
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				all = append(all, fired...)
				mu.Unlock()
			})
		}
		wg.Wait()
		if len(all) != 4 {
			t.Fatalf("fired %v, want the 4 slots 10:15 to 11:00 once each", all)
		}
		seen := map[time.Time]bool{}
		for _, s := range all {
			if seen[s] || s.Before(t0.Add(15*time.Minute)) || s.After(t0.Add(time.Hour)) {
				t.Errorf("slot %v repeated or out of range", s)
			}
			seen[s] = true
		}
		// Delivered as four turns, started by either replica.
		for _, r := range []*bundle{a, b} {
			if err := r.svc.Start(ctx); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, "four turns", func() bool { return trigger(status(t, a), "daily").Counts.Succeeded == 4 })
		exs := allExecutions(t, a.execs)
		ids := map[string]int{}
		for _, ex := range exs {
			ids[eventID(ex)]++
		}
		if len(exs) != 4 || len(ids) != 4 {
			t.Errorf("executions %d for events %v, want 4 distinct", len(exs), ids)
		}
		if _, ok := ids["tick-2026-01-05T10:15:00Z"]; !ok {
			t.Errorf("event ids = %v", ids)
		}
		s := status(t, a)
		if w := s.Inboxes[0].Watermark; w == nil || !w.Equal(t0.Add(time.Hour)) {
			t.Errorf("watermark = %v", w)
		}
		// Nothing new until the next slot.
		if fired, _ := b.svc.CronTick(ctx, "morning"); len(fired) != 0 {
			t.Errorf("repeat pass fired %v", fired)
		}
	})
}

func TestCronCatchUpPolicies(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		policy string
		max    int
		want   int
	}{
		{"", 0, 24}, {"all", 5, 5}, {"latest", 0, 1}, {"none", 0, 0},
	} {
		t.Run(tt.policy+"/"+string(rune('0'+tt.max)), func(t *testing.T) {
			t.Parallel()
			clk := &clock{}
			clk.set(t0)
			b := setup(t, storetest.NewEmbedded(t), cronFile("0 * * * *", "Europe/Paris", tt.policy, tt.max), clk.now)
			ctx := context.Background()
			if _, err := b.svc.CronTick(ctx, "morning"); err != nil {
				t.Fatal(err)
			}
			clk.set(t0.Add(24*time.Hour + 2*time.Minute)) // the latest slot is 2 min late: missed
			fired, err := b.svc.CronTick(ctx, "morning")
			if err != nil || len(fired) != tt.want {
				t.Fatalf("fired %d (%v), want %d", len(fired), err, tt.want)
			}
			if tt.want > 0 && !fired[len(fired)-1].Equal(t0.Add(24*time.Hour)) {
				t.Errorf("last fired %v, want the latest slot", fired[len(fired)-1])
			}
			// A slot fired on time fires under every policy.
			clk.set(t0.Add(25*time.Hour + time.Second))
			if fired, _ := b.svc.CronTick(ctx, "morning"); len(fired) != 1 {
				t.Errorf("on-time slot: fired %v", fired)
			}
		})
	}
}

func TestCronDST(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tt := range []struct {
		name, schedule string
		from, to       string
		want           []string // UTC instants
	}{
		{
			name: "spring gap slot fires once when the clocks jump", schedule: "30 2 * * *",
			from: "2026-03-07T12:00:00Z", to: "2026-03-09T12:00:00Z",
			want: []string{"2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"},
		},
		{
			name: "spring gap slots collapse into one tick", schedule: "*/15 * * * *",
			from: "2026-03-08T06:30:00Z", to: "2026-03-08T07:20:00Z",
			// 01:45 EST, then 02:00–02:45 and 03:00 EDT all at 07:00Z, then 03:15 EDT.
			want: []string{"2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z"},
		},
		{
			name: "repeated autumn slot fires once", schedule: "30 1 * * *",
			from: "2026-10-31T12:00:00Z", to: "2026-11-02T12:00:00Z",
			want: []string{"2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"},
		},
		{
			name: "repeated autumn hour fires its slots once", schedule: "*/30 * * * *",
			from: "2026-11-01T04:45:00Z", to: "2026-11-01T07:45:00Z",
			// 01:00, 01:30 EDT; the repeated 01:00–01:59 EST nothing; 02:00, 02:30 EST.
			want: []string{"2026-11-01T05:00:00Z", "2026-11-01T05:30:00Z", "2026-11-01T07:00:00Z", "2026-11-01T07:30:00Z"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := triggers.CronSlots(tt.schedule, ny, at(tt.from), at(tt.to))
			if len(got) != len(tt.want) {
				t.Fatalf("slots = %v, want %v", got, tt.want)
			}
			for i := range got {
				if !got[i].Equal(at(tt.want[i])) {
					t.Errorf("slot %d = %v, want %s", i, got[i].UTC(), tt.want[i])
				}
			}
		})
	}
}
