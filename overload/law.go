package overload

import (
	"fmt"
	"math"
	"time"

	"github.com/floodgate-go/floodgate"
)

// invalid is every configuration error: it wraps [floodgate.ErrInvalidOption]
// and names the offending field or option.
func invalid(field string, v any, want string) error {
	return fmt.Errorf("%w: overload: %s = %v, want %s", floodgate.ErrInvalidOption, field, v, want)
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
	// A queue that builds while no rate is in force may bring an update
	// forward ([Law.Onset]); the controller does so once an Interval at
	// most.
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
	// QueueTarget is the longest a call may wait between its arrival and
	// its admission (its queueing delay, see [Arrived]) before the server
	// counts as saturated. Default 0: 3 × the calls' latency, between 2 ms
	// and 50 ms (see [Law.Target]), a few calls' worth of work, enough to
	// keep the server busy between arrivals, far below any deadline worth
	// having.
	//
	// Where handlers run their work without yielding (CPU-bound calls),
	// calls queue before the controller, waiting for the Go scheduler to
	// start their goroutines, and the concurrency limit never binds. The
	// controller then limits the rate of admissions instead (see
	// stepRate): when the mean queueing delay of an interval first
	// exceeds the target, the rate becomes what the server completed in
	// it; from then on, each interval, the rate is cut, scaled by what the
	// server completed over what was admitted when that is less, by what
	// takes half the queue's excess over the target away in the next
	// interval, or grown, while the queue is short, by what fills half its
	// shortfall, at most RateStep, and a fifth of that above nine tenths
	// of what the server completed when it last saturated. A queue
	// already draining is not cut again, and with a guard (WithGuard) a
	// CPU reading above SaturatedCPU cuts by up to RateStep, in
	// proportion to how near it is to a pinned CPU, at most once per
	// 250 ms (cpugate's default interval), and with a short queue no
	// lower than what the server completes; one at or above it lets
	// the rate grow in no interval it is seen in. After a second in which the rate did not
	// bind (it shed nothing, or it was half again above what completed),
	// it is lifted.
	// If a second of cuts does not bring the delay below its level at the
	// first cut (without a guard), or this server's CPU reading is below
	// RateCPU, the wait is someone else's (a neighbour holding the CPU):
	// the rate is lifted, for RateHoldOff after useless cuts.
	QueueTarget time.Duration
	// MaxQueueDelay is, while the admission rate is limited, the longest
	// a call may have waited to reach the controller: a call that waited
	// longer is shed, so that a queue built up before the rate took hold
	// drains at once instead of making every call behind it late.
	// Default 0: 3 × the queue target.
	MaxQueueDelay time.Duration
	// RateCut is the harshest cut of the admission rate in one interval,
	// as a factor of the rate before it, in (0, 1). Default 0.5.
	RateCut float64
	// RateStep is the admission rate's largest growth per interval while
	// it binds with a short queue, and its largest cut by a saturated CPU
	// (SaturatedCPU), at most once per 250 ms, in (0, 1). Default 0.05.
	RateStep float64
	// SaturatedCPU, with a guard (WithGuard), is the CPU reading at or
	// above which this server is saturated with its own work. While the
	// admission rate is limited, such a reading keeps the rate from
	// growing: a Go server whose CPU never idles polls its network only
	// every few scheduling rounds, so calls wait to be read before any
	// signal of the controller's sees them, and a rate grown into a
	// pinned CPU builds that unseen queue. A reading above it also cuts
	// the rate, at most once per 250 ms, by RateStep × how far the
	// reading lies from SaturatedCPU towards 1 (all of RateStep for a
	// pinned CPU), but with a queue within its target no lower than what
	// the server completes (Control.Capacity): admitting more than
	// completes is what grows the unseen queue, and a pinned CPU that
	// admits what it completes is at its capacity. A cut below that left
	// CPU idle until the rate grew back, and held the rate 3–5% under
	// the capacity. It acts only while a queueing delay has limited the
	// rate, so it is no CPU cap; where the guard reads this process's
	// own CPU (its cgroup, or its process times), a neighbour cannot
	// raise the reading either. Default 0.97 (a 250 ms reading of a
	// server near its capacity varies by a few points); a value above 1
	// turns it off.
	SaturatedCPU float64
	// RateCPU, with a guard (WithGuard), is the CPU reading below which a
	// long queueing delay is not this server's doing (a neighbour holds
	// the CPU) and sets no rate. Default 0.6; 0 ignores the guard.
	RateCPU float64
	// RateProbation is how long a cut rate has to bring the queueing delay
	// below its level at the first cut, and how long a rate must not bind
	// before it is lifted. Default 1 s.
	RateProbation time.Duration
	// RateHoldOff is how long the rate stays lifted after a cut that did
	// not help. Default 10 s.
	RateHoldOff time.Duration
	// GuardCPU, when positive, is a CPU fraction (from the controller's
	// guard, [WithGuard]) at or above which an interval in which the limit
	// was binding cuts the limit by half, whatever the latency says.
	// Default 0, off: the latency decides, and CPU readings only explain.
	// On a shared host the CPU a sampler reads may not be this server's.
	GuardCPU float64
}

