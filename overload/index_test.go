package overload

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/floodgate-go/floodgate"
)

var discard = slog.New(slog.DiscardHandler)

// The scans the indexes replace, as they were: each looks at every flow.

func (c *Controller) scanDisplacedLocked(fl *flow, now time.Time) *flow {
	own := (fl.entered.value(now) + 1) / fl.weight
	if own >= c.top.value(now) {
		return nil
	}
	var victim, lower *flow
	var most float64
	for _, g := range c.holding {
		if g.inside-g.owed <= 0 || g == fl || g.k.prio > fl.k.prio {
			continue
		}
		if g.k.prio < fl.k.prio {
			if lower == nil || g.k.prio < lower.k.prio {
				lower = g
			}
			continue
		}
		if l := g.entered.value(now) / g.weight; l > most && !c.withinSplitLocked(g, now) {
			most, victim = l, g
		}
	}
	switch {
	case lower != nil:
		return lower
	case most > own:
		return victim
	}
	return nil
}

func (c *Controller) scanVictimLocked(fl *flow, now time.Time) *flow {
	p := prioIndex(fl.k.prio)
	for i := range p + 1 {
		var worst *flow
		var worstLoad float64
		for _, v := range c.active[i] {
			if i == p && c.withinSplitLocked(v, now) {
				continue
			}
			if l := float64(v.inflight+len(v.q)) / v.weight; worst == nil || l > worstLoad {
				worst, worstLoad = v, l
			}
		}
		switch {
		case worst == nil:
			continue
		case i < p:
			return worst
		case float64(fl.inflight+len(fl.q)+1)/fl.weight < worstLoad && worst != fl:
			return worst
		}
		return nil
	}
	return nil
}

func (c *Controller) scanNextLocked() (*flow, int) {
	var best *flow
	p := nPriorities - 1
	for ; p >= 0 && best == nil; p-- {
		for _, fl := range c.active[p] {
			if best == nil || fl.vt < best.vt || (fl.vt == best.vt && fl.q[0].at.Before(best.q[0].at)) {
				best = fl
			}
		}
	}
	return best, p + 1
}

// checkIndexesLocked returns what is wrong with c's indexes: a heap out of
// order, a flow in the wrong ones, or an answer that differs from the scan's
// for any flow remembered.
func (c *Controller) checkIndexesLocked(now time.Time) error {
	for i := range c.index {
		for x := range c.index[i] {
			h := &c.index[i][x]
			for j, f := range h.fs {
				if f.pos[x] != j {
					return fmt.Errorf("priority %d index %d: a flow at %d thinks it is at %d", i, x, j, f.pos[x])
				}
				if j > 0 && h.less(f, h.fs[(j-1)/2]) {
					return fmt.Errorf("priority %d index %d: flow %q at %d comes before its parent", i, x, f.k.key, j)
				}
			}
		}
		for j, f := range c.active[i] {
			if f.ai != j || !c.index[i][byStart].has(f) || !c.index[i][byLoad].has(f) {
				return fmt.Errorf("active flow %q (priority %d, at %d): ai %d, in byStart %v, in byLoad %v",
					f.k.key, i, j, f.ai, c.index[i][byStart].has(f), c.index[i][byLoad].has(f))
			}
		}
		if n := len(c.active[i]); c.index[i][byStart].len() != n || c.index[i][byLoad].len() != n {
			return fmt.Errorf("priority %d: %d active, %d by start, %d by load", i, n, c.index[i][byStart].len(), c.index[i][byLoad].len())
		}
	}
	holders := make([]int, nPriorities)
	for j, f := range c.holding {
		i := prioIndex(f.k.prio)
		in := f.inside > f.owed
		if f.held != j || c.index[i][byHeld].has(f) != in || c.index[i][byEntered].has(f) != in {
			return fmt.Errorf("holding flow %q at %d: held %d, places %d owed %d, in byHeld %v, in byEntered %v",
				f.k.key, j, f.held, f.inside, f.owed, c.index[i][byHeld].has(f), c.index[i][byEntered].has(f))
		}
		if in {
			holders[i]++
			if f.ekey != c.enteredKeyLocked(f) {
				return fmt.Errorf("flow %q: key %v, want %v", f.k.key, f.ekey, c.enteredKeyLocked(f))
			}
		}
	}
	for i, n := range holders {
		if c.index[i][byHeld].len() != n || c.index[i][byEntered].len() != n {
			return fmt.Errorf("priority %d: %d holders, %d by held, %d by entered", i, n, c.index[i][byHeld].len(), c.index[i][byEntered].len())
		}
	}
	for _, fl := range c.flows {
		if got, want := c.displacedLocked(fl, now), c.scanDisplacedLocked(fl, now); got != want {
			return fmt.Errorf("displaced(%q) = %v, the scan's %v", fl.k.key, name(got), name(want))
		}
		if got, want := c.victimLocked(fl, now), c.scanVictimLocked(fl, now); got != want {
			return fmt.Errorf("victim(%q) = %v, the scan's %v", fl.k.key, name(got), name(want))
		}
	}
	if c.queued > 0 {
		got, gp := c.nextLocked()
		want, wp := c.scanNextLocked()
		if got != want || gp != wp {
			return fmt.Errorf("next = %v (priority %d), the scan's %v (%d)", name(got), gp, name(want), wp)
		}
	}
	return nil
}

