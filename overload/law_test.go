package overload

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
)

var t0 = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)

const ms = time.Millisecond

// probed returns a Control after the start-up probe measured baseline.
func probed(t *testing.T, l Law, baseline time.Duration) (Control, time.Time) {
	t.Helper()
	c := l.Step(Control{}, Sample{}, t0)
	if !c.Probing || c.Limit != ProbeLimit(DefaultInitialLimit) {
		t.Fatalf("first Step = %+v, want a probe at limit %v", c, ProbeLimit(DefaultInitialLimit))
	}
	now := t0.Add(200 * ms)
	c = l.Step(c, Sample{N: 20, RTT: baseline, ProbeN: 20, ProbeRTT: baseline}, now)
	if c.Probing || c.Baseline != baseline || c.Limit != DefaultInitialLimit {
		t.Fatalf("after the probe: %+v, want baseline %v and limit %d restored", c, baseline, DefaultInitialLimit)
	}
	return c, now
}

func TestLawProbeNeedsSamples(t *testing.T) {
	var l Law
	c := l.Step(Control{}, Sample{}, t0)
	c = l.Step(c, Sample{N: 5, ProbeN: 5, ProbeRTT: 3 * ms}, t0.Add(100*ms))
	if !c.Probing {
		t.Fatalf("probe ended after 5 of %d samples", DefaultProbeSamples)
	}
	// Ten intervals end it with what it has.
	c = l.Step(c, Sample{N: 5, ProbeN: 5, ProbeRTT: 3 * ms}, t0.Add(time.Second))
	if c.Probing || c.Baseline != 3*ms {
		t.Fatalf("after 1 s: %+v, want the probe ended with baseline 3ms", c)
	}
}

func TestLawIdleStartProbesAgain(t *testing.T) {
	var l Law
	c := l.Step(Control{}, Sample{}, t0)
	c = l.Step(c, Sample{}, t0.Add(time.Second))
	if c.Probing || c.Baseline != 0 {
		t.Fatalf("idle probe: %+v", c)
	}
	c = l.Step(c, Sample{N: 1, RTT: ms, Binding: true}, t0.Add(1100*ms))
	if !c.Probing {
		t.Fatalf("without a baseline the next step must probe again: %+v", c)
	}
}

func TestLawCutsQueueingAndGrowsWhenFast(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms)
	// 16 calls in flight on one CPU: each waits behind the others.
	now = now.Add(100 * ms)
	c = l.Step(c, Sample{N: 30, RTT: 48 * ms, Binding: true}, now)
	want := 16*0.5 + 4.0
	if c.Limit != want || c.Cause != CauseLatency {
		t.Fatalf("Limit = %v (%v), want %v by latency", c.Limit, c.Cause, want)
	}
	// Within tolerance: grows by √limit.
	now = now.Add(100 * ms)
	c = l.Step(c, Sample{N: 30, RTT: 5 * ms, Binding: true}, now)
	if want := 12 + math.Sqrt(12); math.Abs(c.Limit-want) > 1e-9 {
		t.Fatalf("Limit = %v, want %v", c.Limit, want)
	}
}

func TestLawHoldsWhenNotBinding(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms)
	before := c
	c = l.Step(c, Sample{N: 30, RTT: 90 * ms}, now.Add(100*ms))
	if c.Limit != before.Limit {
		t.Fatalf("an interval where the limit did not bind changed it: %v → %v", before.Limit, c.Limit)
	}
}

// The plant: one CPU serving calls in turn, each taking cost. With limit L
// calls in flight, the mean call waits behind about L−1 others.
func plantRTT(limit float64, cost time.Duration) time.Duration {
	return time.Duration(max(1, limit) * float64(cost))
}

func TestLawConvergesAboveTheKnee(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms)
	for range 100 {
		now = now.Add(100 * ms)
		c = l.Step(c, Sample{N: 30, RTT: plantRTT(c.Limit, 3*ms), Binding: true}, now)
	}
	// limit = 2 + √limit at the fixed point: 4. Enough to keep one CPU
	// busy, not so much that calls wait long.
	if c.Limit < 3 || c.Limit > 5 {
		t.Fatalf("Limit = %v after 10 s of overload, want about 4", c.Limit)
	}
}

