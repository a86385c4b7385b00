package main

import (
	"github.com/floodgate-go/floodgate/bench/internal/fair"
	"math"
	"slices"
	"time"
)

// Second is one second of a run's timeline, calls counted by start time.
type Second struct {
	T         int     `json:"t"`
	Offered   float64 `json:"offered"` // the scenario's offered rate, calls/s
	Sent      int     `json:"sent"`
	OK        int     `json:"ok"`
	Good      int     `json:"good"` // OK within the SLO
	Rejected  int     `json:"rejected"`
	Deadline  int     `json:"deadline"`
	Other     int     `json:"other"`
	P50       float64 `json:"p50_ms"` // accepted (OK) calls; NaN-free: -1 when none
	P99       float64 `json:"p99_ms"`
	CPU       float64 `json:"cpu"`     // server CPU seconds spent in this second
	Handled   float64 `json:"handled"` // Allocate handlers entered
	Scale     float64 `json:"scale"`   // gate scale at the end of the second
	Reading   float64 `json:"reading"` // gate's CPU reading at the end of the second
	LightSent int     `json:"light_sent"`
	LightGood int     `json:"light_good"`
	// Wire and WireRejected are, in a run whose clients retry (Run.Wire),
	// the attempts that went on the network in this second, counted by
	// their own start, and those of them the server rejected.
	Wire         int `json:"wire,omitempty"`
	WireRejected int `json:"wire_rejected,omitempty"`
}

// GatePoint is one look at the server's gate.
type GatePoint struct {
	T       float64 `json:"t"`
	Scale   float64 `json:"scale"`
	Reading float64 `json:"reading"`
	State   string  `json:"state,omitempty"`
	// Limit, Inflight and Queued are a concurrency limiter's (E's).
	Limit    float64 `json:"limit,omitempty"`
	Inflight int     `json:"inflight,omitempty"`
	Queued   int     `json:"queued,omitempty"`
	// Rate and DelayMs are E's admission rate and queueing delay.
	Rate    float64 `json:"rate,omitempty"`
	DelayMs float64 `json:"delay_ms,omitempty"`
	// TargetMs, RTTMs and BaseMs are E's queueing delay target, its last
	// interval's latency and its baseline.
	TargetMs float64 `json:"target_ms,omitempty"`
	RTTMs    float64 `json:"rtt_ms,omitempty"`
	BaseMs   float64 `json:"base_ms,omitempty"`
	// CapacityPS is E's estimate of the server's capacity, calls/s.
	CapacityPS float64 `json:"capacity,omitempty"`
	// Shed is E's count of shed calls by cause, since the server started.
	Shed []uint64 `json:"shed,omitempty"`
	// Admitted is E's count of admitted calls since the server started.
	Admitted uint64 `json:"admitted,omitempty"`
}

