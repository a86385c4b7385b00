package overload

import (
	"errors"
	"math"
	"time"
)

// ErrShed is wrapped by every [ShedError]: errors.Is(err, ErrShed) tells a
// call the controller turned away from one whose context ended.
var ErrShed = errors.New("overload: shed")

// ShedCause says why a call was shed.
type ShedCause uint8

const (
	// ShedQueueFull: every slot was taken, the queue was full, and the
	// call's flow held at least its fair share of it.
	ShedQueueFull ShedCause = iota
	// ShedDisplaced: the call waited, and a call of a flow further under
	// its fair share (or of a higher priority) took its place.
	ShedDisplaced
	// ShedTimeout: the call waited for a slot as long as a call may:
	// twice the queue target.
	ShedTimeout
	// ShedDeadline: the call's deadline left less than its expected wait
	// plus its service time: the work would have been wasted.
	ShedDeadline
	// ShedTap: the call was turned away as it entered the server, before
	// its request was read ([Controller.Enter]).
	ShedTap
	nShedCauses
)

var shedNames = [...]string{"queue_full", "displaced", "wait_timeout", "deadline", "tap"}

// ShedCauses returns every cause this release sheds calls for, in order:
// the labels of a count by cause ([Snapshot.ShedBy]). Later releases may
// add causes.
func ShedCauses() []ShedCause {
	causes := make([]ShedCause, nShedCauses)
	for i := range causes {
		causes[i] = ShedCause(i)
	}
	return causes
}

// String returns the cause's lower-case name, such as "queue_full", fit for
// a metric label.
func (s ShedCause) String() string {
	if int(s) < len(shedNames) {
		return shedNames[s]
	}
	return "unknown"
}

// A ShedError is the error of a call the controller shed. It wraps
// [ErrShed].
type ShedError struct {
	Cause ShedCause
	// RetryAfter is a hint of when capacity may be free again.
	RetryAfter time.Duration
}

func (e *ShedError) Error() string { return "overload: shed (" + e.Cause.String() + ")" }

// Unwrap returns ErrShed.
func (e *ShedError) Unwrap() error { return ErrShed }

// displacedLocked returns the flow that gives up a place so that a call of
// fl may enter a full server, or nil when fl's call should be shed. A flow
// of a lower priority than fl's goes first. Within fl's priority, fl may
// enter when, with this call, it would still have been let in fewer calls
// lately for its weight than the flow let in the most (which may have
// nothing inside at the moment), and the flow that gives up a place is the
// one let in the most of those holding one not yet given up, if it was let
// in more than fl and asks for more than its split (withinSplitLocked). So
// a flow under its weighted max-min fair share keeps its calls while
// another floods, and the flood gets what is left.
//
// It looks at the flows let in more than fl would be, the most first, and
// stops at the first not within its split (and those tied with it): its
// cost grows with the flows within their split let in more than fl, not
// with the flows remembered.
func (c *Controller) displacedLocked(fl *flow, now time.Time) *flow {
	own := (fl.entered.value(now) + 1) / fl.weight
	if own >= c.top.value(now) {
		return nil
	}
	p := prioIndex(fl.k.prio)
	for i := range p {
		if g := c.index[i][byHeld].top(); g != nil {
			return g // the first in c.holding of the lowest priority
		}
	}
	// The flow let in the most, of those let in more than own: visited
	// from the most by key, until a key's bound on its count falls short
	// of what the victim must beat. Ties go to the first in c.holding.
	var victim *flow
	most := own
	nowKey := c.keyTimeLocked(now)
	slack := keySlack(nowKey)
	c.index[p][byEntered].each(func(g *flow) bool {
		if g.ekey-nowKey < math.Log(most)-slack {
			return false
		}
		if g == fl || c.withinSplitLocked(g, now) {
			return true
		}
		if l := g.entered.value(now) / g.weight; l > most || l == most && victim != nil && g.held < victim.held {
			most, victim = l, g
		}
		return true
	})
	return victim
}

// withinSplitLocked reports whether fl asks for no more, for its weight,
// than an equal split of what the server completes among the flows
// remembered, and no call of a higher priority waits. Such a flow is never
// shed for room nor displaced: what all of them ask fits in the capacity.
func (c *Controller) withinSplitLocked(fl *flow, now time.Time) bool {
	for i := prioIndex(fl.k.prio) + 1; i < nPriorities; i++ {
		if len(c.active[i]) > 0 {
			return false
		}
	}
	// The flow's calls offered lately, against what an equal split would
	// have let in over the part of entryMemory it has been remembered:
	// a flow new to the controller has shown nothing yet.
	seen := -math.Expm1(-float64(now.Sub(fl.born)) / float64(entryMemory))
	return fl.offered.value(now) <= fl.weight*c.st.Throughput*entryMemory.Seconds()*seen/c.weights
}

// victimLocked returns the flow that should lose a waiting call so that a
// call of fl can wait, or nil when fl's call should be shed instead: the
// lowest priority first, then the flow holding the most slots and queue
// places for its weight, save flows within their split
// (withinSplitLocked). A flow no further under its share than the victim
// does not displace it.
//
// It looks at the flows that hold more than fl would with this call, the
// most first, and stops at the first not within its split.
func (c *Controller) victimLocked(fl *flow, now time.Time) *flow {
	p := prioIndex(fl.k.prio)
	for i := range p {
		if v := c.index[i][byLoad].top(); v != nil {
			return v
		}
	}
	// In fl's priority, the flow that holds the most (the first in
	// c.active of those), unless it is within its split: then the next.
	// None that holds no more than fl would with this call displaces it.
	need := float64(fl.inflight+len(fl.q)+1) / fl.weight
	var worst *flow
	c.index[p][byLoad].each(func(v *flow) bool {
		if !(need < v.load()) {
			return false
		}
		if c.withinSplitLocked(v, now) {
			return true
		}
		worst = v
		return false
	})
	return worst
}

// evictLocked displaces v's oldest waiting call, the one closest to its wait
// running out.
func (c *Controller) evictLocked(v *flow) {
	w := v.q[0]
	c.dequeueLocked(w)
	w.evicted = true
	w.ch <- struct{}{}
}

// countShedLocked counts a shed call of cause.
func (c *Controller) countShedLocked(cause ShedCause, now time.Time) {
	c.shed[cause]++
	c.shedLately.add(now, 1)
	c.lastShed = now
}

// shedAndUnlock, called with c.mu held, counts a shed call of fl, gives back
// its place Enter counted, lists fl idle if it is empty, releases the lock,
// logs a change of state and returns the call's error. (A …Locked helper
// expects the lock held and leaves it held; this one releases it.)
func (c *Controller) shedAndUnlock(fl *flow, inside *flow, cause ShedCause, now time.Time) error {
	c.countShedLocked(cause, now)
	c.exitLocked(inside)
	c.listIdleLocked(fl)
	ev := c.startSheddingLocked(now)
	c.mu.Unlock()
	c.emit(ev)
	return &ShedError{Cause: cause, RetryAfter: c.o.retry}
}
