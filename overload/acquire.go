package overload

import (
	"context"
	"log/slog"
	"runtime"
	"time"

	"github.com/floodgate-go/floodgate/overload/internal/law"
)

// Acquire admits a call of flow f, waiting for a slot if every one is
// taken, or sheds it. It returns a Permit whose Done must be called when
// the call ends, or a *[ShedError], or ctx's error when ctx ends while the
// call waits. A call waits at most twice the queue target, and is shed at
// once when ctx's deadline leaves less than its expected wait plus the
// service time of a call that does not queue (the baseline).
func (c *Controller) Acquire(ctx context.Context, f Flow) (Permit, error) {
	now := c.o.now()
	inside := c.claim(ctx)
	if inside == nil && ctx.Err() == nil && c.untapped.Add(1) == 1 {
		c.warnUntapped()
	}
	c.mu.Lock()
	fl := c.flowLocked(f, now)
	if inside == nil {
		c.offered.add(now, 1) // Enter did not count it
		fl.offered.add(now, 1)
	}
	if inside != nil && inside.owed > 0 {
		// A call of a flow under its share took this call's place as it
		// entered: this one goes instead.
		inside.owed--
		c.owed--
		c.arriveLocked(inside)
		return Permit{}, c.shedAndUnlock(fl, inside, ShedDisplaced, now)
	}
	c.arriveLocked(inside)
	if err := ctx.Err(); err != nil {
		c.exitLocked(inside)
		c.listIdleLocked(fl)
		c.mu.Unlock()
		return Permit{}, err
	}
	slots := c.st.Slots()
	if c.queued == 0 && c.inflight < slots || c.overtakesLocked(fl, slots) {
		// A call that starts at once counts for fair queueing too.
		i := prioIndex(fl.k.prio)
		fl.vt = max(fl.vt, c.vclock[i]) + 1/fl.weight
		c.grantLocked(fl)
		return c.admitAndUnlock(Permit{c: c, f: fl, start: now, inside: inside}), nil
	}
	c.bound = true
	floor := c.floorLocked(now)
	wait := 2 * c.st.Target(floor)
	if dl, ok := ctx.Deadline(); ok {
		// Expect to wait for the calls ahead to start, then to run as
		// long as a call that does not queue (the baseline: a latency
		// inflated by an overload must not shed every call that waits,
		// or nothing would complete to correct it).
		left := dl.Sub(now) - c.st.Baseline
		expect := time.Duration(float64(c.st.Latency) * float64(c.queued) / float64(slots))
		if left <= min(expect, wait) {
			return Permit{}, c.shedAndUnlock(fl, inside, ShedDeadline, now)
		}
		wait = min(wait, left)
	}
	if c.queued >= c.st.QueueCap(floor) {
		switch v := c.victimLocked(fl, now); {
		case v != nil:
			c.evictLocked(v)
		case !c.withinSplitLocked(fl, now):
			return Permit{}, c.shedAndUnlock(fl, inside, ShedQueueFull, now)
		}
	}
	w := &waiter{ch: make(chan struct{}, 1), f: fl, at: now}
	c.enqueueLocked(w)
	c.mu.Unlock()

	t := time.NewTimer(wait)
	var ctxErr error
	select {
	case <-w.ch:
	case <-ctx.Done():
		ctxErr = ctx.Err()
	case <-t.C:
	}
	t.Stop()

	c.mu.Lock()
	switch {
	case w.granted && ctxErr == nil:
		c.waited++
		return c.admitAndUnlock(Permit{c: c, f: fl, start: w.grantAt, inside: inside, wait: w.grantAt.Sub(w.at)}), nil
	case w.granted:
		// Admitted as the context ended: give the slot to the next.
		c.releaseLocked(fl, inside)
		c.dispatchLocked(c.o.now())
		c.mu.Unlock()
		return Permit{}, ctxErr
	case w.evicted:
		return Permit{}, c.shedAndUnlock(fl, inside, ShedDisplaced, c.o.now())
	}
	c.dequeueLocked(w)
	if ctxErr != nil {
		c.exitLocked(inside)
		c.listIdleLocked(fl)
		c.mu.Unlock()
		return Permit{}, ctxErr
	}
	return Permit{}, c.shedAndUnlock(fl, inside, ShedTimeout, c.o.now())
}

// A Permit is an admitted call's slot. Call Done exactly once, when the
// call ends; the zero Permit's Done does nothing.
type Permit struct {
	c      *Controller
	f      *flow
	start  time.Time
	inside *flow // the flow whose place Enter counted the call in, or nil
	wait   time.Duration
}

// Wait returns how long the call waited for its slot: 0 for a call
// admitted at once, and for the zero Permit.
func (p Permit) Wait() time.Duration { return p.wait }

// Done ends the call: its slot goes to the next waiting call, and its
// service time to the control law.
func (p Permit) Done() {
	c := p.c
	if c == nil {
		return
	}
	now := c.o.now()
	c.mu.Lock()
	c.releaseLocked(p.f, p.inside)
	c.n++
	c.sum += now.Sub(p.start)
	var ev event
	if law.Due(c.st, c.n, c.bound, now) {
		ev = c.stepLocked(now)
	}
	c.dispatchLocked(now)
	c.mu.Unlock()
	c.emit(ev)
}

// yieldAbove is the least baseline service time at which an admitted call
// yields the CPU once before it runs. In the Go scheduler, a goroutine that
// was just made runnable (a call's, by its connection's reader or by Done)
// runs ahead of those already waiting, the connections' readers and
// writers among them; a 10 ms handler run ahead of each made them wait
// 60–80 ms (the median, from a trace of one CPU at 4× its capacity) and
// held the admitted p99 at 300 ms. Yielding puts the call behind them. It
// costs a reschedule and smaller read batches: 5–10% of the goodput of
// 0.2–0.5 ms calls, and no loss that showed with 2 ms calls (BENCHMARKS.md,
// run 8).
const yieldAbove = time.Millisecond

// admitAndUnlock, called with c.mu held, counts p's call admitted,
// releases the lock and, when calls take yieldAbove or more, yields the CPU
// before the call runs; it returns p. The call's service time includes the
// yield: the time a call waits for the CPU behind others is the signal that
// the limit is above what the CPUs run at once.
func (c *Controller) admitAndUnlock(p Permit) Permit {
	c.admitted++
	long := c.st.Baseline >= yieldAbove
	c.mu.Unlock()
	if long {
		runtime.Gosched()
	}
	return p
}

// warnUntapped logs, once, that calls reach Acquire without Enter.
func (c *Controller) warnUntapped() {
	l := c.o.logger
	if l == nil {
		l = slog.Default()
	}
	l.Warn("overload: a call reached Acquire without Enter: calls that wait to start in the Go scheduler are not bounded; " +
		"install the tap handle (middleware's Limiter.ServerOptions, or grpc.InTapHandle(limiter.TapHandle)), or call Enter where calls enter")
}
