package main

import (
	"fmt"
	"github.com/floodgate-go/floodgate/bench/internal/fair"
	"slices"
	"time"
)

// What the results say, by scenario, variant and window, for the report's
// tables and the summary.

func (res *Results) run(scenario, variant string) *Run {
	for i := range res.Runs {
		if res.Runs[i].Scenario == scenario && res.Runs[i].Variant == variant {
			return &res.Runs[i]
		}
	}
	return nil
}

func (r *Run) window(name string) *Window {
	if r == nil {
		return nil
	}
	for i := range r.Windows {
		if r.Windows[i].Name == name {
			return &r.Windows[i]
		}
	}
	return nil
}

// variants returns the variants of the runs, in report order.
func (res *Results) variants() []string {
	var vs []string
	for _, v := range allVariants {
		in := slices.ContainsFunc(res.Runs, func(r Run) bool { return r.Variant == v }) ||
			slices.ContainsFunc(res.RejCosts, func(rc RejCost) bool { return rc.Variant == v })
		if in {
			vs = append(vs, v)
		}
	}
	return vs
}

// Has reports whether the results hold the scenario or the variant called
// name.
func (res *Results) Has(name string) bool {
	return slices.ContainsFunc(res.Runs, func(r Run) bool { return r.Scenario == name || r.Variant == name })
}

// scenario returns the scenario called name, nil when the run has none.
func (res *Results) scenario(name string) *Scenario {
	for i := range res.Scenarios {
		if res.Scenarios[i].Name == name {
			return &res.Scenarios[i]
		}
	}
	return nil
}

// changeAt returns the capacity change's time and cost factor, from its
// scenario: the first segment that multiplies the cost.
func (sc *Scenario) changeAt() (time.Duration, float64, bool) {
	if sc == nil {
		return 0, 0, false
	}
	for i, s := range sc.Segments {
		if s.CostX > 1 {
			return sc.segmentStart(i), s.CostX, true
		}
	}
	return 0, 0, false
}

// NewCapacity is the capacity after the capacity change: the measured one
// over the cost factor.
func (res *Results) NewCapacity() float64 {
	_, costX, _ := res.scenario("capchange").changeAt()
	return res.Capacity / max(costX, 1)
}

// CgroupQuota is the server cgroup's CPU quota, 0 without one.
func (res *Results) CgroupQuota() float64 {
	if res.Isolation == nil {
		return 0
	}
	return res.Isolation.Quota
}

// Quota returns tenant i's quota, calls/s.
func (res *Results) Quota(i int) float64 { return quota(i, res.Capacity) }

func (res *Results) sweepLoads() []float64 {
	if sc := res.scenario("sweep"); sc != nil {
		var ls []float64
		for _, s := range sc.Segments {
			if s.Measure {
				ls = append(ls, s.Load)
			}
		}
		return ls
	}
	return nil
}

// health returns variant v's health probes answered and sent, over every
// scenario.
func (res *Results) health(v string) (ok, n int) {
	for _, r := range res.Runs {
		if r.Variant == v {
			w := r.window("all")
			ok += w.HealthOK
			n += w.HealthSent
		}
	}
	return ok, n
}

// steadyWindows are the windows of constant offered load and cost, by
// scenario, over which reversals are counted against their target; nil
// takes every measured window of the scenario.
var steadyWindows = map[string][]string{
	"sweep":           nil,
	"capchange":       {"converged"},
	neighbourIdle:     {"idle"},
	neighbourOverload: {"overload"},
}

// reversals returns variant v's reversals at steady load and the seconds
// they were counted over (see steadyWindows).
func (res *Results) reversals(v string) (n int, secs float64) {
	for _, r := range res.Runs {
		names, ok := steadyWindows[r.Scenario]
		if r.Variant != v || !ok {
			continue
		}
		for _, w := range r.Windows {
			if w.Name == "all" || w.Name == settledWindow || (names != nil && !slices.Contains(names, w.Name)) || w.To <= w.From {
				continue
			}
			n += w.Reversals
			secs += w.To - w.From
		}
	}
	return n, secs
}

