package overload

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/floodgate-go/floodgate/overload/internal/law"
)

// openAfter is how long the controller sheds nothing before it is Open
// again: long enough that the lulls of a sustained overload do not show as
// changes of state, short enough that a dashboard sees the end of one.
const openAfter = time.Second

// event is what to log and report after the lock is released.
type event struct {
	snap         Snapshot
	state, limit bool
}

// startSheddingLocked returns the event of entering Shedding, or none when
// the controller is shedding already.
func (c *Controller) startSheddingLocked(now time.Time) event {
	if c.state == Shedding {
		return event{}
	}
	c.state, c.since = Shedding, now
	return event{state: true, snap: c.snapshotLocked()}
}

// stepLocked feeds the law the calls completed since the latest step.
func (c *Controller) stepLocked(now time.Time) event {
	if g := c.o.guard; g != nil {
		c.cpu, c.sched = g.Reading()
	}
	c.sweepLocked(now)
	prev := c.st.Slots()
	c.st = law.Step(c.st, law.Sample{N: c.n, Sum: c.sum, Bound: c.bound}, c.bounds(), now)
	c.wait = 0
	if c.waitN > 0 {
		c.wait = c.waitSum / time.Duration(c.waitN)
	}
	c.n, c.sum, c.bound, c.waitSum, c.waitN = 0, 0, false, 0, 0
	var ev event
	if c.state == Shedding && now.Sub(c.lastShed) >= openAfter {
		c.state, c.since = Open, now
		ev.state = true
	}
	ev.limit = c.st.Slots() != prev
	if ev.state || ev.limit {
		ev.snap = c.snapshotLocked()
	}
	return ev
}

// emit logs an event and reports it, outside the lock.
func (c *Controller) emit(ev event) {
	if !ev.state && !ev.limit {
		return
	}
	if l := c.o.logger; l != nil {
		s := ev.snap
		attrs := []slog.Attr{
			slog.Float64("limit", round(s.Limit, 1)),
			slog.Int("inflight", s.Inflight),
			slog.Int("queued", s.Queued),
			slog.Int("queue_cap", s.QueueCap),
			slog.Int("inside", s.Inside),
			slog.Duration("wait", s.Wait),
			slog.Duration("target", s.Target),
			slog.Duration("latency", s.Latency),
			slog.Duration("baseline", s.Baseline),
			slog.Float64("throughput", round(s.Throughput, 0)),
		}
		if c.o.guard != nil {
			attrs = append(attrs, slog.Float64("cpu", round(s.CPU, 3)), slog.Duration("sched_p99", s.SchedP99))
		}
		ctx := context.Background()
		switch {
		case ev.state && s.State == Shedding:
			l.LogAttrs(ctx, slog.LevelWarn, "overload: shedding: every slot is taken and the queue is full", attrs...)
		case ev.state:
			l.LogAttrs(ctx, slog.LevelInfo, "overload: open: nothing shed for a second", attrs...)
		}
		if ev.limit {
			l.LogAttrs(ctx, slog.LevelDebug, "overload: limit changed", attrs...)
		}
	}
	if c.o.onChange != nil {
		c.o.onChange(ev.snap)
	}
}

// round returns x rounded to digits decimals, for a log line.
func round(x float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(x*p) / p
}