// Window summarises the calls that started within [From, To).
type Window struct {
	Name string  `json:"name"`
	From float64 `json:"from"`
	To   float64 `json:"to"`
	Load float64 `json:"load"` // offered load, × capacity
	// Rates, calls per second.
	Sent     float64 `json:"sent"`
	Goodput  float64 `json:"goodput"`
	OKRate   float64 `json:"ok"`
	Rejected float64 `json:"rejected"`
	Deadline float64 `json:"deadline"`
	// Latencies in ms; -1 when there is nothing to measure.
	P50    float64 `json:"p50_ms"`
	P99    float64 `json:"p99_ms"`
	P999   float64 `json:"p999_ms"`
	RejP50 float64 `json:"rej_p50_ms"`
	RejP99 float64 `json:"rej_p99_ms"`
	// LightSuccess is the light tenants' share of calls that ended OK
	// within the SLO; Jain is Jain's fairness index over the ten tenants'
	// success ratios.
	LightSuccess float64 `json:"light_success"`
	LightP99     float64 `json:"light_p99_ms"` // the light tenants' accepted calls
	HeavySuccess float64 `json:"heavy_success"`
	Jain         float64 `json:"jain"`
	// TenantSent and TenantGood are each tenant's calls sent and goodput,
	// calls/s; FairJain is Jain's index over the tenants' shares of their
	// max-min fair share of the capacity (see fairShares).
	TenantSent []float64 `json:"tenant_sent,omitempty"`
	TenantGood []float64 `json:"tenant_good,omitempty"`
	FairJain   float64   `json:"fair_jain"`
	// Rejections and Deadlines are counts of calls, not rates.
	Rejections int `json:"rejections"`
	Deadlines  int `json:"deadlines"`
	// Reversals counts the reversals of the admission control's direction
	// within the window (see Run.Reversals).
	Reversals  int     `json:"reversals"`
	HealthOK   int     `json:"health_ok"`
	HealthSent int     `json:"health_sent"`
	MeanScale  float64 `json:"mean_scale"`
	ServerCPU  float64 `json:"server_cpu"` // CPUs the server used on average
	// In a run whose clients retry (Run.Wire), Sent and the other rates
	// above count calls, each once however many attempts it made, and
	// its latency runs from its first attempt to the end of its last.
	// Wire and WireRejected are then the attempts that went on the network
	// and those the server rejected, per second, Dropped the calls that
	// ended dropped on the client by its throttle, per second, and WireP99
	// the p99 of the attempts that ended OK, in ms (-1 when none did).
	Wire         float64 `json:"wire,omitempty"`
	WireRejected float64 `json:"wire_rejected,omitempty"`
	Dropped      float64 `json:"dropped,omitempty"`
	WireP99      float64 `json:"wire_p99_ms,omitempty"`
}

// Run is one scenario against one variant, analysed.
type Run struct {
	Scenario string      `json:"scenario"`
	Variant  string      `json:"variant"`
	Ready    serverReady `json:"server,omitzero"`
	Seconds  []Second    `json:"seconds,omitempty"`
	Gate     []GatePoint `json:"gate,omitempty"`
	Windows  []Window    `json:"windows"`
	// Calls is the calls sent over the run, which the summary computes
	// from the seconds.
	Calls int `json:"calls,omitempty"`
	// Reversals is the admission control's reversals of direction per
	// minute over the run: of the gate's scale for C and D (every change
	// of direction), of the concurrency limit for E (a change of direction
	// by at least limitHysteresis of the limit; see limitReversals).
	Reversals float64 `json:"reversals_per_min"`
	// Neighbour is what the scenario's CPU-burning neighbour did, if it
	// had one.
	Neighbour *NeighbourStat `json:"neighbour,omitempty"`
	// Wire tells that the run's clients retried (the retry storm), and
	// counted their attempts on the network: see Window.Wire.
	Wire bool `json:"wire,omitempty"`
	// CapS is, in the capacity change, the time from the change to the
	// start of the first capSustain seconds whose goodput each reached
	// capTarget of the new capacity; -1 when that never happened.
	CapS float64 `json:"cap_s,omitempty"`
	// ShedS and RecoverS are the step scenario's time to shed and to
	// recover, in seconds; -1 when it did not happen within the segment.
	ShedS    float64 `json:"shed_s,omitempty"`
	RecoverS float64 `json:"recover_s,omitempty"`
}

