package overload

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// ErrInvalidConfig is wrapped by every configuration error; the message
// names the offending field or option.
var ErrInvalidConfig = errors.New("overload: invalid config")

func invalid(field string, v any, want string) error {
	return fmt.Errorf("%w: %s = %v, want %s", ErrInvalidConfig, field, v, want)
}

// Law is the control law: how the concurrency limit follows the latency of
// the calls it admits. It is a plain struct whose zero value is the default
// configuration; a zero field takes the default given in its comment. [New]
// validates it (WithLaw) and rejects out-of-range fields with an error
// naming the field, never clamping them.
//
// The law is a latency gradient against a measured baseline, as in Envoy's
// adaptive concurrency filter and Netflix's Gradient2:
//
//   - The baseline is the time a call takes when it does not queue. The
//     controller measures it in a probe: it lets in at most a quarter of its
//     limit (at least one) until ProbeSamples calls admitted during the
//     probe have completed, and takes their mean. It probes when it starts,
//     every ProbeEvery (±10%), and whenever a cut did not bring the latency
//     down: a server slowed by a noisy neighbour or a slow dependency is
//     re-measured, not ratcheted to its floor.
//   - Each Interval in which the limit was binding (a call waited for a
//     slot or was shed), the limit becomes limit × g + √limit, where
//     g = Tolerance × baseline / rtt, kept within [0.5, 1], and rtt is the
//     mean latency of the calls completed in the interval. Where rtt stays
//     within Tolerance × baseline the limit grows by √limit; where calls
//     queue in the server it shrinks towards what completes without
//     queueing. An Interval in which the limit did not bind changes
//     nothing: a server below its limit teaches nothing about it.
//   - With an Objective, an rtt above it cuts by Objective / rtt as well.
//
// Step is a pure function of ([Control], [Sample], time), so a trace of
// samples replays to the same decisions, and tests need no clock.
type Law struct {
	// InitialLimit is the concurrency limit before the first sample.
	// Default 16.
	InitialLimit int
	// MinLimit is the lowest limit outside probes. Default 2.
	MinLimit int
	// MaxLimit is the highest limit. Default 1000.
	MaxLimit int
	// Tolerance is how much slower than the baseline the mean call may be
	// before the limit is cut, > 1. Default 2: a server whose calls take
	// twice as long as alone is already queueing a call behind each one it
	// runs, enough to keep it busy between arrivals.
	Tolerance float64
	// Objective, when positive, is a latency objective: an interval whose
	// mean latency exceeds it cuts the limit by Objective / rtt, whatever
	// the baseline says. Default 0, off.
	Objective time.Duration
	// Interval is the least time between two limit updates; an update also
	// waits for MinSamples completions, up to 10 × Interval. Default 100 ms.
	Interval time.Duration
	// MinSamples is the fewest completions an update is made from.
	// Default 8.
	MinSamples int
	// ProbeEvery is the time between baseline probes. Default 30 s.
	ProbeEvery time.Duration
	// ProbeSamples is how many calls admitted during a probe must
	// complete to end it. Default 16. A probe also ends after
	// 10 × Interval, with whatever completed.
	ProbeSamples int
	// GuardCPU, when positive, is a CPU fraction (from the controller's
	// guard, [WithGuard]) at or above which an interval in which the limit
	// was binding cuts the limit by half, whatever the latency says.
	// Default 0, off: the latency decides, and CPU readings only explain.
	// On a shared host the CPU a sampler reads may not be this server's.
	GuardCPU float64
}

// Defaults of the law's fields.
const (
	DefaultInitialLimit = 16
	DefaultMinLimit     = 2
	DefaultMaxLimit     = 1000
	DefaultTolerance    = 2.0
	DefaultInterval     = 100 * time.Millisecond
	DefaultMinSamples   = 8
	DefaultProbeEvery   = 30 * time.Second
	DefaultProbeSamples = 16
)

func (l Law) withDefaults() Law {
	if l.InitialLimit == 0 {
		l.InitialLimit = DefaultInitialLimit
	}
	if l.MinLimit == 0 {
		l.MinLimit = DefaultMinLimit
	}
	if l.MaxLimit == 0 {
		l.MaxLimit = DefaultMaxLimit
	}
	if l.Tolerance == 0 {
		l.Tolerance = DefaultTolerance
	}
	if l.Interval == 0 {
		l.Interval = DefaultInterval
	}
	if l.MinSamples == 0 {
		l.MinSamples = DefaultMinSamples
	}
	if l.ProbeEvery == 0 {
		l.ProbeEvery = DefaultProbeEvery
	}
	if l.ProbeSamples == 0 {
		l.ProbeSamples = DefaultProbeSamples
	}
	return l
}

