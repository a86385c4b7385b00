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
// call waits. A call waits at most twice the queue target
// ([WithQueueTarget]), and is shed at once when ctx's deadline leaves less
// than its expected wait plus the service time of a call that does not
// queue (the baseline).
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
	wait := c.st.MaxWait(floor)
	if dl, ok := ctx.Deadline(); ok {
		if wait, ok = c.st.DeadlineWait(dl.Sub(now), wait, c.queued); !ok {
			return Permit{}, c.shedAndUnlock(fl, inside, ShedDeadline, now)
		}
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

// admitAndUnlock, called with c.mu held, counts p's call admitted,
// releases the lock and yields the CPU once if the law says the call
// should (law.State.Yields); it returns p.
func (c *Controller) admitAndUnlock(p Permit) Permit {
	c.admitted++
	yield := c.st.Yields()
	c.mu.Unlock()
	if yield {
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