// ioPlant is a server whose calls take base each up to knee calls in flight
// and queue beyond it, all slow times slower.
func ioPlant(limit float64, base time.Duration, knee, slow float64) time.Duration {
	return time.Duration(slow * float64(base) * max(1, limit/knee))
}

// Calls become four times slower whatever the limit (a slow dependency, a
// neighbour taking the CPU): the law may cut while cutting brings the
// latency down, then must re-measure its baseline rather than ratchet the
// server down to its floor, and come back.
func TestLawSlowCallsDoNotRatchet(t *testing.T) {
	var l Law
	c, now := probed(t, l, 10*ms)
	step := func(slow float64) {
		now = now.Add(100 * ms)
		rtt := ioPlant(c.Limit, 10*ms, 50, slow)
		s := Sample{N: 30, RTT: rtt, Binding: true}
		if c.Probing {
			s.ProbeN, s.ProbeRTT = 20, ioPlant(c.Limit, 10*ms, 50, slow)
		}
		c = l.Step(c, s, now)
	}
	for range 50 {
		step(1)
	}
	settled := c.Limit
	if settled < 50 {
		t.Fatalf("settled at %v, below the knee of 50", settled)
	}
	lowest, stale := c.Limit, false
	for range 100 {
		step(4)
		if c.Cause == CauseStale {
			stale = true
		}
		if !c.Probing {
			lowest = min(lowest, c.Limit)
		}
	}
	if !stale {
		t.Error("the baseline was never re-measured for a cut that did not help")
	}
	if c.Baseline != 40*ms {
		t.Errorf("Baseline = %v, want 40ms re-measured", c.Baseline)
	}
	if lowest < 20 {
		t.Errorf("the limit fell to %v: cuts went on after they stopped helping", lowest)
	}
	if c.Limit < 0.9*settled {
		t.Errorf("Limit = %v 10 s later, want back near %v", c.Limit, settled)
	}
}

// On one CPU the law's fixed point is about 4 calls in flight; a neighbour
// that doubles every call's cost does not move it below that.
func TestLawNoisyNeighbourOnOneCPU(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms)
	for range 400 {
		now = now.Add(100 * ms)
		cost := 3 * ms
		if now.Sub(t0) > 5*time.Second {
			cost = 6 * ms
		}
		s := Sample{N: 30, RTT: plantRTT(c.Limit, cost), Binding: true}
		if c.Probing {
			s.ProbeN, s.ProbeRTT = 20, plantRTT(c.Limit, cost)
		}
		c = l.Step(c, s, now)
		if !c.Probing && c.Limit < 3 {
			t.Fatalf("Limit = %v at %v", c.Limit, now.Sub(t0))
		}
	}
	if c.Baseline != 6*ms {
		t.Errorf("Baseline = %v after 40 s, want the periodic probe's 6ms", c.Baseline)
	}
}

func TestLawObjective(t *testing.T) {
	l := Law{Objective: 20 * ms}
	c, now := probed(t, l, 15*ms)
	c = l.Step(c, Sample{N: 30, RTT: 29 * ms, Binding: true}, now.Add(100*ms))
	// Tolerance alone (2 × 15 ms) would grow it; the objective cuts.
	if c.Cause != CauseObjective || c.Limit >= DefaultInitialLimit {
		t.Fatalf("Step over the objective = %+v, want a cut by objective", c)
	}
}

func TestLawGuardCPU(t *testing.T) {
	l := Law{GuardCPU: 0.95}
	c, now := probed(t, l, 3*ms)
	c = l.Step(c, Sample{N: 30, RTT: 3 * ms, Binding: true, CPU: 0.99}, now.Add(100*ms))
	if c.Cause != CauseCPU || c.Limit != DefaultInitialLimit/2 {
		t.Fatalf("Step = %+v, want halved by cpu", c)
	}
	c = l.Step(c, Sample{N: 30, RTT: 3 * ms, CPU: 0.99}, now.Add(200*ms))
	if c.Limit != DefaultInitialLimit/2 {
		t.Fatalf("an idle server was cut for its CPU: %+v", c)
	}
}

