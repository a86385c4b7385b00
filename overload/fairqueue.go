package overload

import (
	"time"
)

type waiter struct {
	ch      chan struct{}
	f       *flow
	at      time.Time
	granted bool
	evicted bool
	grantAt time.Time
}

func (c *Controller) enqueueLocked(w *waiter) {
	fl := w.f
	if len(fl.q) == 0 {
		fl.vt = max(fl.vt, c.vclock[prioIndex(fl.k.prio)])
	}
	fl.q = append(fl.q, w)
	c.queued++
	c.indexWaitingLocked(fl)
}

// dequeueLocked removes w from its flow's queue.
func (c *Controller) dequeueLocked(w *waiter) {
	fl := w.f
	for i, x := range fl.q {
		if x == w {
			copy(fl.q[i:], fl.q[i+1:])
			fl.q[len(fl.q)-1] = nil
			fl.q = fl.q[:len(fl.q)-1]
			c.queued--
			break
		}
	}
	c.indexWaitingLocked(fl)
}

// dispatchLocked hands free slots to waiting calls: the highest priority
// first, then, by start-time fair queueing, the flow whose virtual time is
// least (each call it starts advances it by 1/weight), so that flows get
// slots in proportion to their weights however many calls each has
// waiting (nextLocked).
func (c *Controller) dispatchLocked(now time.Time) {
	for c.queued > 0 && c.inflight < c.st.Slots() {
		best, p := c.nextLocked()
		c.vclock[p] = best.vt
		best.vt += 1 / best.weight
		w := best.q[0]
		c.dequeueLocked(w) // places best anew by its virtual start time
		c.grantLocked(best)
		w.granted, w.grantAt = true, now
		c.waitSum += now.Sub(w.at)
		c.waitN++
		w.ch <- struct{}{}
	}
}

// nextLocked returns the flow whose waiting call the next free slot goes
// to, and its priority's index: of the highest priority with calls
// waiting, the flow of the least virtual start time, then of the oldest
// waiting call, then first in c.active.
func (c *Controller) nextLocked() (*flow, int) {
	p := nPriorities - 1
	for c.index[p][byStart].len() == 0 {
		p--
	}
	return c.index[p][byStart].top(), p
}

func (c *Controller) grantLocked(fl *flow) {
	fl.inflight++
	c.inflight++
	c.running[prioIndex(fl.k.prio)]++
	c.indexWaitingLocked(fl)
}

// overtakesLocked reports whether a call of fl takes a slot at once
// although every slot is taken: lower-priority calls hold some, its own
// and higher priorities hold fewer than the limit, and none of those
// waits. Calls of a priority never wait for slots held by lower ones: they
// run beside them, and no slot goes to a waiting call until the calls
// running are back within the limit, so the lower-priority calls give
// theirs back as they end.
func (c *Controller) overtakesLocked(fl *flow, slots int) bool {
	p := prioIndex(fl.k.prio)
	above := 0
	for i := p; i < nPriorities; i++ {
		if len(c.active[i]) > 0 {
			return false
		}
		above += c.running[i]
	}
	return above < slots && above < c.inflight
}

// releaseLocked ends a call of fl that held a slot and, unless inside is
// nil, a place Enter counted.
func (c *Controller) releaseLocked(fl *flow, inside *flow) {
	fl.inflight--
	c.inflight--
	c.running[prioIndex(fl.k.prio)]--
	c.indexWaitingLocked(fl)
	c.exitLocked(inside)
	c.listIdleLocked(fl)
}