// cpuCutEvery is the least time between two cuts of the rate by a
// saturated CPU reading: cpugate's default sampling interval, so that
// one reading, seen by several steps, cuts once.
const cpuCutEvery = 250 * time.Millisecond

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
	DefaultRateCut      = 0.5
	DefaultRateStep     = 0.05
	DefaultSaturatedCPU = 0.97
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
	if l.RateCut == 0 {
		l.RateCut = DefaultRateCut
	}
	if l.RateStep == 0 {
		l.RateStep = DefaultRateStep
	}
	if l.RateCPU == 0 {
		l.RateCPU = 0.6
	}
	if l.SaturatedCPU == 0 {
		l.SaturatedCPU = DefaultSaturatedCPU
	}
	if l.RateProbation == 0 {
		l.RateProbation = time.Second
	}
	if l.RateHoldOff == 0 {
		l.RateHoldOff = 10 * time.Second
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
	case l.QueueTarget < 0:
		return invalid("Law.QueueTarget", l.QueueTarget, "a positive duration")
	case l.MaxQueueDelay < 0 || (l.MaxQueueDelay > 0 && l.MaxQueueDelay < l.QueueTarget):
		return invalid("Law.MaxQueueDelay", l.MaxQueueDelay, "0 (3 × the queue target) or at least QueueTarget")
	case !(l.RateCut > 0 && l.RateCut < 1):
		return invalid("Law.RateCut", l.RateCut, "a factor in (0, 1)")
	case !(l.RateStep > 0 && l.RateStep < 1):
		return invalid("Law.RateStep", l.RateStep, "a step in (0, 1)")
	case l.RateProbation < l.Interval:
		return invalid("Law.RateProbation", l.RateProbation, "at least Interval")
	case l.RateCPU < 0 || l.RateCPU > 1 || math.IsNaN(l.RateCPU):
		return invalid("Law.RateCPU", l.RateCPU, "a fraction in (0, 1]")
	case !(l.SaturatedCPU > 0) || math.IsInf(l.SaturatedCPU, 0):
		return invalid("Law.SaturatedCPU", l.SaturatedCPU, "a fraction in (0, 1], or above 1 for off")
	case l.RateHoldOff < 0:
		return invalid("Law.RateHoldOff", l.RateHoldOff, "a positive duration")
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
	// CauseQueue: the queueing delay before admission (the rate).
	CauseQueue
	// CauseNotOurs: a cut of the rate did not bring the queueing delay
	// down, so the rate was lifted.
	CauseNotOurs
)