func TestLawPeriodicProbe(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms)
	next := c.NextProbe
	if d := next.Sub(now); d < 27*time.Second || d > 33*time.Second {
		t.Fatalf("next probe in %v, want 30 s ± 10%%", d)
	}
	c = l.Step(c, Sample{N: 30, RTT: 3 * ms}, next)
	if !c.Probing || c.Saved != DefaultInitialLimit {
		t.Fatalf("at NextProbe: %+v, want a probe saving the limit", c)
	}
}

func TestLawDue(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms)
	for _, tc := range []struct {
		after time.Duration
		n     int
		want  bool
	}{
		{50 * ms, 100, false},
		{100 * ms, 7, false},
		{100 * ms, 8, true},
		{999 * ms, 1, false},
		{time.Second, 0, true},
	} {
		if got := l.Due(c, tc.n, now.Add(tc.after)); got != tc.want {
			t.Errorf("Due(%v later, n=%d) = %v, want %v", tc.after, tc.n, got, tc.want)
		}
	}
}

func TestLawValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Law
	}{
		{"MinLimit", Law{MinLimit: -1}},
		{"MaxLimit", Law{MinLimit: 10, MaxLimit: 5, InitialLimit: 7}},
		{"InitialLimit", Law{InitialLimit: 2000}},
		{"Tolerance", Law{Tolerance: 0.9}},
		{"Tolerance", Law{Tolerance: math.Inf(1)}},
		{"Objective", Law{Objective: -1}},
		{"Interval", Law{Interval: time.Microsecond}},
		{"MinSamples", Law{MinSamples: -3}},
		{"ProbeEvery", Law{ProbeEvery: ms}},
		{"ProbeSamples", Law{ProbeSamples: -1}},
		{"GuardCPU", Law{GuardCPU: 1.5}},
		{"GuardCPU", Law{GuardCPU: math.NaN()}},
	} {
		err := tc.l.Validate()
		if !errors.Is(err, floodgate.ErrInvalidOption) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidOption", tc.l, err)
			continue
		}
		if want := "Law." + tc.name; !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error %q does not name %s", err, want)
		}
	}
	if err := (Law{}).Validate(); err != nil {
		t.Errorf("zero Law: %v", err)
	}
}

// rateStep steps c by an interval of 100 ms in which n calls completed and
// calls waited qd to reach the controller, shed of them by the rate.
func rateStep(l Law, c Control, now time.Time, n int, qd time.Duration, shed int, cpu float64) Control {
	return admitStep(l, c, now, n, n, qd, shed, cpu)
}

// admitStep is rateStep with admitted calls admitted in the interval.
func admitStep(l Law, c Control, now time.Time, n, admitted int, qd time.Duration, shed int, cpu float64) Control {
	return l.Step(c, Sample{N: n, RTT: 3 * ms, QN: n + shed, QueueDelay: qd, RateShed: shed, Admitted: admitted, CPU: cpu}, now)
}