// heavyFair returns the heavy tenant's goodput in a window and its max-min
// fair share of capacity, 0 when the window has no tenants' rates.
func heavyFair(w *Window, capacity float64) (good, share float64) {
	if len(w.TenantSent) != numTenants {
		return 0, 0
	}
	return w.TenantGood[heavyTenant], fair.MaxMin(capacity, w.TenantSent)[heavyTenant]
}

// stormReference returns variant v's window at the retry storm's load
// without retries, and where it comes from: the sweep's window at that
// load when the run has one, else the retry storm's own segment without
// retries; nil when the run has neither.
func (res *Results) stormReference(v string) (*Window, string) {
	if w := res.run("sweep", v).window(loadName(stormLoad)); w != nil {
		return w, "the sweep's " + loadName(stormLoad)
	}
	if w := res.run(retryStorm, v).window(stormBaseline); w != nil {
		return w, "the retry storm's own segment without retries, for want of a sweep at " + loadName(stormLoad)
	}
	return nil, ""
}

// StormReference says what the retry storm's target compares E's calls
// served OK with.
func (res *Results) StormReference() string {
	ref, from := res.stormReference(targetVariant)
	if ref == nil {
		return ""
	}
	return fmt.Sprintf("%.0f/s (%s)", ref.OKRate, from)
}

// ahead returns in how many of the comparisons of goodput E is ahead of
// every peer the results hold, and the comparisons made.
func (res *Results) ahead() (ahead, n int) {
	window := func(name string) func(r *Run) *Window { return func(r *Run) *Window { return r.window(name) } }
	type comparison struct {
		scenario string
		window   func(r *Run) *Window
	}
	var cs []comparison
	for _, l := range overloadLoads {
		cs = append(cs, comparison{"sweep", window(loadName(l))})
	}
	for _, sc := range []string{"step", "capchange", "burst"} {
		cs = append(cs, comparison{sc, window("all")})
	}
	cs = append(cs, comparison{neighbourOverload, window("overload")})
	for _, c := range cs {
		e := c.window(res.run(c.scenario, targetVariant))
		if e == nil {
			continue
		}
		beat, compared := true, false
		for _, p := range peers {
			if w := c.window(res.run(c.scenario, p)); w != nil {
				compared = true
				beat = beat && e.Goodput > w.Goodput
			}
		}
		if compared {
			n++
			if beat {
				ahead++
			}
		}
	}
	return ahead, n
}

// Neighbour is what the neighbour scenarios' neighbour did, from the first
// run that had one.
func (res *Results) Neighbour() *NeighbourStat {
	for _, r := range res.Runs {
		if r.Neighbour != nil {
			return r.Neighbour
		}
	}
	return nil
}

// perSecond averages the server's CPU (CPUs), handlers entered and
// rejections per second over the run's whole seconds within [from, to).
func (r *Run) perSecond(from, to float64) (cpu, handled, rejected float64, ok bool) {
	n := 0
	for _, s := range r.Seconds {
		if float64(s.T) < from || float64(s.T+1) > to || s.CPU <= 0 {
			continue
		}
		cpu += s.CPU
		handled += s.Handled
		rejected += float64(s.Rejected)
		n++
	}
	if n == 0 {
		return 0, 0, 0, false
	}
	return cpu / float64(n), handled / float64(n), rejected / float64(n), true
}

// rejectionCost estimates a rejection's CPU from the sweep: the CPU per
// handler at 0.5× (no rejections), and what is left of the CPU at 4× once
// the handlers have been paid for, per rejection.
func (res *Results) rejectionCost(v string) (Fit, bool) {
	r := res.run("sweep", v)
	lo, hi := r.window(loadName(0.5)), r.window(loadName(4))
	if lo == nil || hi == nil {
		return Fit{}, false
	}
	c0, h0, _, ok0 := r.perSecond(lo.From, lo.To)
	c1, h1, rej1, ok1 := r.perSecond(hi.From, hi.To)
	if !ok0 || !ok1 || h0 <= 0 || rej1 < 1 {
		return Fit{}, false
	}
	a := c0 / h0
	b := (c1 - a*h1) / rej1
	return Fit{PerServedMs: a * 1e3, PerRejectedUs: b * 1e6, Ratio: b / a}, true
}
