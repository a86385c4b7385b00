package cpugate_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate/cpugate"
)

// plant is a server of capacity c requests per second behind a gate. Its
// clients offer some load; the per-client limits add up to limit requests
// per second, and the gate scales them, so the server admits
// min(offered, scale × limit). CPU follows the admitted load with a
// first-order lag of time constant lag (queues draining, GC catching up),
// saturating at 1, and the sampler reports its average over each interval.
type plant struct {
	c, limit float64
	lag      time.Duration
	cpu      float64
}

// run advances the plant by one sampling interval at the given scale and
// returns the admitted rate and the CPU reading for the interval.
func (p *plant) run(offered, scale float64) (admitted, reading float64) {
	const sub = 10 * time.Millisecond
	admitted = math.Min(offered, scale*p.limit)
	target := math.Min(1, admitted/p.c)
	alpha := 1.0
	if p.lag > 0 {
		alpha = 1 - math.Exp(-float64(sub)/float64(p.lag))
	}
	var sum float64
	n := int(interval / sub)
	for range n {
		p.cpu += alpha * (target - p.cpu)
		sum += p.cpu
	}
	return admitted, sum / float64(n)
}

type simStep struct {
	at            time.Duration
	admitted, cpu float64
	scale         float64
	state         cpugate.State
}

func simulate(pol cpugate.Policy, p *plant, dur time.Duration, offered func(time.Duration) float64) []simStep {
	var c cpugate.Control
	var out []simStep
	for at := time.Duration(0); at < dur; at += interval {
		admitted, cpu := p.run(offered(at), c.Scale())
		c = pol.Step(c, cpugate.Reading{CPU: cpu}, t0.Add(at))
		out = append(out, simStep{at: at, admitted: admitted, cpu: cpu, scale: c.Scale(), state: c.State})
	}
	return out
}

// TestAdaptiveSettles feeds the plant 0.5× to 5× its capacity, with limits
// adding up to 1× to 3× capacity and CPU lagging by up to a second. After a
// minute, Adaptive must hold the admitted rate within [80%, 90%] of capacity
// whenever the load exceeds that, with no state change and no scale change:
// it settles rather than oscillates.
func TestAdaptiveSettles(t *testing.T) {
	const c = 1000.0
	const settle, hold = time.Minute, 4 * time.Minute
	for _, limit := range []float64{1, 1.5, 2, 3} {
		for _, load := range []float64{0.5, 0.9, 1.2, 2, 3, 5} {
			for _, lag := range []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, time.Second} {
				name := fmt.Sprintf("limit=%vC/offered=%vC/lag=%v", limit, load, lag)
				t.Run(name, func(t *testing.T) {
					p := &plant{c: c, limit: limit * c, lag: lag}
					steps := simulate(cpugate.Adaptive{}, p, settle+hold, func(time.Duration) float64 { return load * c })
					final := steps[len(steps)-1]
					lo, hi := 0.80*c, 0.90*c
					if wanted := math.Min(load, limit) * c; wanted < lo {
						// Not overloaded: the gate must stay out of the way.
						lo, hi = wanted, wanted
					}
					for _, s := range steps {
						if s.at < settle {
							continue
						}
						if s.admitted < lo-1e-9 || s.admitted > hi+1e-9 {
							t.Errorf("at %v: admitted %.0f/s, want within [%.0f, %.0f]", s.at, s.admitted, lo, hi)
							return
						}
						if s.state != final.state || s.scale != final.scale {
							t.Errorf("at %v: state %v scale %v, then %v %v at the end: still oscillating",
								s.at, s.state, s.scale, final.state, final.scale)
							return
						}
					}
				})
			}
		}
	}
}

// TestAdaptiveFollowsChangingLoad walks the offered load up from 0.5× to 5×
// capacity and back, a minute per level: at each level the admitted rate
// settles within the band (or at the offered load when it fits), and full
// limits return once the load is gone.
func TestAdaptiveFollowsChangingLoad(t *testing.T) {
	const c = 1000.0
	levels := []float64{0.5, 1, 2, 5, 2, 1, 0.5}
	const per = 90 * time.Second
	p := &plant{c: c, limit: 2 * c, lag: 500 * time.Millisecond}
	steps := simulate(cpugate.Adaptive{}, p, per*time.Duration(len(levels)), func(at time.Duration) float64 {
		return levels[at/per] * c
	})
	for _, s := range steps {
		level := levels[s.at/per]
		if s.at%per < 60*time.Second {
			continue // settling
		}
		lo, hi := 0.80*c, 0.90*c
		if level*c < lo {
			lo, hi = level*c, level*c
		}
		if s.admitted < lo-1e-9 || s.admitted > hi+1e-9 {
			t.Errorf("at %v (offered %vC): admitted %.0f/s, want within [%.0f, %.0f]", s.at, level, s.admitted, lo, hi)
		}
	}
	if last := steps[len(steps)-1]; last.state != cpugate.Open || last.scale != 1 {
		t.Errorf("after the load is gone: state %v scale %v, want open 1", last.state, last.scale)
	}
}

// TestFixedOscillatesUnderSustainedOverload documents why Adaptive exists:
// under sustained overload Fixed can only alternate between its factor and
// full limits, once per cooldown, never settling.
func TestFixedOscillatesUnderSustainedOverload(t *testing.T) {
	const c = 1000.0
	p := &plant{c: c, limit: 2 * c, lag: 500 * time.Millisecond}
	steps := simulate(cpugate.Fixed{}, p, 5*time.Minute, func(time.Duration) float64 { return 5 * c })
	flips := 0
	for i := 1; i < len(steps); i++ {
		if steps[i].state != steps[i-1].state {
			flips++
		}
	}
	if flips < 20 {
		t.Errorf("Fixed flipped %d times in 5 min of 5× overload, want it to keep alternating", flips)
	}
}