var causeNames = [...]string{"none", "latency", "objective", "cpu", "probe", "stale_baseline", "queue_delay", "delay_not_ours"}

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
	// QN is how many calls reached the controller with a known arrival
	// time, and QueueDelay their mean wait from arrival to the controller.
	QN         int
	QueueDelay time.Duration
	// RateShed is how many calls the admission rate shed, and Admitted
	// how many calls the controller admitted.
	RateShed int
	Admitted int
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
	// RateSlack is when the rate last began not to bind, zero while it
	// binds.
	RateSlack time.Time
	// Capacity is what the server completed per second while the rate
	// was limited, and Saturated the same in the intervals its queueing
	// delay was over the target, both smoothed.
	Capacity  float64
	Saturated float64
	// Admitting is what the controller admitted per second in the same
	// intervals as Capacity, smoothed alike.
	Admitting float64
	// CPUCutAt is when a saturated CPU reading last cut the rate.
	CPUCutAt time.Time
	// RTT is the calls' latency, smoothed over about a second.
	RTT time.Duration
	// LastDelay is the queueing delay of the last interval that had one.
	LastDelay time.Duration
	// Rate is the admission rate in calls per second, 0 when admissions
	// are not rate-limited; RateCause is what set it last. RateAt and
	// RateDelay are when a run of rate cuts began and the queueing delay
	// that began it; RateHeld is until when the rate stays lifted.
	Rate      float64
	RateCause Cause
	RateAt    time.Time
	RateDelay time.Duration
	RateHeld  time.Time
	// CutFrom, CutRTT and CutAt are the limit before the first of the
	// latest run of cuts, the latency that called for it and when; zero
	// when the limit last grew. Once the calls admitted before the cut
	// have completed, a further cut checks that the first one helped.
	CutFrom float64
	CutRTT  time.Duration
	CutAt   time.Time
}

// Due reports whether a step is due at now with n completions since the
// last: an Interval has passed with MinSamples completions (or while the
// admission rate is limited), or 10 Intervals have passed. The zero Control is always due.
func (l Law) Due(c Control, n int, now time.Time) bool {
	l = l.withDefaults()
	if c.Limit == 0 {
		return true
	}
	since := now.Sub(c.LastStep)
	// While the rate is limited, every interval: a low rate completes
	// few calls, and must not wait for them to grow again.
	return (since >= l.Interval && (n >= l.MinSamples || c.Rate > 0)) || since >= 10*l.Interval
}

// Onset reports whether a queue is building fast enough to step before
// the interval is over: no admission rate is in force, n calls completed
// and qn reached the controller since the last step (at least MinSamples
// each: a step from fewer sets no rate), the qn having waited qd on
// average, over twice the target, and a quarter of an Interval has passed
// since the last step. A burst then meets a rate within tens of
// milliseconds rather than at the end of the interval it began in.
func (l Law) Onset(c Control, n, qn int, qd time.Duration, now time.Time) bool {
	if c.Rate != 0 || c.Limit == 0 {
		return false // the common case, on every admission: decided cheaply
	}
	l = l.withDefaults()
	return n >= l.MinSamples && qn >= l.MinSamples &&
		qd > 2*l.Target(c) && now.Sub(c.LastStep) >= l.Interval/4
}

// lowCPUHolds reports whether s's CPU reading, below RateCPU or none yet,
// is all that keeps its queueing delay, over the target, from setting a
// rate: the controller then asks its guard for the use since the reading
// (see [Guard]), which may predate the queue.
func (l Law) lowCPUHolds(c Control, s Sample) bool {
	l = l.withDefaults()
	return c.Rate == 0 && s.QN > 0 && s.QueueDelay > l.Target(c) && s.CPU < l.RateCPU
}

// ProbeLimit returns the limit during a probe from a limit of saved: a
// quarter of it, at least 1.
func ProbeLimit(saved float64) float64 { return max(1, math.Floor(saved/4)) }