func TestLawRate(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms) // target 3 × 3 ms
	if got := l.Target(c); got != 9*ms {
		t.Fatalf("Target = %v, want 9ms", got)
	}
	cpu := 0.0
	admitted := 30 // per interval, while the server completes fewer
	next := func(n int, qd time.Duration, shed int) {
		now = now.Add(100 * ms)
		a := admitted
		if a == 0 {
			a = n
		}
		c = admitStep(l, c, now, n, a, qd, shed, cpu)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Fatalf("%s: Rate = %v, want %v", what, got, want)
		}
	}
	next(30, 5*ms, 0)
	if c.Rate != 0 {
		t.Fatalf("a delay within the target set a rate: %v", c.Rate)
	}
	// Saturated: the rate starts below what the server completed, by
	// what drains half the excess (24 − 9 ms) in the next 100 ms.
	next(30, 24*ms, 0)
	near("onset", c.Rate, 300*(1-15.0/200))
	if c.RateCause != CauseQueue {
		t.Fatalf("onset cause %v, want %v", c.RateCause, CauseQueue)
	}
	// Still over, but draining: the cut is doing its work.
	onset := c.Rate
	next(25, 18*ms, 40)
	near("draining", c.Rate, onset)
	// Over and not draining: cut from the rate scaled by what the server
	// completed over what was admitted, both smoothed alike (300, then
	// 275 and 262.5 completed per second, 300 admitted throughout).
	next(25, 20*ms, 40)
	capacity := 300 + 0.5*(250-300.0)
	capacity += 0.5 * (250 - capacity)
	near("over", c.Rate, onset*capacity/300*(1-11.0/200))
	admitted = 0 // from here on, what completes was admitted
	// Binding with a short queue: grows from the rate by half the
	// queue's shortfall, at most RateStep; above nine tenths of what the
	// server completed when it last saturated (Saturated: what it
	// completed while the queue was over, smoothed: 300, 275, 262.5), by
	// RateStep/5 at most.
	saturated := 300 + 0.5*(250-300.0)
	saturated += 0.5 * (250 - saturated)
	if math.Abs(c.Saturated-saturated) > 1e-9 {
		t.Fatalf("Saturated = %v, want %v", c.Saturated, saturated)
	}
	r := c.Rate
	next(22, 8*ms, 40)
	near("short queue", c.Rate, r*(1+1.0/200))
	r = c.Rate
	next(22, 0, 40)
	near("empty queue near saturation", c.Rate, r*(1+DefaultRateStep/5))
	c.Rate = 100
	next(22, 0, 40)
	near("empty queue far below saturation", c.Rate, 100*(1+DefaultRateStep*0.9))
	c.Rate = r
	// A pinned CPU reading cuts by RateStep, from the rate scaled by what
	// completed over what was admitted, even with a short queue, though
	// not below what the server completes (TestLawCPUCutStopsAtCapacity),
	// at most once per 250 ms however often the same reading is seen, and
	// holds the rate meanwhile; a reading between SaturatedCPU and pinned
	// cuts in proportion, one at SaturatedCPU only holds; below it, the
	// CPU does not matter.
	// The rate stands well above the 220 calls/s that complete, so that
	// these cuts stay above what completes.
	cpuCut := func(r, step float64) float64 {
		t.Helper()
		cut := r * min(1, c.Capacity/c.Admitting) * (1 - step)
		if cut <= c.Capacity {
			t.Fatalf("a cut to %v would stop at what completes, %v", cut, c.Capacity)
		}
		return cut
	}
	c.Rate = 300
	cpu = 1
	r = c.Rate
	next(22, ms, 40)
	near("saturated CPU", c.Rate, cpuCut(r, DefaultRateStep))
	for i := range 2 {
		r = c.Rate
		next(22, 9*ms-2*ms, 40)
		near(fmt.Sprintf("the pinned reading %d00 ms after the cut", i+1), c.Rate, r)
	}
	r = c.Rate
	next(22, ms, 40)
	near("the pinned reading 300 ms after the cut", c.Rate, cpuCut(r, DefaultRateStep))
	cpu = DefaultSaturatedCPU
	for range 3 {
		r = c.Rate
		next(22, 9*ms-2*ms, 40)
		near("a reading at SaturatedCPU", c.Rate, r)
	}
	cpu = (DefaultSaturatedCPU + 1) / 2
	r = c.Rate
	next(22, ms, 40)
	near("a reading halfway to pinned", c.Rate, cpuCut(r, DefaultRateStep/2))
	cpu = DefaultSaturatedCPU - 0.01
	r = c.Rate
	next(22, 9*ms-2*ms, 40)
	near("busy CPU", c.Rate, r*(1+2.0/200))
	cpu = 0
	// A stall (few completions, a long delay) cuts at most RateCut, and
	// does not count as what the server completes.
	r, capacityBefore := c.Rate, c.Capacity
	next(2, 900*ms, 40)
	if c.Rate < r*DefaultRateCut-1e-9 || c.Capacity != capacityBefore {
		t.Fatalf("a stall cut the rate from %v to %v (capacity %v → %v)", r, c.Rate, capacityBefore, c.Capacity)
	}
	// Not binding: lifted only after a whole probation of it.
	for range 10 {
		next(20, ms, 0)
		if c.Rate == 0 {
			t.Fatal("lifted before a probation passed")
		}
	}
	next(20, ms, 0)
	if c.Rate != 0 {
		t.Fatalf("Rate = %v after a second without binding, want lifted", c.Rate)
	}
}