// window returns the window of the run's calls in [from, to).
func (raw *rawRun) window(name string, from, to time.Duration, load float64, slo time.Duration) Window {
	w := Window{Name: name, From: from.Seconds(), To: to.Seconds(), Load: load}
	secs := (to - from).Seconds()
	if secs <= 0 {
		return w
	}
	var okLat, rejLat, lightLat []time.Duration
	var sent, good [numTenants]int
	var n, nok, ngood, nrej, ndl, ndrop int
	for _, c := range raw.Calls {
		if c.At < from || c.At >= to {
			continue
		}
		n++
		sent[c.Tenant]++
		if c.Dropped {
			ndrop++
		}
		switch c.Out {
		case outOK:
			nok++
			okLat = append(okLat, c.Lat)
			if int(c.Tenant) != heavyTenant {
				lightLat = append(lightLat, c.Lat)
			}
			if c.Lat <= slo {
				ngood++
				good[c.Tenant]++
			}
		case outRejected:
			nrej++
			rejLat = append(rejLat, c.Lat)
		case outDeadline:
			ndl++
		}
	}
	slices.Sort(okLat)
	slices.Sort(rejLat)
	slices.Sort(lightLat)
	w.LightP99 = ms(lightLat, 0.99)
	w.Sent, w.OKRate, w.Goodput = float64(n)/secs, float64(nok)/secs, float64(ngood)/secs
	w.Rejected, w.Deadline = float64(nrej)/secs, float64(ndl)/secs
	if raw.Wire {
		var nw, nwrej int
		var wireLat []time.Duration
		for _, a := range raw.Attempts {
			if a.At < from || a.At >= to {
				continue
			}
			nw++
			switch a.Out {
			case outRejected:
				nwrej++
			case outOK:
				wireLat = append(wireLat, a.Lat)
			}
		}
		slices.Sort(wireLat)
		w.Wire, w.WireRejected, w.Dropped = float64(nw)/secs, float64(nwrej)/secs, float64(ndrop)/secs
		w.WireP99 = ms(wireLat, 0.99)
	}
	w.P50, w.P99, w.P999 = ms(okLat, 0.5), ms(okLat, 0.99), ms(okLat, 0.999)
	w.RejP50, w.RejP99 = ms(rejLat, 0.5), ms(rejLat, 0.99)
	var ls, lg int
	var ratios []float64
	for i := range numTenants {
		if i != heavyTenant {
			ls += sent[i]
			lg += good[i]
		}
		if sent[i] > 0 {
			ratios = append(ratios, float64(good[i])/float64(sent[i]))
		}
	}
	w.LightSuccess = ratio(lg, ls)
	w.HeavySuccess = ratio(good[heavyTenant], sent[heavyTenant])
	w.Jain = jain(ratios)
	w.Rejections, w.Deadlines = nrej, ndl
	w.TenantSent, w.TenantGood = make([]float64, numTenants), make([]float64, numTenants)
	for i := range numTenants {
		w.TenantSent[i], w.TenantGood[i] = float64(sent[i])/secs, float64(good[i])/secs
	}
	w.FairJain = -1
	for _, p := range raw.Probes {
		if p.At >= from && p.At < to {
			w.HealthSent++
			if p.OK {
				w.HealthOK++
			}
		}
	}
	var sum float64
	var k int
	var cpu0, cpu1 int64
	var t0, t1 time.Duration
	for _, p := range raw.Polls {
		if p.At >= from && p.At < to {
			sum += p.Scale
			k++
			if cpu0 == 0 {
				cpu0, t0 = p.CPUNs, p.At
			}
			cpu1, t1 = p.CPUNs, p.At
		}
	}
	w.MeanScale = -1
	if k > 0 {
		w.MeanScale = sum / float64(k)
	}
	if t1 > t0 {
		w.ServerCPU = float64(cpu1-cpu0) / float64(t1-t0)
	}
	return w
}

func ms(sorted []time.Duration, q float64) float64 {
	v := percentile(sorted, q)
	if math.IsNaN(v) {
		return -1
	}
	return v
}

func ratio(a, b int) float64 {
	if b == 0 {
		return -1
	}
	return float64(a) / float64(b)
}

// jain is Jain's fairness index of xs: 1 when all are equal, 1/n when one
// has everything.
func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return -1
	}
	return s * s / (float64(len(xs)) * s2)
}

