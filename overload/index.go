package overload

import (
	"math"
	"time"
)

// The controller answers its questions about flows (whose waiting call a
// freed slot goes to, whose waiting call or place to take for a call under
// its share) from indexes of the flows, per priority, so that a call costs
// the same with one flow as with thousands. Each index orders its flows
// exactly as the scan it replaces chose among them, ties included: a flow's
// position in c.active or c.holding breaks ties as the scan's order did.
const (
	byStart   = iota // flows with calls waiting: least virtual start time first (dispatch)
	byLoad           // flows with calls waiting: most calls in slots and queue for the weight first (victim)
	byEntered        // flows holding places not given up: most let in lately for the weight first (displaced)
	byHeld           // flows holding places not given up: first in c.holding first (displaced, lower priorities)
	nIndexes
)

// notIndexed is a flow's position in every index before it is in any.
var notIndexed = [nIndexes]int{-1, -1, -1, -1}

// A flowHeap is a binary heap of flows, each of which knows its position in
// it (its pos at the heap's slot), so that a flow whose key changed moves,
// or leaves, in O(log n).
type flowHeap struct {
	fs   []*flow
	slot int                   // which of a flow's pos this heap keeps
	less func(a, b *flow) bool // a comes before b
	walk []int                 // the frontier of a walk, kept for the next
}

func (h *flowHeap) len() int { return len(h.fs) }

// top returns the first flow, or nil.
func (h *flowHeap) top() *flow {
	if len(h.fs) == 0 {
		return nil
	}
	return h.fs[0]
}

func (h *flowHeap) has(f *flow) bool { return f.pos[h.slot] >= 0 }

func (h *flowHeap) push(f *flow) {
	f.pos[h.slot] = len(h.fs)
	h.fs = append(h.fs, f)
	h.up(len(h.fs) - 1)
}

// remove takes f out. It compares f with nothing, so f's key may be stale
// (a flow whose last waiting call just left).
func (h *flowHeap) remove(f *flow) {
	i, n := f.pos[h.slot], len(h.fs)-1
	if i != n {
		h.swap(i, n)
	}
	h.fs[n] = nil
	h.fs = h.fs[:n]
	f.pos[h.slot] = -1
	if i != n {
		h.fix(h.fs[i])
	}
}

// fix moves f to its place after its key changed.
func (h *flowHeap) fix(f *flow) {
	if i := f.pos[h.slot]; !h.down(i) {
		h.up(i)
	}
}

func (h *flowHeap) swap(i, j int) {
	h.fs[i], h.fs[j] = h.fs[j], h.fs[i]
	h.fs[i].pos[h.slot], h.fs[j].pos[h.slot] = i, j
}