// Validate reports whether l's fields are in range and consistent. Zero
// fields are valid: they take their defaults.
func (l Law) Validate() error {
	l = l.withDefaults()
	switch {
	case l.MinLimit < 1:
		return invalid("Law.MinLimit", l.MinLimit, "at least 1")
	case l.MaxLimit < l.MinLimit:
		return invalid("Law.MaxLimit", l.MaxLimit, "at least MinLimit")
	case l.InitialLimit < l.MinLimit || l.InitialLimit > l.MaxLimit:
		return invalid("Law.InitialLimit", l.InitialLimit, "within [MinLimit, MaxLimit]")
	case !(l.Tolerance > 1) || math.IsInf(l.Tolerance, 0):
		return invalid("Law.Tolerance", l.Tolerance, "a finite factor above 1")
	case l.Objective < 0:
		return invalid("Law.Objective", l.Objective, "0 (off) or a positive duration")
	case l.Interval < time.Millisecond:
		return invalid("Law.Interval", l.Interval, "at least 1ms")
	case l.MinSamples < 1:
		return invalid("Law.MinSamples", l.MinSamples, "at least 1")
	case l.ProbeEvery < l.Interval:
		return invalid("Law.ProbeEvery", l.ProbeEvery, "at least Interval")
	case l.ProbeSamples < 1:
		return invalid("Law.ProbeSamples", l.ProbeSamples, "at least 1")
	case l.GuardCPU < 0 || l.GuardCPU > 1 || math.IsNaN(l.GuardCPU):
		return invalid("Law.GuardCPU", l.GuardCPU, "0 (off) or a fraction in (0, 1]")
	}
	return nil
}

// Cause names what decided the latest change of the limit: the values of
// [Control.Cause], in logs and metric labels.
type Cause uint8

const (
	// CauseNone: nothing has changed the limit yet.
	CauseNone Cause = iota
	// CauseLatency: the calls' latency against the baseline (the gradient).
	CauseLatency
	// CauseObjective: the calls' latency against the Objective.
	CauseObjective
	// CauseCPU: the guard's CPU reading (Law.GuardCPU).
	CauseCPU
	// CauseProbe: a baseline probe started or ended.
	CauseProbe
	// CauseStale: a cut did not bring the latency down, so the baseline
	// is re-measured rather than cut further.
	CauseStale
)

var causeNames = [...]string{"none", "latency", "objective", "cpu", "probe", "stale_baseline"}

// String returns the cause's lower-case name, such as "latency".
func (c Cause) String() string {
	if int(c) < len(causeNames) {
		return causeNames[c]
	}
	return "unknown"
}

// A Sample is what the controller measured since the previous step.
type Sample struct {
	// N is how many admitted calls completed, and RTT their mean latency
	// from admission to completion (time spent queued for a slot is not
	// in it: that is the controller's own doing, not the server's).
	N   int
	RTT time.Duration
	// ProbeN and ProbeRTT are the same for the calls admitted during the
	// current probe, since it began; zero outside probes.
	ProbeN   int
	ProbeRTT time.Duration
	// Binding reports that the limit bound: a call waited for a slot or
	// was shed.
	Binding bool
	// CPU is the guard's latest CPU reading, 0 without a guard.
	CPU float64
}

// Control is the law's memory: the value Step maps to its successor.
// The zero Control is the state before the first step: Step gives it the
// initial limit and starts a probe.
type Control struct {
	// Limit is the concurrency limit in force, and Cause what set it.
	Limit float64
	Cause Cause
	// Baseline is the latency of a call that does not queue, as last
	// probed; zero before the first probe ends. BaselineAt is when.
	Baseline   time.Duration
	BaselineAt time.Time
	// Probing reports a probe in progress, begun at ProbeStart, with the
	// limit to restore when it ends.
	Probing    bool
	ProbeStart time.Time
	Saved      float64
	// NextProbe is when the next periodic probe is due.
	NextProbe time.Time
	// LastStep is when the law last stepped.
	LastStep time.Time
	// CutFrom, CutRTT and CutAt are the limit before the first of the
	// latest run of cuts, the latency that called for it and when; zero
	// when the limit last grew. Once the calls admitted before the cut
	// have completed, a further cut checks that the first one helped.
	CutFrom float64
	CutRTT  time.Duration
	CutAt   time.Time
}