// analyse turns a scenario's raw record into a Run.
func analyse(raw *rawRun, sc Scenario, variant string, ready serverReady, capacity float64, slo time.Duration) Run {
	run := Run{Scenario: sc.Name, Variant: variant, Ready: ready, Wire: raw.Wire}
	total := sc.Duration()
	nsec := int(math.Ceil(total.Seconds()))
	secs := make([]Second, nsec)
	lat := make([][]time.Duration, nsec)
	for i := range secs {
		secs[i].T = i
		seg := sc.segmentAt(time.Duration(i)*time.Second + time.Second/2)
		if seg >= 0 {
			s := sc.Segments[seg]
			for t := range numTenants {
				secs[i].Offered += s.rate(t, capacity)
			}
		}
	}
	for _, c := range raw.Calls {
		i := int(c.At / time.Second)
		if i < 0 || i >= nsec {
			continue
		}
		s := &secs[i]
		s.Sent++
		light := int(c.Tenant) != heavyTenant
		if light {
			s.LightSent++
		}
		switch c.Out {
		case outOK:
			s.OK++
			lat[i] = append(lat[i], c.Lat)
			if c.Lat <= slo {
				s.Good++
				if light {
					s.LightGood++
				}
			}
		case outRejected:
			s.Rejected++
		case outDeadline:
			s.Deadline++
		default:
			s.Other++
		}
	}
	for _, a := range raw.Attempts {
		i := int(a.At / time.Second)
		if i < 0 || i >= nsec {
			continue
		}
		secs[i].Wire++
		if a.Out == outRejected {
			secs[i].WireRejected++
		}
	}
	for i := range secs {
		slices.Sort(lat[i])
		secs[i].P50, secs[i].P99 = ms(lat[i], 0.5), ms(lat[i], 0.99)
	}
	// Server counters per second: the difference between the last polls at
	// or before each second's end.
	var prev *pollRec
	if len(raw.Polls) > 0 {
		prev = &raw.Polls[0]
	}
	j := 0
	for i := range secs {
		end := time.Duration(i+1) * time.Second
		var last *pollRec
		for j < len(raw.Polls) && raw.Polls[j].At <= end {
			last = &raw.Polls[j]
			j++
		}
		if last == nil || prev == nil {
			secs[i].Scale, secs[i].Reading = -1, -1
			if prev != nil {
				secs[i].Scale, secs[i].Reading = prev.Scale, prev.Reading
			}
			continue
		}
		dt := (last.At - prev.At).Seconds()
		if dt > 0 {
			secs[i].CPU = float64(last.CPUNs-prev.CPUNs) / 1e9 / dt
			secs[i].Handled = float64(last.Handled-prev.Handled) / dt
		}
		secs[i].Scale, secs[i].Reading = last.Scale, last.Reading
		prev = last
	}
	run.Seconds = secs
	for _, p := range raw.Polls {
		run.Gate = append(run.Gate, GatePoint{T: p.At.Seconds(), Scale: p.Scale, Reading: p.Reading, State: p.State,
			Limit: p.Limit, Inflight: p.Inflight, Queued: p.Queued, Rate: p.Rate, DelayMs: p.DelayMs,
			TargetMs: p.TargetMs, RTTMs: p.RTTMs, BaseMs: p.BaseMs, CapacityPS: p.CapacityPS, Shed: p.Shed, Admitted: p.Admitted})
	}
	run.Reversals = float64(directionReversals(variant, run.Gate, 0, total.Seconds())) / total.Minutes()

	for i, s := range sc.Segments {
		if !s.Measure {
			continue
		}
		from := sc.segmentStart(i)
		run.Windows = append(run.Windows, raw.window(s.Name, from+s.Skip, from+s.Dur, s.Load, slo))
	}
	// The capacity change's settled window: from Settle after the change
	// to the end.
	change := slices.IndexFunc(sc.Segments, func(s Segment) bool { return s.CostX > 1 })
	if sc.Settle > 0 && change >= 0 {
		at := sc.segmentStart(change)
		if at+sc.Settle < total {
			run.Windows = append(run.Windows, raw.window(settledWindow, at+sc.Settle, total, sc.Segments[change].Load, slo))
		}
		newCap := capacity / sc.Segments[change].CostX
		run.CapS = reachTime(secs[int(at/time.Second):], newCap*capTarget, capSustain)
	}
	run.Windows = append(run.Windows, raw.window("all", 0, total, -1, slo))
	for i := range run.Windows {
		w := &run.Windows[i]
		w.Reversals = directionReversals(variant, run.Gate, w.From, w.To)
		w.FairJain = fairJain(capacity, w.TenantSent, w.TenantGood)
	}
	if sc.Name == "step" && len(sc.Segments) == 3 {
		up, down := sc.segmentStart(1), sc.segmentStart(2)
		run.ShedS = raw.timeToShed(up, down, slo)
		run.RecoverS = raw.timeToRecover(down, total, slo)
	}
	return run
}

// settledWindow names the capacity change's window from Settle after the
// change to the end.
const settledWindow = "settled"