func (h *flowHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.fs[i], h.fs[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down moves the flow at i down to its place and reports whether it moved.
func (h *flowHeap) down(i int) bool {
	start := i
	for {
		c := 2*i + 1
		if c >= len(h.fs) {
			break
		}
		if r := c + 1; r < len(h.fs) && h.less(h.fs[r], h.fs[c]) {
			c = r
		}
		if !h.less(h.fs[c], h.fs[i]) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > start
}

// each calls visit with the flows in order, first first, until visit
// returns false. It costs O(k log k) for the k flows visited, however many
// the heap holds: the frontier of the walk is a heap of the positions
// whose parents were visited. visit must not change the heap.
func (h *flowHeap) each(visit func(*flow) bool) {
	if len(h.fs) == 0 {
		return
	}
	before := func(i, j int) bool { return h.less(h.fs[h.walk[i]], h.fs[h.walk[j]]) }
	h.walk = append(h.walk[:0], 0)
	for len(h.walk) > 0 {
		i := h.walk[0]
		if !visit(h.fs[i]) {
			return
		}
		// Replace the visited position by its children in the frontier.
		n := len(h.walk) - 1
		h.walk[0] = h.walk[n]
		h.walk = h.walk[:n]
		siftDown(h.walk, 0, before)
		for _, c := range [2]int{2*i + 1, 2*i + 2} {
			if c < len(h.fs) {
				h.walk = append(h.walk, c)
				siftUp(len(h.walk)-1, before, h.walk)
			}
		}
	}
}

func siftUp(i int, before func(i, j int) bool, w []int) {
	for i > 0 {
		p := (i - 1) / 2
		if !before(i, p) {
			return
		}
		w[i], w[p] = w[p], w[i]
		i = p
	}
}

func siftDown(w []int, i int, before func(i, j int) bool) {
	for {
		c := 2*i + 1
		if c >= len(w) {
			return
		}
		if r := c + 1; r < len(w) && before(r, c) {
			c = r
		}
		if !before(c, i) {
			return
		}
		w[i], w[c] = w[c], w[i]
		i = c
	}
}

// newIndexes returns the controller's indexes of the flows of one
// priority.
func newIndexes() [nIndexes]flowHeap {
	return [nIndexes]flowHeap{
		byStart: {slot: byStart, less: func(a, b *flow) bool {
			if a.vt != b.vt {
				return a.vt < b.vt
			}
			if x, y := a.q[0].at, b.q[0].at; x.Before(y) || y.Before(x) {
				return x.Before(y)
			}
			return a.ai < b.ai
		}},
		byLoad: {slot: byLoad, less: func(a, b *flow) bool {
			if x, y := a.load(), b.load(); x != y {
				return x > y
			}
			return a.ai < b.ai
		}},
		byEntered: {slot: byEntered, less: func(a, b *flow) bool { return a.ekey > b.ekey }},
		byHeld:    {slot: byHeld, less: func(a, b *flow) bool { return a.held < b.held }},
	}
}

// load is what the flow holds for its weight: its calls in slots and in
// the queue.
func (fl *flow) load() float64 { return float64(fl.inflight+len(fl.q)) / fl.weight }

// indexWaitingLocked keeps fl in c.active and its indexes exactly while it
// has calls waiting, after its queue, virtual start time or running calls
// changed. c.active keeps the order the scans it replaces went by: a flow
// joins at the end, and the last takes the place of one that leaves.
func (c *Controller) indexWaitingLocked(fl *flow) {
	i := prioIndex(fl.k.prio)
	ix := &c.index[i]
	switch in := fl.ai >= 0; {
	case len(fl.q) > 0 && !in:
		fl.ai = len(c.active[i])
		c.active[i] = append(c.active[i], fl)
		ix[byStart].push(fl)
		ix[byLoad].push(fl)
	case len(fl.q) == 0 && in:
		ix[byStart].remove(fl)
		ix[byLoad].remove(fl)
		a := c.active[i]
		last := a[len(a)-1]
		a[fl.ai], last.ai = last, fl.ai
		a[len(a)-1] = nil
		c.active[i] = a[:len(a)-1]
		fl.ai = -1
		if last != fl {
			ix[byStart].fix(last)
			ix[byLoad].fix(last)
		}
	case in:
		ix[byStart].fix(fl)
		ix[byLoad].fix(fl)
	}
}

// indexHoldingLocked keeps fl in the indexes of the flows holding places
// exactly while it holds places it has not given up (inside > owed), after
// those, or its calls let in lately, changed.
func (c *Controller) indexHoldingLocked(fl *flow) {
	ix := &c.index[prioIndex(fl.k.prio)]
	switch in := ix[byHeld].has(fl); {
	case fl.inside > fl.owed && !in:
		fl.ekey = c.enteredKeyLocked(fl)
		ix[byHeld].push(fl)
		ix[byEntered].push(fl)
	case fl.inside <= fl.owed && in:
		ix[byHeld].remove(fl)
		ix[byEntered].remove(fl)
	case in:
		fl.ekey = c.enteredKeyLocked(fl)
		ix[byHeld].fix(fl)
		ix[byEntered].fix(fl)
	}
}

// enteredKey returns the log of fl's calls let in lately, for its weight,
// as they were at c.epoch: the order of the keys is the order of the
// decayed counts at any time, since every count decays at the same rate,
// and exp(key - keyTimeLocked(now)) bounds the count at now from above (equal to
// it but for rounding, unless the clock went back past the count's latest
// call, when the count did not decay).
func (c *Controller) enteredKeyLocked(fl *flow) float64 {
	if fl.entered.at.IsZero() {
		return math.Inf(1) // never decays: no bound below infinity
	}
	return math.Log(fl.entered.v/fl.weight) + c.keyTimeLocked(fl.entered.at)
}

// keyTime returns t in entryMemory since c.epoch.
func (c *Controller) keyTimeLocked(t time.Time) float64 {
	return float64(t.Sub(c.epoch)) / float64(entryMemory)
}

// keySlack is how far, in the log of a count, a key and the count computed
// from it may stray apart by rounding: a few roundings of numbers as large
// as the time since c.epoch in entryMemory, with a margin of a hundred.
func keySlack(now float64) float64 { return 1e-12 + 1e-14*math.Abs(now) }