func name(fl *flow) string {
	if fl == nil {
		return "none"
	}
	return fmt.Sprintf("%q/%v", fl.k.key, fl.k.prio)
}

// The indexes answer every question exactly as the scans did, ties
// included, in every state a mixed overload passes through: flows of
// three priorities and several weights, floods and light flows, calls shed
// at the tap, displaced, timed out, abandoned before Acquire, streams.
func TestIndexesAnswerAsTheScans(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				indexWorkload(t, seed)
			})
		})
	}
}

func indexWorkload(t *testing.T, seed uint64) {
	c := newTest(t, WithLimits(2, 2), WithLogger(discard))
	teach(t, c, 2*ms) // a throughput, so that some flows are within their split
	rng := rand.New(rand.NewPCG(seed, 7))
	prios := []floodgate.Priority{floodgate.Sheddable, floodgate.Default, floodgate.Default, floodgate.Critical}
	var flows []Flow
	for i := range 24 {
		flows = append(flows, Flow{Key: fmt.Sprint("f", i%12), Weight: float64(1 + i%5/3), Priority: prios[rng.IntN(len(prios))]})
	}
	var done atomic.Bool
	var checks atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for !done.Load() {
			time.Sleep(50 * time.Microsecond)
			c.mu.Lock()
			err := c.checkIndexesLocked(c.o.now())
			c.mu.Unlock()
			checks.Add(1)
			if err != nil {
				t.Error(err)
				return
			}
		}
	})
	var calls sync.WaitGroup
	for i := range 1500 {
		// About twice what the server completes, from a flood of two
		// fifths and light flows, some within their split, at times in
		// a burst of calls at one instant (ties of counts and of times).
		f, burst := flows[rng.IntN(len(flows))], 1
		switch r := rng.IntN(10); {
		case r < 4:
			f = flows[0]
		case r == 4:
			burst = 1 + rng.IntN(6)
		}
		for range burst {
			call(t, c, &calls, f, flows[rng.IntN(len(flows))], rng, i)
		}
		time.Sleep(time.Duration(rng.IntN(1200)) * time.Microsecond)
	}
	calls.Wait()
	done.Store(true)
	wg.Wait()
	if n := checks.Load(); n < 100 {
		t.Errorf("%d states checked, want many", n)
	}
	s := c.Snapshot()
	for _, cause := range []ShedCause{ShedTap, ShedDisplaced, ShedQueueFull} {
		if s.ShedBy(cause) == 0 {
			t.Errorf("no call shed %v: the workload should reach every path", cause)
		}
	}
}

// call makes a call of f that enters, and takes one of six paths: its
// context ends before Acquire, it is a stream, or it Acquires, as f or as
// other (the tap and the interceptor disagree, one time in eight).
func call(t *testing.T, c *Controller, calls *sync.WaitGroup, f, other Flow, rng *rand.Rand, i int) {
	g := f
	if rng.IntN(8) == 0 {
		g = other
	}
	path, cost := rng.IntN(6), time.Duration(rng.IntN(4000))*time.Microsecond
	calls.Go(func() {
		ctx, cancel := context.WithTimeout(t.Context(), time.Duration(5+i%100)*ms)
		defer cancel()
		ctx, in := c.Enter(ctx, f)
		if !in {
			return
		}
		switch path {
		case 0:
			return // its context ends before it reaches Acquire
		case 1:
			c.Leave(ctx) // a stream
			return
		}
		p, err := c.Acquire(ctx, g)
		if err != nil {
			return
		}
		time.Sleep(cost)
		p.Done()
	})
}

// Of flows let in as many calls lately, the first to have taken a place
// gives one up, as the scan that looked at them in that order chose.
func TestDisplacedTieGoesToTheFirstHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newTest(t) // one slot, a queue of 4: five places
		keys := []string{"a", "b", "c", "d", "e"}
		for _, k := range keys { // one call each, at one instant
			if _, in := c.Enter(t.Context(), Flow{Key: k}); !in {
				t.Fatalf("Enter(%s) = false with places free", k)
			}
		}
		// Half the others' share for its weight: it takes a place.
		if _, in := c.Enter(t.Context(), Flow{Key: "x", Weight: 2}); !in {
			t.Fatal("Enter(x) = false, want it to take a place")
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, k := range keys {
			want := 0
			if k == "a" {
				want = 1
			}
			if got := c.flows[flowKey{key: k}].owed; got != want {
				t.Errorf("%s owes %d places, want %d", k, got, want)
			}
		}
	})
}
