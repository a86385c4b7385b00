package main

import (
	"fmt"
	"math"
	"time"
)

// The band floodgate's fleet is held to, as a share of limit × window.
const (
	bandLow  = 0.95
	bandHigh = 1.03
)

// Window is one aligned 10 s window of a run.
type Window struct {
	From float64 `json:"from_s"`
	// Fleet is what the fleet admitted ÷ (limit × 10 s).
	Fleet float64 `json:"fleet"`
	// Envoys is, per Envoy, what it admitted ÷ (its max-min fair share of
	// the limit × 10 s); EnvoyMin and EnvoyMax are their extremes.
	Envoys   []float64 `json:"envoys"`
	EnvoyMin float64   `json:"envoy_min"`
	EnvoyMax float64   `json:"envoy_max"`
	// RPCs is RPC messages per request: reports and responses for RLQS,
	// one call a request for RLS.
	RPCs    float64 `json:"rpcs_per_request"`
	Offered int     `json:"offered"`
}

// Result is one run's summary.
type Result struct {
	Variant  string    `json:"variant"`
	Scenario string    `json:"scenario"`
	Interval float64   `json:"interval_s"` // Envoy's report interval; 0 for rls
	Envoys   int       `json:"envoys"`
	Seconds  float64   `json:"seconds"`
	EventAt  float64   `json:"event_at_s,omitempty"`
	Demands  []float64 `json:"demands"` // per Envoy at the start, a second
	Windows  []Window  `json:"windows"`
	// Warm is when the first two reports are in: 2 intervals (1 s for rls).
	// The figures below are over the windows from the first aligned one
	// starting at or after it.
	Warm float64 `json:"warm_s"`
	// FleetMin and FleetMax bound the aligned windows' Fleet.
	FleetMin float64 `json:"fleet_min"`
	FleetMax float64 `json:"fleet_max"`
	// SlidingMin and SlidingMax bound the fleet's admissions in every 10 s
	// window starting from Warm, at 10 ms steps, ÷ (limit × 10 s).
	SlidingMin float64 `json:"sliding_min"`
	SlidingMax float64 `json:"sliding_max"`
	// Back is how long after the event every later sliding 10 s window is
	// within the band; −1 if never, 0 without an event.
	Back     float64 `json:"back_s"`
	EnvoyMin float64 `json:"envoy_min"`
	EnvoyMax float64 `json:"envoy_max"`
	RPCs     float64 `json:"rpcs_per_request"`
}