// With a short queue, a pinned CPU cuts the rate towards what the server
// completes and no further: admitting that keeps the CPU busy. A rate
// already at or below it is held, and a long queue still cuts below it.
func TestLawCPUCutStopsAtCapacity(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms) // target 9 ms
	now = now.Add(100 * ms)
	c = rateStep(l, c, now, 48, 40*ms, 0, 1) // 480/s completed at the onset
	if c.Rate == 0 || c.Capacity != 480 {
		t.Fatalf("onset: Rate %v, Capacity %v; want a rate and 480", c.Rate, c.Capacity)
	}
	// 500/s admitted, 480/s completed, a short queue, a pinned CPU: each
	// reading cuts by RateStep from the rate scaled by 480/500, but not
	// below 480.
	c.Rate, c.Admitting, c.LastDelay = 500, 500, ms
	for i := range 8 {
		now = now.Add(250 * ms)
		c = admitStep(l, c, now, 120, 125, ms, 10, 1)
		if c.Rate != 480 {
			t.Fatalf("cut %d: Rate %v, want 480 (500 × 480/500 × 0.95 = 456, stopped at what completes)", i+1, c.Rate)
		}
	}
	// At the rate the server completes, a pinned reading holds the rate.
	c.Rate = 400
	for range 4 {
		now = now.Add(250 * ms)
		c = rateStep(l, c, now, 100, ms, 10, 1)
		if c.Rate != 400 {
			t.Fatalf("Rate %v, want 400, what completes, held", c.Rate)
		}
	}
	// A queue over its target still cuts below what completes.
	now = now.Add(250 * ms)
	c = rateStep(l, c, now, 100, 30*ms, 10, 1)
	if c.Rate > 400*(1-DefaultRateStep)+1e-9 {
		t.Fatalf("Rate %v after a 30 ms queue at a pinned CPU, want at most %v", c.Rate, 400*(1-DefaultRateStep))
	}
}

// A rate far above what the server completes is lifted after a
// probation with a short queue, though the bunched arrivals of a flow
// still find its bucket empty now and then (the load fell).
func TestLawRateLiftedFarAboveCompletions(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms)
	now = now.Add(100 * ms)
	c = rateStep(l, c, now, 30, 40*ms, 0, 0)
	if c.Rate == 0 {
		t.Fatal("no rate set by a 40ms queueing delay")
	}
	c.Rate = 900 // grown while the load fell to 200/s
	for i := range 12 {
		now = now.Add(100 * ms)
		c = rateStep(l, c, now, 20, ms, 2, 0)
		if c.Rate == 0 {
			if i < 10 {
				t.Fatalf("lifted after %d intervals, before a probation", i+1)
			}
			return
		}
	}
	t.Fatalf("Rate = %v after 1.2 s at 200 calls/s with a short queue, want lifted", c.Rate)
}

// A long queueing delay while this server uses little CPU is someone
// else's: no rate is set. Once one is, a low reading is the rate's own
// doing and lifts nothing.
func TestLawRateNotOurs(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms)
	now = now.Add(100 * ms)
	c = rateStep(l, c, now, 30, 40*ms, 0, 0.3)
	if c.Rate != 0 {
		t.Fatalf("Rate = %v at 30%% CPU, want none", c.Rate)
	}
	now = now.Add(100 * ms)
	c = rateStep(l, c, now, 30, 40*ms, 0, 0.95)
	if c.Rate == 0 {
		t.Fatal("no rate at 95% CPU")
	}
	now = now.Add(100 * ms)
	c = rateStep(l, c, now, 30, 40*ms, 10, 0.3)
	if c.Rate == 0 {
		t.Fatal("a low CPU reading lifted a rate that binds")
	}
}