// The capacity change's convergence: goodput at capTarget of the new
// capacity for capSustain whole seconds in a row.
const (
	capTarget  = 0.90
	capSustain = 3
)

// reachTime returns the offset, in seconds, of the first of n consecutive
// seconds whose goodput each reached target; -1 when none. secs[0] starts
// at offset 0.
func reachTime(secs []Second, target float64, n int) float64 {
	run := 0
	for i, s := range secs {
		if float64(s.Good) >= target {
			run++
			if run == n {
				return float64(i - n + 1)
			}
		} else {
			run = 0
		}
	}
	return -1
}

// limitHysteresis is how far, as a fraction of its last peak or trough, a
// concurrency limit must move back before its change of direction counts
// as a reversal. A gradient limit moves by a little at every control
// interval around its operating point; reversals are meant to count the
// swings an operator would see on a dashboard, not that ripple.
const limitHysteresis = 0.25

// directionReversals counts the reversals of variant's admission control
// within [from, to) seconds: of E's concurrency limit, with hysteresis
// limitHysteresis, or of the gate's scale, every one.
func directionReversals(variant string, g []GatePoint, from, to float64) int {
	var xs []float64
	rated := false
	for _, p := range g {
		rated = rated || (p.T >= from && p.T < to && p.Rate > 0)
	}
	hyst := 0.0
	for _, p := range g {
		if p.T < from || p.T >= to {
			continue
		}
		if variant == "E" {
			// The rate where the window has one, else the limit: the two
			// are not on one scale.
			switch {
			case rated && p.Rate > 0:
				xs = append(xs, p.Rate)
			case !rated && p.Limit > 0:
				xs = append(xs, p.Limit)
			default:
				continue
			}
			hyst = limitHysteresis
		} else {
			xs = append(xs, p.Scale)
		}
	}
	return swings(xs, hyst)
}