// summarize turns a run's trace into its Result.
func summarize(r run, demands []float64, tr *trace) *Result {
	res := &Result{Variant: r.variant, Scenario: r.scenario, Interval: r.interval.Seconds(), Envoys: r.envoys,
		Seconds: r.duration.Seconds(), Demands: round(demands, 1),
		FleetMin: math.Inf(1), FleetMax: math.Inf(-1), EnvoyMin: math.Inf(1), EnvoyMax: math.Inf(-1)}
	if r.scenario != sSteady {
		res.EventAt = r.eventAt.Seconds()
	}
	warm := 2 * r.interval
	if r.variant == vRLS {
		warm = time.Second
	}
	res.Warm = warm.Seconds()
	per := float64(limit) * window.Seconds()
	rpcs, offered := 0, 0
	for w := range tr.offered {
		win := Window{From: float64(w) * window.Seconds(), Offered: tr.offered[w], EnvoyMin: math.Inf(1), EnvoyMax: math.Inf(-1)}
		n := 0
		for i := range r.envoys {
			n += tr.envAdmitted[w][i]
			v := float64(tr.envAdmitted[w][i]) / (tr.fair[w][i] * window.Seconds())
			win.Envoys = append(win.Envoys, round3(v))
			win.EnvoyMin, win.EnvoyMax = min(win.EnvoyMin, v), max(win.EnvoyMax, v)
		}
		win.Fleet = float64(n) / per
		win.RPCs = float64(tr.rpcs[w]) / float64(tr.offered[w])
		if time.Duration(w)*window >= warm {
			res.FleetMin, res.FleetMax = min(res.FleetMin, win.Fleet), max(res.FleetMax, win.Fleet)
			res.EnvoyMin, res.EnvoyMax = min(res.EnvoyMin, win.EnvoyMin), max(res.EnvoyMax, win.EnvoyMax)
			rpcs += tr.rpcs[w]
			offered += tr.offered[w]
		}
		win.Fleet, win.EnvoyMin, win.EnvoyMax, win.RPCs = round3(win.Fleet), round3(win.EnvoyMin), round3(win.EnvoyMax), round3(win.RPCs)
		res.Windows = append(res.Windows, win)
	}
	res.RPCs = round3(float64(rpcs) / float64(offered))

	// Sliding windows, by prefix sums over the steps.
	sum := make([]int, len(tr.admitted))
	for k := 1; k < len(sum); k++ {
		sum[k] = sum[k-1] + tr.admitted[k]
	}
	span := int(window / step)
	first := int(warm / step)
	res.SlidingMin, res.SlidingMax = math.Inf(1), math.Inf(-1)
	event := int(r.eventAt / step)
	lastOut := -1 // the last start, at or after the event, out of the band
	for from := first; from+span < len(sum); from++ {
		v := float64(sum[from+span]-sum[from]) / per
		res.SlidingMin, res.SlidingMax = min(res.SlidingMin, v), max(res.SlidingMax, v)
		if from >= event && (v < bandLow || v > bandHigh) {
			lastOut = from
		}
	}
	switch {
	case r.scenario == sSteady:
	case lastOut < 0:
		res.Back = 0
	case lastOut+1+span >= len(sum):
		res.Back = -1
	default:
		res.Back = (time.Duration(lastOut+1-event) * step).Seconds()
	}
	res.FleetMin, res.FleetMax = round3(res.FleetMin), round3(res.FleetMax)
	res.SlidingMin, res.SlidingMax = round3(res.SlidingMin), round3(res.SlidingMax)
	res.EnvoyMin, res.EnvoyMax = round3(res.EnvoyMin), round3(res.EnvoyMax)
	return res
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

func round(vs []float64, places int) []float64 {
	p := math.Pow(10, float64(places))
	out := make([]float64, len(vs))
	for i, v := range vs {
		out[i] = math.Round(v*p) / p
	}
	return out
}

// Check is one target, evaluated.
type Check struct {
	Target string `json:"target"`
	Value  string `json:"value"`
	OK     bool   `json:"ok"`
}

// Mark is ✓ or ✗.
func (c Check) Mark() string {
	if c.OK {
		return "✓"
	}
	return "✗"
}

// checks evaluates issue 45's targets on the results it finds.
func checks(rs []*Result, envoys int, demand float64) []Check {
	var out []Check
	find := func(v, s string, iv float64) *Result {
		for _, r := range rs {
			if r.Variant == v && r.Scenario == s && (v == vRLS || r.Interval == iv) {
				return r
			}
		}
		return nil
	}
	intervals := []float64{}
	for _, r := range rs {
		if r.Variant != vRLS && !containsFloat(intervals, r.Interval) {
			intervals = append(intervals, r.Interval)
		}
	}
	band := func(r *Result) bool { return r.FleetMin >= bandLow && r.FleetMax <= bandHigh }
	for _, iv := range intervals {
		for _, v := range []string{vFloodgate, vReplicas} {
			name := map[string]string{vFloodgate: "floodgate", vReplicas: "floodgate, 3 replicas on Redis,"}[v]
			if r := find(v, sSteady, iv); r != nil {
				out = append(out, Check{fmt.Sprintf("%s %g s reports, steady: every 10 s window after the first two reports within %.2f–%.2f × the limit", name, iv, bandLow, bandHigh),
					fmt.Sprintf("%.3f–%.3f (sliding %.3f–%.3f)", r.FleetMin, r.FleetMax, r.SlidingMin, r.SlidingMax), band(r)})
			}
			if r := find(v, sShift, iv); r != nil {
				out = append(out, Check{fmt.Sprintf("%s %g s reports, demand shift: back in band within two report intervals (%g s)", name, iv, 2*iv),
					backText(r), r.Back >= 0 && r.Back <= 2*iv})
			}
			for _, sc := range []string{sRestart, sCrash} {
				if r := find(v, sc, iv); r != nil {
					out = append(out, Check{fmt.Sprintf("%s %g s reports, %s: no 10 s window over %.2f × the limit", name, iv, sc, bandHigh),
						fmt.Sprintf("at most %.3f; %s", r.SlidingMax, backText(r)), r.SlidingMax <= bandHigh})
				}
			}
		}
		if r := find(vStatic, sSteady, iv); r != nil {
			// Every Envoy holds the whole limit: the fleet's limit is N ×
			// it, so with 2× asked it admits all of it.
			want := min(demand, float64(envoys))
			out = append(out, Check{fmt.Sprintf("static split, %g s reports: admits min(demand, N × limit) = %.1f × the limit, not the limit", iv, want),
				fmt.Sprintf("%.3f–%.3f", r.FleetMin, r.FleetMax), r.FleetMin >= 0.95*want})
		}
		if r := find(vEven, sSteady, iv); r != nil {
			out = append(out, Check{fmt.Sprintf("even split, %g s reports: under-uses the limit under skew (< %.2f)", iv, bandLow),
				fmt.Sprintf("%.3f–%.3f", r.FleetMin, r.FleetMax), r.FleetMax < bandLow})
		}
	}
	if r := find(vRLS, sSteady, 0); r != nil {
		out = append(out, Check{"RLS v3, a call a request (reference): every 10 s window within the band, 1 RPC a request",
			fmt.Sprintf("%.3f–%.3f, %.2f RPC a request", r.FleetMin, r.FleetMax, r.RPCs), band(r) && r.RPCs == 1})
	}
	return out
}

func backText(r *Result) string {
	if r.Back < 0 {
		return "never back in band"
	}
	return fmt.Sprintf("back in band %.2f s after", r.Back)
}

func containsFloat(vs []float64, v float64) bool {
	for _, x := range vs {
		if x == v {
			return true
		}
	}
	return false
}

// Cell is one operating point of the sweep: what the fleet admitted in
// each aligned 10 s window after the first two reports, ÷ what it could
// admit, min(what it asked, the limit).
type Cell struct {
	Variant  string  `json:"variant"`
	Envoys   int     `json:"envoys"`
	Demand   float64 `json:"demand"`
	Interval float64 `json:"interval_s"`
	Min      float64 `json:"min"`
	Max      float64 `json:"max"`
}

func cell(r *Result) *Cell {
	c := &Cell{Variant: r.Variant, Envoys: r.Envoys, Demand: r.Demands[0], Interval: r.Interval, Min: math.Inf(1), Max: math.Inf(-1)}
	total := 0.0
	for _, d := range r.Demands {
		total += d
	}
	c.Demand = math.Round(total/limit*10) / 10
	per := float64(limit) * window.Seconds()
	for _, w := range r.Windows {
		if w.From < r.Warm {
			continue
		}
		v := w.Fleet * per / min(float64(w.Offered), per)
		c.Min, c.Max = min(c.Min, v), max(c.Max, v)
	}
	c.Min, c.Max = round3(c.Min), round3(c.Max)
	return c
}

// sweepCheck holds every cell of the sweep to the band.
func sweepCheck(cs []*Cell) Check {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range cs {
		lo, hi = min(lo, c.Min), max(hi, c.Max)
	}
	return Check{fmt.Sprintf("floodgate and its replicas across %d operating points (steady; fleet size, demand, interval): every 10 s window after the first two reports within %.2f–%.2f × min(asked, limit)", len(cs), bandLow, bandHigh),
		fmt.Sprintf("%.3f–%.3f", lo, hi), lo >= bandLow && hi <= bandHigh}
}
