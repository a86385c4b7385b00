// Package law is the overload controller's control law: how many calls the
// server runs at once (the concurrency limit), and how long a call may wait
// for one of those slots (the queue target). It is pure: Step maps the
// previous State and what the calls measured since to the next State, so a
// trace of samples replays exactly. Package overload holds the queue.
//
// The law in four sentences:
//
//  1. Run at most Limit calls at once and queue the rest in the controller,
//     where their wait is visible, instead of in the Go scheduler, a pool
//     or a lock, where it is not.
//  2. The Limit starts at what the CPUs can run (GOMAXPROCS) and never goes
//     below it; it grows while the limit binds and a call's service time
//     stays within Tolerance of the least recent one (the baseline), and is
//     cut to what the throughput needs at the baseline (Little's law:
//     the limit times baseline over service time) when it does not. After
//     a growth that was cut, it holds for twice as many steps as the last
//     hold before it grows again (at most MaxHold).
//  3. A call waits at most the Target, a few completions' worth of time and
//     never less than MinTarget, and the queue holds at most what the slots
//     complete in the Target; the rest is shed.
//  4. Nothing changes in a step where the limit did not bind, so an idle
//     server is never cut.
package law

import (
	"math"
	"time"
)

const (
	// Interval is the shortest time between two steps: CoDel's interval,
	// long enough for a mean of many calls, short enough to follow a
	// change of cost within a second.
	Interval = 100 * time.Millisecond
	// MinSamples is how many completions a step needs: the mean of 16
	// service times that vary as much as they average (an exponential
	// spread) is within a quarter of the true mean two times in three.
	MinSamples = 16
	// Window is how many steps the baseline remembers (1.6 s at least):
	// long enough to hold the service time from before a cut, short
	// enough that a call whose cost rose becomes the new baseline soon.
	Window = 16
	// Tolerance is how far a step's mean service time may exceed the
	// baseline before the limit is cut: calls that share a CPU or wait on
	// a pool take longer in proportion to how many run at once, so a
	// ratio of 1.5 means a third of the service time is queueing. The
	// cut goes to the baseline, not to Tolerance: were the service time
	// left above the baseline, the baseline (a minimum over a window)
	// would rise to it once the window forgot, and the limit with it.
	Tolerance = 1.5
	// Growth is the fraction the limit grows by in a step where it bound
	// and calls did not queue (at least one slot), once it has been cut;
	// before, it doubles (TCP's slow start), so that a server started
	// under load finds a pool's size within a few steps. A handler that
	// waits on a dependency for 100 ms at 2,000 calls/s needs 200 slots.
	Growth = 0.25
	// Completions is how many completions' worth of time a call may wait
	// in the queue (the Target): one keeps every slot busy through the
	// gaps between arrivals once the load exceeds the capacity, with
	// MinTarget as the floor for cheap calls, while a call's latency
	// stays within about twice its service time.
	Completions = 1
	// MinTarget is the least Target: a Go server whose CPU never idles
	// reads its sockets in batches about 10 ms apart (the runtime polls
	// the network then), so a queue shorter than two of those runs dry
	// between batches and the CPU idles while calls are shed.
	MinTarget = 5 * time.Millisecond
	// OpenTarget is the least Target while the server is not overloaded
	// (it sheds no more than a tenth of the calls offered lately): a
	// server below its capacity absorbs a burst of a few times its slots
	// instead of shedding it, and the first moments of an overload queue
	// calls for no longer than this before shedding begins.
	OpenTarget = 25 * time.Millisecond
	// MaxLimit bounds the limit: a handler blocked on something that
	// never shows in its service time must not grow it without end.
	MaxLimit = 10000
	// MaxHold bounds the bound steps the limit holds after a growth that
	// was cut (a failed probe) before it grows again: each failed probe
	// doubles the hold, from one step, and a growth that holds resets it.
	// A probe above what the server runs at once slows every call for a
	// step (a CPU-bound server's always does), so a server at its
	// capacity probes at most about every 26 s (256 steps of 100 ms),
	// and a pool that grows is found within that.
	MaxHold = 256
)