// swings counts the changes of direction of xs, each counted once xs has
// moved back from its last peak (or trough) by at least hyst × that peak
// (trough); with hyst 0, every change of direction.
func swings(xs []float64, hyst float64) int {
	if len(xs) == 0 {
		return 0
	}
	const eps = 1e-9
	n, dir := 0, 0
	lo, hi := xs[0], xs[0] // the trough and the peak of the current move
	for _, x := range xs[1:] {
		switch {
		case dir >= 0 && x < hi*(1-hyst)-eps: // turning (or setting off) down
			if dir > 0 {
				n++
			}
			dir, lo = -1, x
		case dir <= 0 && x > lo*(1+hyst)+eps: // turning (or setting off) up
			if dir < 0 {
				n++
			}
			dir, hi = 1, x
		default:
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	return n
}

// fairJain is Jain's index over the tenants' goodput as shares of their
// max-min fair share of capacity given their demand (what they sent),
// each capped at 1: 1 when every tenant got its fair share. Tenants that
// sent nothing are left out; -1 when there is nothing to compute.
func fairJain(capacity float64, sent, good []float64) float64 {
	if len(sent) == 0 || len(sent) != len(good) || capacity <= 0 {
		return -1
	}
	fairShares := fair.MaxMin(capacity, sent)
	var xs []float64
	for i, f := range fairShares {
		if f > 0 {
			xs = append(xs, min(good[i]/f, 1))
		}
	}
	if len(xs) == 0 {
		return -1
	}
	return jain(xs)
}

// bucket is how finely the step scenario's times are resolved.
const bucket = 250 * time.Millisecond

// bucketStats counts the calls started in [from, from+bucket).
type bucketStats struct {
	sent, good, rej, dl int
	okLat               []time.Duration
}

func (raw *rawRun) buckets(from, to time.Duration) []bucketStats {
	n := int((to - from) / bucket)
	bs := make([]bucketStats, n)
	for _, c := range raw.Calls {
		if c.At < from || c.At >= to {
			continue
		}
		i := int((c.At - from) / bucket)
		if i >= n {
			continue
		}
		b := &bs[i]
		b.sent++
		switch c.Out {
		case outOK:
			b.okLat = append(b.okLat, c.Lat)
		case outRejected:
			b.rej++
		case outDeadline:
			b.dl++
		}
	}
	return bs
}

// timeToShed is the time from the step up (at from) to the start of the
// first second in which the server sheds cleanly: in each of its four
// quarter-second buckets, no call exceeded its deadline and the accepted
// calls' p99 is within the SLO. -1 when that never happens before to.
func (raw *rawRun) timeToShed(from, to time.Duration, slo time.Duration) float64 {
	bs := raw.buckets(from, to)
	clean := func(b bucketStats) bool {
		slices.Sort(b.okLat)
		p99 := percentile(b.okLat, 0.99)
		return b.sent > 0 && b.dl == 0 && (math.IsNaN(p99) || p99 <= float64(slo)/float64(time.Millisecond))
	}
	return firstSustained(bs, 4, clean)
}

// timeToRecover is the time from the step down (at from) to the start of
// the first two seconds in which at least 99% of the calls of every
// quarter-second succeed within the SLO. -1 when that never happens.
func (raw *rawRun) timeToRecover(from, to time.Duration, slo time.Duration) float64 {
	bs := raw.buckets(from, to)
	ok := func(b bucketStats) bool {
		good := 0
		for _, l := range b.okLat {
			if l <= slo {
				good++
			}
		}
		return b.sent == 0 || float64(good) >= 0.99*float64(b.sent)
	}
	return firstSustained(bs, 8, ok)
}

// firstSustained returns the offset, in seconds, of the first bucket from
// which n consecutive buckets satisfy ok; -1 when none.
func firstSustained(bs []bucketStats, n int, ok func(bucketStats) bool) float64 {
	run := 0
	for i, b := range bs {
		if ok(b) {
			run++
			if run == n {
				return (time.Duration(i-n+1) * bucket).Seconds()
			}
		} else {
			run = 0
		}
	}
	return -1
}

// Fit is a least-squares fit of the server's CPU per second against what
// it did in that second: CPU = PerServed × handled + PerRejected × rejected
// + Idle.
type Fit struct {
	PerServedMs   float64 `json:"per_served_ms"`
	PerRejectedUs float64 `json:"per_rejected_us"`
	IdleCPU       float64 `json:"idle_cpu"`
	Ratio         float64 `json:"ratio"` // PerRejected / PerServed
	N             int     `json:"n"`     // seconds fitted
}

// fitCPU fits the seconds of runs (skipping each run's first second, which
// holds the server's warm-up). The rejections are the server's: where
// clients retried, those on the wire, not the calls that ended rejected.
func fitCPU(runs []Run) Fit {
	// Normal equations for y = a x1 + b x2 + c.
	var m [3][4]float64
	n := 0
	for _, r := range runs {
		for i, s := range r.Seconds {
			if i == 0 || s.CPU <= 0 {
				continue
			}
			rej := s.Rejected
			if r.Wire {
				rej = s.WireRejected
			}
			x := [3]float64{s.Handled, float64(rej), 1}
			for a := range 3 {
				for b := range 3 {
					m[a][b] += x[a] * x[b]
				}
				m[a][3] += x[a] * s.CPU
			}
			n++
		}
	}
	sol, ok := solve3(m)
	if !ok || n < 5 {
		return Fit{N: n, Ratio: -1}
	}
	f := Fit{PerServedMs: sol[0] * 1e3, PerRejectedUs: sol[1] * 1e6, IdleCPU: sol[2], N: n, Ratio: -1}
	if sol[0] > 0 {
		f.Ratio = sol[1] / sol[0]
	}
	return f
}

// solve3 solves a 3×3 system in augmented form by Gaussian elimination.
func solve3(m [3][4]float64) ([3]float64, bool) {
	for c := range 3 {
		p := c
		for r := c + 1; r < 3; r++ {
			if math.Abs(m[r][c]) > math.Abs(m[p][c]) {
				p = r
			}
		}
		if math.Abs(m[p][c]) < 1e-12 {
			return [3]float64{}, false
		}
		m[c], m[p] = m[p], m[c]
		for r := range 3 {
			if r == c {
				continue
			}
			f := m[r][c] / m[c][c]
			for k := c; k < 4; k++ {
				m[r][k] -= f * m[c][k]
			}
		}
	}
	return [3]float64{m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]}, true
}