// Step returns the Control after sample s at time now.
func (l Law) Step(c Control, s Sample, now time.Time) Control {
	l = l.withDefaults()
	if c.Limit == 0 {
		c.Limit, c.LastStep = float64(l.InitialLimit), now
		return l.startProbe(c, now)
	}
	dt := now.Sub(c.LastStep)
	c.LastStep = now
	if s.N > 0 {
		if c.RTT == 0 {
			c.RTT = s.RTT
		} else {
			c.RTT += time.Duration(min(1, dt.Seconds()) * float64(s.RTT-c.RTT))
		}
	}
	c = l.stepRate(c, s, dt, now)
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

// stepRate updates the admission rate from the queueing delay of the
// interval of length dt that s covers.
//
// The queue before the controller integrates the excess of work over
// what the CPU does: the delay grows while more is admitted than the
// server completes, and shrinks while less is. So the rate is set, when
// the delay first exceeds the target, to what the server has just
// completed (at saturation, its capacity), then each interval cut by half
// the queue's excess (see drain), from the rate scaled by what the server
// completes over what is admitted when that is less, or grown by half its
// shortfall: cuts anchored to the server's own completions do not wind the
// rate down past what the server can do, a rate the flows' shares do not
// use in full is not cut as if they did, and growth slows near where the
// server saturated last, where the queue rises steeply, so the rate
// settles near the capacity instead of sawing around it.
func (l Law) stepRate(c Control, s Sample, dt time.Duration, now time.Time) Control {
	if s.QN == 0 || dt <= 0 {
		return c
	}
	c = l.rateLaw(c, s, dt, now)
	c.LastDelay = s.QueueDelay
	return c
}

func (l Law) rateLaw(c Control, s Sample, dt time.Duration, now time.Time) Control {
	target := float64(l.Target(c))
	over := float64(s.QueueDelay) - target
	done := float64(s.N) / dt.Seconds() // what the server completed
	// The rate binds when it sheds calls and is not half again above
	// what completed: a rate that far above sheds only the bunched
	// arrivals of flows within their shares.
	binding := s.RateShed > 0 && c.Rate <= 1.5*done
	if binding || c.Rate == 0 || over > 0 {
		c.RateSlack = time.Time{}
	}
	// An interval with fewer completions than MinSamples (a stall, a
	// collection) says little about what the server completes.
	measured := s.N >= l.MinSamples
	ours := l.RateCPU == 0 || s.CPU == 0 || s.CPU >= l.RateCPU
	switch {
	case now.Before(c.RateHeld):
		// A cut did not help lately: the delay is not ours to cut.
	case c.Rate == 0 && over > 0 && ours && measured:
		c.Capacity, c.Saturated, c.CPUCutAt = done, done, time.Time{}
		c.Admitting = float64(s.Admitted) / dt.Seconds()
		c.Rate = max(1, done*l.drain(s.QueueDelay, c, dt))
		c.RateCause, c.RateAt, c.RateDelay = CauseQueue, now, s.QueueDelay
	case c.Rate == 0:
	case over > 0 && s.CPU == 0 && !c.RateAt.IsZero() && now.Sub(c.RateAt) >= l.RateProbation && s.QueueDelay >= c.RateDelay:
		// Without a CPU reading to tell: a probation of cuts and the
		// calls wait as long as when the cuts began, so the wait is for
		// a CPU someone else holds, and shedding our calls would not
		// shorten it. (With a reading, a busy CPU is ours: a cost that
		// doubled can take longer than a probation to cut down to.)
		c.Rate, c.RateCause, c.RateAt, c.RateDelay = 0, CauseNotOurs, time.Time{}, 0
		c.RateHeld = now.Add(l.RateHoldOff)
	case over <= 0 && !binding:
		// Not binding: lift the rate once it has not bound, with a short
		// queue, for a whole probation; bursts come and go within one.
		if c.RateSlack.IsZero() || over >= -target/2 {
			if c.RateSlack.IsZero() {
				c.RateSlack = now
			}
			break
		}
		if now.Sub(c.RateSlack) >= l.RateProbation {
			c.Rate, c.RateCause, c.RateAt, c.RateDelay, c.RateSlack = 0, CauseQueue, time.Time{}, 0, time.Time{}
		}
	default:
		// The rate binds or the queue is over its target. Cut from the
		// rate scaled by what the server completes over what is admitted
		// (when that is less) by what drains half the queue's excess
		// over the target in the next interval; grow from the rate by
		// what fills half its shortfall, at most RateStep.
		if measured {
			c.Capacity += 0.5 * (done - c.Capacity)
			c.Admitting += 0.5 * (float64(s.Admitted)/dt.Seconds() - c.Admitting)
		}
		f := l.drain(s.QueueDelay, c, dt)
		cpuOnly := false // the CPU reading alone cuts
		switch {
		case s.QueueDelay < c.LastDelay*9/10 && f < 1:
			// The queue is draining: the last cut is doing its work,
			// and another would overshoot.
			f = 1
		case l.cpuExcess(s.CPU) > 0 && now.Sub(c.CPUCutAt) >= cpuCutEvery:
			// Once per reading: the guard reads less often than
			// the law steps, and one reading must not cut twice.
			cpuOnly = f >= 1
			f = min(f, 1-l.RateStep*l.cpuExcess(s.CPU))
			c.CPUCutAt = now
		}
		if over > 0 && measured {
			c.Saturated += 0.5 * (done - c.Saturated)
		}
		if f > 1 && s.CPU >= l.SaturatedCPU {
			// A saturated CPU is no room to grow into, however short
			// the queue the controller sees.
			f = 1
		}
		if f > 1 && c.Saturated > 0 && c.Rate*f > 0.9*c.Saturated {
			// Near where the server saturated last, probe for more
			// slowly: the queue rises steeply past it.
			f = min(f, 1+l.RateStep/5)
		}
		base := c.Rate
		if f < 1 && c.Admitting > c.Capacity {
			// Cut from what the server completed, when that is less
			// than what was admitted: the rate scaled by the ratio.
			// The flows' shares need not use all of the rate (a quiet
			// flow's bucket holds two calls), so the rate itself may
			// stand above both.
			base *= c.Capacity / c.Admitting
		}
		rate := max(1, c.Rate*l.RateCut, base*f)
		if cpuOnly {
			// With a short queue, a saturated CPU trims the rate down to
			// what the server completes, not below: admitting that keeps
			// a pinned CPU busy and no queue growing, and a cut below it
			// leaves CPU idle until the rate grows back.
			rate = max(rate, min(c.Rate, c.Capacity))
		}
		c.Rate, c.RateCause = rate, CauseQueue
		switch {
		case over <= 0:
			c.RateAt, c.RateDelay = time.Time{}, 0
		case c.RateAt.IsZero():
			c.RateAt, c.RateDelay = now, s.QueueDelay
		}
	}
	return c
}

// cpuExcess returns how far a CPU reading lies above SaturatedCPU towards
// a pinned CPU, in [0, 1]: 0 at or below the threshold (a reading at it
// only holds the rate), 1 for a pinned reading, which cuts by all of
// RateStep. With SaturatedCPU at 1, a pinned reading is 1 and cuts; above
// 1, nothing is.
func (l Law) cpuExcess(cpu float64) float64 {
	switch {
	case !(cpu >= l.SaturatedCPU) || l.SaturatedCPU > 1:
		// Below the threshold, no reading (NaN), or the guard off.
		return 0
	case l.SaturatedCPU == 1:
		return 1
	}
	return min(1, max(0, (cpu-l.SaturatedCPU)/(1-l.SaturatedCPU)))
}

// drain returns the factor by which the admission rate differs from what
// the server completes, when the interval of length dt had a queueing
// delay of d: the server then holds d − Target of work beyond the target,
// and admitting half of that less in the next interval takes half the
// excess away, whatever the server's capacity. The factor is kept
// within [RateCut, 1 + RateStep].
func (l Law) drain(d time.Duration, c Control, dt time.Duration) float64 {
	f := 1 - float64(d-l.Target(c))/float64(2*max(dt, l.Interval))
	return min(1+l.RateStep, max(l.RateCut, f))
}

// Target returns the queueing delay target in force with c: QueueTarget,
// or by default 3 times the larger of the baseline and the smoothed
// latency, between 2 ms and 50 ms (20 ms before anything is measured).
// Poisson arrivals keep a queue of several calls at the utilisation the
// controller aims for, so the target is counted in calls, not in
// milliseconds.
func (l Law) Target(c Control) time.Duration {
	switch {
	case l.QueueTarget > 0:
		return l.QueueTarget
	case c.Baseline == 0 && c.RTT == 0:
		return 20 * time.Millisecond
	}
	// The recent latency too: when every call's cost rises, the queue a
	// busy server needs grows with it, before the next probe.
	return min(50*time.Millisecond, max(2*time.Millisecond, 3*max(c.Baseline, c.RTT)))
}

// MaxDelay returns the longest queueing delay a call may have had to be
// admitted while the rate is limited: MaxQueueDelay, or 3 times Target.
func (l Law) MaxDelay(c Control) time.Duration {
	if l.MaxQueueDelay > 0 {
		return l.MaxQueueDelay
	}
	return 3 * l.Target(c)
}