// A State is the law's memory. The zero State has no limit yet: Step, or
// Start, gives it one.
type State struct {
	// Limit is the concurrency limit: the calls admitted at once.
	Limit float64
	// Latency is the latest step's mean service time, Baseline the least
	// of the last Window steps' means, and Throughput the completions per
	// second, smoothed over about two steps.
	Latency, Baseline time.Duration
	Throughput        float64
	// Last is when the latest step was taken.
	Last time.Time
	// Cut reports whether the limit has been cut: until then it doubles
	// in a step where it bound and calls did not queue (slow start).
	Cut bool
	// Hold is how many more bound steps the limit holds before it may
	// grow; Backoff, the length of the latest hold (the next failed probe
	// doubles it; 0 once a growth has held); Grew, whether the latest
	// change was a growth.
	Hold, Backoff int
	Grew          bool

	means [Window]time.Duration // recent steps' mean service times, a ring
	i     int                   // the ring's next slot
}

// A Sample is what the admitted calls measured since the previous step.
type Sample struct {
	// N is how many calls completed, Sum their service times added up.
	N   int
	Sum time.Duration
	// Bound reports whether a call found every slot taken.
	Bound bool
}

// Bounds are the least and the greatest limit (MinLimit ≥ 1).
type Bounds struct{ Min, Max float64 }

// Start returns the state of a new controller at now.
func Start(b Bounds, now time.Time) State { return State{Limit: b.Min, Last: now} }

// Due reports whether a step is due at now after n completions, bound
// telling whether a call found every slot taken since the last: every
// Interval, and the first as soon as there are samples enough, so that a
// server started under load knows its calls' cost within milliseconds.
// During slow start a bound limit steps once every slot has completed a
// call (four calls at least), so that it reaches a pool's size within a
// few rounds of calls.
func Due(s State, n int, bound bool, now time.Time) bool {
	if bound && !s.Cut {
		return n >= max(4, s.Slots())
	}
	return n >= MinSamples && (s.Latency == 0 || now.Sub(s.Last) >= Interval)
}

// Step returns the state after sample x, taken at now, within bounds b.
func Step(s State, x Sample, b Bounds, now time.Time) State {
	if x.N <= 0 {
		return s
	}
	dt := now.Sub(s.Last).Seconds()
	s.Last = now
	mean := x.Sum / time.Duration(x.N)
	switch {
	case dt <= 0:
		// No time since the last step (a clock that has not moved): the
		// sample says nothing of a rate, and N/dt would be infinite.
	case s.Throughput == 0:
		s.Throughput = float64(x.N) / dt
	default:
		s.Throughput += (float64(x.N)/dt - s.Throughput) / 2
	}
	s.Latency = mean
	s.means[s.i] = mean
	s.i = (s.i + 1) % Window
	s.Baseline = mean
	for _, m := range s.means {
		if m > 0 && m < s.Baseline {
			s.Baseline = m
		}
	}
	switch r := float64(mean) / float64(max(s.Baseline, 1)); {
	case !x.Bound:
		// Nothing queued for a slot: the limit did not decide anything,
		// so the step has no evidence to move it.
	case r > Tolerance:
		s.Limit /= r
		s.Cut = true
		if s.Grew {
			s.Backoff = min(max(1, 2*s.Backoff), MaxHold)
			s.Hold = s.Backoff
		}
		s.Grew = false
	case !s.Cut:
		s.Limit *= 2
		s.Grew = true
	case s.Hold > 0:
		s.Hold--
		s.Grew = false
	default:
		if s.Grew {
			s.Backoff = 0 // the last growth held: there is room
		}
		s.Limit += max(1, s.Limit*Growth)
		s.Grew = true
	}
	s.Limit = min(max(s.Limit, b.Min), b.Max)
	return s
}

// Slots returns the calls the limit admits at once: at least one.
func (s State) Slots() int { return max(1, int(s.Limit)) }

// Target returns how long a call may wait for a slot: Completions times the
// time between completions when every slot is busy, at least floor.
func (s State) Target(floor time.Duration) time.Duration {
	return max(floor, time.Duration(Completions*float64(s.Latency)/float64(s.Slots())))
}

// QueueCap returns how many calls may wait: what the slots complete in the
// target, at least one. Before any call has completed the latency is not
// known, and four calls per slot may wait.
func (s State) QueueCap(floor time.Duration) int {
	if s.Latency <= 0 {
		return 4 * s.Slots()
	}
	return max(1, int(math.Ceil(float64(s.Target(floor))*float64(s.Slots())/float64(s.Latency))))
}
