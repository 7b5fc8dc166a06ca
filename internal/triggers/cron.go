package triggers

import (
	"context"
	"fmt"
	"strconv"
	"time"
	_ "time/tzdata" // zones for images without /usr/share/zoneinfo

	"github.com/robfig/cron/v3"

	"github.com/patchbay-dev/patchbay/internal/config"
	"github.com/patchbay-dev/patchbay/internal/harness"
)

// nonePolicyGrace is how late a slot may fire under catch-up none: a slot
// older than this when seen is counted as missed and skipped.
const nonePolicyGrace = time.Minute

// cronSource is one cron connection.
type cronSource struct {
	name     string
	schedule string
	spec     *cron.SpecSchedule // evaluated on civil times written as UTC
	loc      *time.Location
	catchUp  string
	max      int
}

func newCronSource(name string, c config.Cron) (*cronSource, error) {
	spec, err := config.ParseSchedule(c.Schedule)
	if err != nil {
		return nil, fmt.Errorf("cron schedule: %w", err)
	}
	cp := *spec
	cp.Location = time.UTC
	cs := &cronSource{name: name, schedule: c.Schedule, spec: &cp, loc: c.Location(), catchUp: c.CatchUp, max: c.MaxCatchUp}
	if cs.catchUp == "" {
		cs.catchUp = "all"
	}
	if cs.max <= 0 {
		cs.max = config.DefaultMaxCatchUp
	}
	return cs, nil
}

// civil is t's wall-clock time in loc, written as a UTC time so that
// arithmetic on it ignores daylight saving.
func civil(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
}

// resolve maps a civil time to the instant it names in loc. A civil time
// that happens twice (the repeated autumn hour) is its first occurrence; one
// that never happens (the spring-forward gap) is the moment the clocks
// jump.
func resolve(c time.Time, loc *time.Location) time.Time {
	u := c.Unix()
	var best time.Time
	var cands []time.Time
	for _, probe := range []int64{u - 86400, u + 86400} {
		_, off := time.Unix(probe, 0).In(loc).Zone()
		at := time.Unix(u-int64(off), int64(c.Nanosecond())).In(loc)
		cands = append(cands, at)
		if civil(at, loc).Equal(c) && (best.IsZero() || at.Before(best)) {
			best = at
		}
	}
	if !best.IsZero() {
		return best
	}
	later := cands[0]
	if cands[1].After(later) {
		later = cands[1]
	}
	start, _ := later.ZoneBounds()
	return start
}

// next is the first slot strictly after t, or the zero time when the
// schedule has none within five years.
func (c *cronSource) next(t time.Time) time.Time {
	n := civil(t, c.loc)
	for range 100_000 {
		n = c.spec.Next(n)
		if n.IsZero() {
			return time.Time{}
		}
		if at := resolve(n, c.loc); at.After(t) {
			return at
		}
	}
	return time.Time{}
}

// due returns the slots in (from, to] that the catch-up policy fires,
// oldest first, and the last slot in that range (zero when none).
func (c *cronSource) due(from, to time.Time) (fire []time.Time, last time.Time) {
	var all []time.Time
	for at := c.next(from); !at.IsZero() && !at.After(to); at = c.next(at) {
		all = append(all, at)
		if len(all) > 2*c.max {
			all = all[len(all)-c.max:] // keep memory bounded over a long downtime
		}
		last = at
	}
	switch c.catchUp {
	case "latest":
		if len(all) > 0 {
			fire = all[len(all)-1:]
		}
	case "none":
		for _, at := range all {
			if to.Sub(at) <= nonePolicyGrace {
				fire = append(fire, at)
			}
		}
	default:
		fire = all
		if len(fire) > c.max {
			fire = fire[len(fire)-c.max:]
		}
	}
	return fire, last
}

// tickEvent is the event of one slot.
func (c *cronSource) tickEvent(slot, now time.Time) Event {
	return Event{
		Type: config.CronEventTick,
		ID:   "tick-" + slot.UTC().Format(time.RFC3339),
		Payload: map[string]any{
			"scheduledAt": slot.In(c.loc).Format(time.RFC3339),
			"schedule":    c.schedule,
			"timezone":    c.loc.String(),
		},
		ReceivedAt: now.UTC(),
	}
}

// CronTick runs one pass of the named cron connection at the clock's now:
// it fires the due slots after the watermark and advances it. Every
// replica may run it at the same time; each slot fires once. It returns
// the slots this call fired.
func (s *Service) CronTick(ctx context.Context, name string) ([]time.Time, error) {
	c, ok := s.crons[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q is not a cron connection", ErrUnknownSource, name)
	}
	_, fired, err := s.cronPass(ctx, c)
	return fired, err
}

func (s *Service) cronPass(ctx context.Context, c *cronSource) (now time.Time, fired []time.Time, err error) {
	now, err = s.now(ctx)
	if err != nil {
		return now, nil, fmt.Errorf("cron %s: clock: %w", c.name, err)
	}
	in := s.sources[c.name].inbox
	// The first run ever starts from now: a new schedule does not catch
	// up on slots from before it existed.
	wm, err := in.initCursor(ctx, now.UnixMilli())
	if err != nil {
		return now, nil, err
	}
	fire, last := c.due(time.UnixMilli(wm), now)
	for _, slot := range fire {
		res, err := s.Emit(ctx, c.name, c.tickEvent(slot, now), Via{Kind: "cron", cursor: strconv.FormatInt(slot.UnixMilli(), 10)})
		if err != nil {
			return now, fired, err
		}
		if !res.Duplicate {
			fired = append(fired, slot)
		}
	}
	if !last.IsZero() {
		if err := in.advance(ctx, last.UnixMilli()); err != nil {
			return now, fired, err
		}
	}
	return now, fired, nil
}

// runCron fires c's slots until ctx ends, waking at each slot (and at
// least once a minute, so a changed clock is noticed).
func (s *Service) runCron(ctx context.Context, c *cronSource) {
	for ctx.Err() == nil {
		now, fired, err := s.cronPass(ctx, c)
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Error("cron pass failed", "connection", c.name, "err", err)
			}
			harness.Sleep(ctx, 5*time.Second)
			continue
		}
		if len(fired) > 0 {
			s.logger.Info("cron fired", "connection", c.name, "slots", len(fired), "last", fired[len(fired)-1])
		}
		wait := time.Minute
		if next := c.next(now); !next.IsZero() {
			wait = min(wait, next.Sub(now)+5*time.Millisecond)
		}
		harness.Sleep(ctx, max(wait, 10*time.Millisecond))
	}
}

// CronSlots lists the slots of schedule in loc within (from, to], as a
// cron connection fires them (see the package doc for daylight saving);
// nil for a schedule that does not parse. Operators and tests use it to
// see what a schedule will do.
func CronSlots(schedule string, loc *time.Location, from, to time.Time) []time.Time {
	spec, err := config.ParseSchedule(schedule)
	if err != nil {
		return nil
	}
	cp := *spec
	cp.Location = time.UTC
	c := &cronSource{spec: &cp, loc: loc}
	var out []time.Time
	for at := c.next(from); !at.IsZero() && !at.After(to) && len(out) < 100_000; at = c.next(at) {
		out = append(out, at)
	}
	return out
}