// Due reports whether a step is due at now with n completions since the
// last: an Interval has passed with MinSamples completions, or 10
// Intervals have passed. The zero Control is always due.
func (l Law) Due(c Control, n int, now time.Time) bool {
	l = l.withDefaults()
	if c.Limit == 0 {
		return true
	}
	since := now.Sub(c.LastStep)
	return (since >= l.Interval && n >= l.MinSamples) || since >= 10*l.Interval
}

// ProbeLimit returns the limit during a probe from a limit of saved: a
// quarter of it, at least 1.
func ProbeLimit(saved float64) float64 { return max(1, math.Floor(saved/4)) }

// Step returns the Control after sample s at time now.
func (l Law) Step(c Control, s Sample, now time.Time) Control {
	l = l.withDefaults()
	c.LastStep = now
	if c.Limit == 0 {
		c.Limit = float64(l.InitialLimit)
		return l.startProbe(c, now)
	}
	if c.Probing {
		return l.stepProbe(c, s, now)
	}
	if !now.Before(c.NextProbe) {
		return l.startProbe(c, now)
	}
	if s.N == 0 || !s.Binding {
		// A limit that did not bind says nothing about the server; nor
		// does an interval in which nothing completed.
		return c
	}
	prev := c.Limit
	g, cause := 1.0, CauseLatency
	if c.Baseline > 0 && s.RTT > 0 {
		g = l.Tolerance * float64(c.Baseline) / float64(s.RTT)
	}
	if l.Objective > 0 && s.RTT > l.Objective {
		if o := float64(l.Objective) / float64(s.RTT); o < g {
			g, cause = o, CauseObjective
		}
	}
	g = min(1, max(0.5, g))
	next := prev*g + math.Sqrt(prev)
	if l.GuardCPU > 0 && s.CPU >= l.GuardCPU {
		next, cause = prev/2, CauseCPU
	}
	if next < prev && cause != CauseCPU && c.CutFrom > 0 && now.Sub(c.CutAt) >= l.Interval+2*c.CutRTT {
		// Every call completed in this interval was admitted after the
		// first cut of this run of cuts. If the cuts took the limit down
		// by a tenth or more and the latency fell by less than half as
		// much, the calls are slow, not queued (a neighbour took the CPU,
		// a dependency slowed): cutting further would only shed, so the
		// baseline is measured again instead.
		if c.CutFrom >= prev*1.1 && float64(s.RTT) > float64(c.CutRTT)*(1+prev/c.CutFrom)/2 {
			c.CutFrom, c.CutRTT, c.CutAt = 0, 0, time.Time{}
			c = l.startProbe(c, now)
			c.Cause = CauseStale
			return c
		}
		c.CutFrom, c.CutRTT, c.CutAt = prev, s.RTT, now
	}
	next = min(float64(l.MaxLimit), max(float64(l.MinLimit), next))
	switch {
	case next >= prev:
		c.CutFrom, c.CutRTT, c.CutAt = 0, 0, time.Time{}
	case c.CutFrom == 0:
		c.CutFrom, c.CutRTT, c.CutAt = prev, s.RTT, now
	}
	if next != prev {
		c.Limit, c.Cause = next, cause
	}
	return c
}

func (l Law) startProbe(c Control, now time.Time) Control {
	c.Probing, c.ProbeStart, c.Saved = true, now, c.Limit
	c.Limit, c.Cause = ProbeLimit(c.Limit), CauseProbe
	return c
}

func (l Law) stepProbe(c Control, s Sample, now time.Time) Control {
	if s.ProbeN < l.ProbeSamples && now.Sub(c.ProbeStart) < 10*l.Interval {
		return c
	}
	if s.ProbeN > 0 && s.ProbeRTT > 0 {
		c.Baseline, c.BaselineAt = s.ProbeRTT, now
	}
	c.Probing, c.Limit, c.Cause = false, c.Saved, CauseProbe
	c.CutFrom, c.CutRTT, c.CutAt = 0, 0, time.Time{}
	c.NextProbe = now.Add(jitter(l.ProbeEvery, now))
	if c.Baseline == 0 {
		// Nothing completed (an idle start): probe at the next step, so
		// that the first load finds a baseline rather than none for a
		// whole ProbeEvery.
		c.NextProbe = now
	}
	return c
}

// jitter spreads d by ±10%, from now's nanoseconds, so that servers started
// together do not probe together, and Step stays a function of its inputs.
func jitter(d time.Duration, now time.Time) time.Duration {
	f := float64(now.UnixNano()%1000)/1000*0.2 - 0.1
	return d + time.Duration(f*float64(d))
}
