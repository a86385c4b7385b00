package overload

import (
	"math"
	"time"

	"github.com/floodgate-go/floodgate"
)

// A Flow says whose a call is, for fairness: calls of one Key share a fair
// share of the server in proportion to Weight.
type Flow struct {
	// Key names the flow: a tenant, or an anonymous caller's address. The
	// controller keeps it only while the flow has calls in flight or
	// waiting, so it must not be a buffer the caller reuses.
	Key string
	// Weight is the flow's share relative to other flows; ≤ 0 means 1.
	Weight float64
	// Priority ranks the call: a waiting call of a higher priority is
	// admitted before any of a lower one, and the queue makes room for it
	// by displacing the lowest. Within a priority, fairness decides.
	Priority floodgate.Priority
}

type flowKey struct {
	key  string
	prio floodgate.Priority
}

type flow struct {
	k        flowKey
	weight   float64
	inflight int
	inside   int       // the flow's calls Enter let in
	pending  int       // of those, calls that have not reached Acquire yet
	owed     int       // places it gave up to flows under their share: its next calls to reach Acquire are shed (at most pending)
	entered  decayed   // calls Enter let in lately: the flow's recent share
	offered  decayed   // calls of the flow offered lately
	born     time.Time // when the controller began to remember it
	last     time.Time // its latest call
	held     int       // the flow's index in holding, or -1
	listed   bool      // in idle
	q        []*waiter
	vt       float64 // virtual start time of the flow's next call

	ai   int           // the flow's index in its priority's active, or -1
	pos  [nIndexes]int // its position in each of its priority's indexes, or -1
	ekey float64       // its key in byEntered (enteredKeyLocked)
}

func (fl *flow) busy() bool { return fl.inflight > 0 || fl.inside > 0 || len(fl.q) > 0 }

// nPriorities is the number of priorities a flow can have: sheddable,
// default and critical (floodgate.Priority).
const nPriorities = 3

// prioIndex returns the index of p, one of the three priorities (a flow
// key's: Controller.flow clamps any other value to the nearest).
func prioIndex(p floodgate.Priority) int { return int(p) + 1 }

func weight(w float64) float64 {
	if !(w > 0) || math.IsInf(w, 0) {
		return 1
	}
	return w
}

// maxFlows bounds the flows the controller tracks: calls of further flows
// (a flood of made-up addresses) share one. 16,384 covers the tenants of
// any one server many times over, and keeps the flow table (a few hundred
// bytes a flow) within a few MB.
const maxFlows = 1 << 14

// overflowKey is the flow of calls beyond maxFlows.
const overflowKey = "\x00overflow"

// forgetAfter is how long the controller remembers a flow none of whose
// calls is in the server: by then what it was let in and offered has
// decayed to a twentieth, and a flow that comes back starts afresh.
const forgetAfter = 3 * entryMemory

// flowLocked returns f's flow as of now, making it if needed.
func (c *Controller) flowLocked(f Flow, now time.Time) *flow {
	// A priority outside the three counts as the nearest of them.
	k := flowKey{f.Key, min(max(f.Priority, floodgate.Sheddable), floodgate.Critical)}
	fl, ok := c.flows[k]
	if !ok {
		c.sweepLocked(now)
		if len(c.flows) >= maxFlows {
			k.key = overflowKey
			fl, ok = c.flows[k]
		}
	}
	if !ok {
		if n := len(c.free); n > 0 {
			fl, c.free = c.free[n-1], c.free[:n-1]
		} else {
			fl = new(flow)
		}
		*fl = flow{k: k, weight: weight(f.Weight), held: -1, ai: -1, pos: notIndexed, born: now, q: fl.q[:0]}
		c.flows[k] = fl
		c.weights += fl.weight
	}
	fl.last = now
	return fl
}

// listIdleLocked lists fl to be forgotten (sweepLocked) when nothing of it
// is in flight, inside or waiting.
func (c *Controller) listIdleLocked(fl *flow) {
	if fl.busy() || fl.listed || c.flows[fl.k] != fl {
		return
	}
	fl.listed = true
	c.idle = append(c.idle, fl)
}

// sweepLocked forgets the flows listed idle whose latest call came
// forgetAfter or more before now, looking at a few of the list at most: a
// flow busy again leaves the list, one idle but recent goes to its end.
func (c *Controller) sweepLocked(now time.Time) {
	for range min(len(c.idle)-c.idleHead, sweepBatch) {
		fl := c.idle[c.idleHead]
		c.idle[c.idleHead] = nil
		c.idleHead++
		switch {
		case fl.busy():
			fl.listed = false
		case now.Sub(fl.last) < forgetAfter:
			c.idle = append(c.idle, fl)
		default:
			delete(c.flows, fl.k)
			c.weights -= fl.weight
			if len(c.flows) == 0 {
				c.weights = 0 // no rounding left over
			}
			fl.listed = false
			if len(c.free) < maxFree {
				c.free = append(c.free, fl)
			}
		}
	}
	if c.idleHead > len(c.idle)-c.idleHead { // more swept than left: compact
		n := copy(c.idle, c.idle[c.idleHead:])
		clear(c.idle[n:])
		c.idle, c.idleHead = c.idle[:n], 0
	}
}

// sweepBatch is how many flows listed idle a sweep looks at, at most: a
// bounded cost per new flow or step, and more than the one flow a new flow
// adds, so the list drains faster than it fills.
const sweepBatch = 16

// maxFree is how many forgotten flows are kept to be reused: a step's
// churn of flows without holding the memory of a flood of addresses.
const maxFree = 64

// unholdLocked removes fl, which has no call inside any more, from holding.
func (c *Controller) unholdLocked(fl *flow) {
	last := c.holding[len(c.holding)-1]
	c.holding[fl.held], last.held = last, fl.held
	c.holding[len(c.holding)-1] = nil
	c.holding = c.holding[:len(c.holding)-1]
	fl.held = -1
	if ix := &c.index[prioIndex(last.k.prio)][byHeld]; last != fl && ix.has(last) {
		ix.fix(last)
	}
}

// entryMemory is how long the controller remembers the calls it was
// offered, let in and shed (decayed), when it judges shares and overload:
// long enough to span many calls of a flow under its share, short enough
// to follow a change of load within a second or two.
const entryMemory = time.Second

// decayed is a count that decays over entryMemory: what happened lately.
type decayed struct {
	v  float64
	at time.Time
}

// value returns the count decayed to now. It records nothing: a count
// read often and one read once hold the same value to the last bit.
func (d decayed) value(now time.Time) float64 {
	if dt := now.Sub(d.at); dt > 0 && !d.at.IsZero() {
		return d.v * math.Exp(-float64(dt)/float64(entryMemory))
	}
	return d.v
}

// add counts n more as of now.
func (d *decayed) add(now time.Time, n float64) { d.set(now, d.value(now)+n) }

// set makes the count v as of now.
func (d *decayed) set(now time.Time, v float64) { d.v, d.at = v, now }