// Without a guard, cuts that do not shorten the delay for a probation
// lift the rate and hold it off.
func TestLawRateProbation(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms)
	for i := range 12 {
		now = now.Add(100 * ms)
		c = rateStep(l, c, now, 30, 40*ms+time.Duration(i)*ms, 20, 0)
		if c.RateCause == CauseNotOurs {
			break
		}
	}
	if c.Rate != 0 || c.RateCause != CauseNotOurs || !c.RateHeld.After(now) {
		t.Fatalf("after a second of useless cuts: %+v, want the rate lifted and held off", c)
	}
	now = now.Add(100 * ms)
	c = rateStep(l, c, now, 30, 40*ms, 0, 0)
	if c.Rate != 0 {
		t.Fatal("a rate was set during the hold-off")
	}
}

// While the rate is limited the law steps every interval, however few
// calls completed: a low rate must not wait for completions to grow.
func TestLawDueWhileRateLimited(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms)
	c.Rate = 10
	if !l.Due(c, 1, now.Add(100*ms)) {
		t.Error("not due after an interval with one completion while the rate is limited")
	}
	c.Rate = 0
	if l.Due(c, 1, now.Add(100*ms)) {
		t.Error("due after an interval with one completion and no rate")
	}
}

// TestCPUExcess: how much of RateStep a CPU reading cuts, at the edges of
// SaturatedCPU: nothing at or below it, without a reading (NaN) or with the
// guard off (above 1); in proportion above it; all of it when pinned.
func TestCPUExcess(t *testing.T) {
	for _, c := range []struct {
		sat, cpu, want float64
	}{
		{0.97, 0.5, 0},
		{0.97, 0.97, 0},
		{0.97, 0.985, 0.5},
		{0.97, 1, 1},
		{0.97, math.NaN(), 0},
		{1, 0.99, 0},
		{1, 1, 1},
		{1, math.NaN(), 0},
		{1.5, 1, 0},
		{1.5, math.NaN(), 0},
	} {
		got := Law{SaturatedCPU: c.sat}.cpuExcess(c.cpu)
		if math.Abs(got-c.want) > 1e-9 {
			t.Errorf("SaturatedCPU %v, reading %v: excess %v, want %v", c.sat, c.cpu, got, c.want)
		}
	}
}

// Onset: a step before the interval is over, only for a queue over twice
// its target, of MinSamples calls or more, without a rate, a quarter of an
// interval after the last step.
func TestLawOnset(t *testing.T) {
	var l Law
	c, now := probed(t, l, 3*ms) // target 9 ms
	now = now.Add(DefaultInterval / 4)
	n := DefaultMinSamples
	if !l.Onset(c, n, n, 19*ms, now) {
		t.Error("Onset = false for 8 calls completed and 8 queued 19 ms, 25 ms after the last step")
	}
	for _, tc := range []struct {
		name  string
		c     Control
		n, qn int
		qd    time.Duration
		now   time.Time
	}{
		{"before the first step", Control{}, n, n, 19 * ms, now},
		{"with a rate in force", func() Control { r := c; r.Rate = 100; return r }(), n, n, 19 * ms, now},
		{"too few calls queued", c, n, n - 1, 19 * ms, now},
		{"too few calls completed", c, n - 1, n, 19 * ms, now},
		{"a queue within twice the target", c, n, n, 18 * ms, now},
		{"too soon after the last step", c, n, n, 19 * ms, now.Add(-ms)},
	} {
		if l.Onset(tc.c, tc.n, tc.qn, tc.qd, tc.now) {
			t.Errorf("%s: Onset = true", tc.name)
		}
	}
}
