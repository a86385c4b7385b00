// Package law is the overload controller's control law, stated here once:
// how many calls the server runs at once (the concurrency limit), how many
// more it holds, how long a call may wait for a slot, and which calls are
// shed at once. It is pure: [Step] maps the previous [State] and what the
// calls measured since to the next State, so a trace of samples replays
// exactly. Package overload holds the calls, their queue and their flows,
// and asks the law each question below.
//
//  1. Run at most a limit of calls at once ([State.Slots]). Calls admitted
//     beyond what the server runs at once do not make it faster: they
//     queue in the Go scheduler, on a lock or in a pool, where no one sees
//     their wait, and every call slows down.
//  2. Hold the slots plus what they complete in the queue target
//     ([State.Places]), counting every call from the moment it enters the
//     server to its end (package overload's Controller.Enter, the tap
//     handle's), and shed the rest before its request is read. A
//     CPU-bound handler runs to its end before the next call's goroutine
//     starts, so a CPU-bound server's queue is the scheduler's run queue,
//     where no interceptor sees it. The target is [Completions]
//     completions' worth of time ([State.Target]), at least [MinTarget] while
//     the server is overloaded, shedding more than [OverloadShare] of the
//     calls offered lately, and [OpenTarget] otherwise ([Floor]), so that a
//     server below its capacity absorbs the bursts of random arrivals.
//  3. The limit starts at what the CPUs run at once (GOMAXPROCS, the
//     controller's [Bounds].Min) and never goes below it. In a step ([Due]:
//     every [Interval] with [MinSamples] completions) in which a call found
//     every slot taken, it grows (by [SlowStart] until the first cut, then
//     by [Growth]) while the step's mean service time stays within
//     [Tolerance] of the least of the last [Window] steps' means (the
//     baseline), and is cut to what the throughput needs at the baseline
//     when it does not: the limit times baseline over mean (Little's law).
//     After a growth that was cut, it holds for [HoldFactor] times as many
//     bound steps as the last such hold, from [FirstHold] up to [MaxHold],
//     before it grows again, so that a server at its capacity rarely slows
//     its calls to probe for more. A step in which no call waited changes
//     nothing, so an idle server is never cut ([Step]).
//  4. A call waits for a slot at most [Patience] targets ([State.MaxWait]),
//     and is shed at once when its deadline leaves less than its expected
//     wait plus the baseline: its work would be wasted
//     ([State.DeadlineWait]).
//  5. An admitted call of [YieldAbove] or more yields the CPU once before it
//     runs ([State.Yields]), so that the connections' readers and writers,
//     which the Go scheduler would run after it, read requests and send
//     replies first.
//
// Each step reads only the server's own calls, not a CPU reading, and
// needs no warm-up. Who is shed when the server is full (fairness among
// flows and priorities) is package overload's, not the law's.
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
	// SlowStartSamples is the fewest completions a step of slow start
	// needs, however few the slots: a step then comes once every slot has
	// completed a call, and four calls keep a step of one slot from
	// doubling on a single call's service time.
	SlowStartSamples = 4
	// Window is how many steps the baseline remembers (1.6 s at least):
	// long enough to hold the service time from before a cut, short
	// enough that a call whose cost rose becomes the new baseline soon.
	Window = 16
	// ThroughputSteps is how many steps the throughput is smoothed over:
	// each step moves it 1/ThroughputSteps of the way to its own rate, so
	// that one step of few calls does not swing the fair split.
	ThroughputSteps = 2
	// Tolerance is how far a step's mean service time may exceed the
	// baseline before the limit is cut: calls that share a CPU or wait on
	// a pool take longer in proportion to how many run at once, so a
	// ratio of 1.5 means a third of the service time is queueing. The
	// cut goes to the baseline, not to Tolerance: were the service time
	// left above the baseline, the baseline (a minimum over a window)
	// would rise to it once the window forgot, and the limit with it.
	Tolerance = 1.5
	// SlowStart is the factor the limit grows by in a bound step within
	// Tolerance before its first cut (TCP's slow start doubles), so that
	// a server started under load finds a pool's size within a few steps.
	SlowStart = 2
	// Growth is the fraction the limit grows by in such a step once it
	// has been cut (at least one slot). A handler that waits on a
	// dependency for 100 ms at 2,000 calls/s needs 200 slots.
	Growth = 0.25
	// FirstHold is how many bound steps the limit holds after the first
	// growth that was cut (a failed probe), and HoldFactor how much
	// longer each failed probe after it makes the next hold: a server
	// whose probes keep failing probes ever more rarely.
	FirstHold  = 1
	HoldFactor = 2
	// MaxHold bounds that hold, in bound steps; a growth that holds ends
	// the holds. A probe above what the server runs at once slows every
	// call for a step (a CPU-bound server's always does), so a server at
	// its capacity probes at most about every 26 s (256 steps of 100 ms),
	// and a pool that grows is found within that.
	MaxHold = 256
	// Completions is how many completions' worth of time the queue holds
	// (the Target): one keeps every slot busy through the gaps between
	// arrivals once the load exceeds the capacity, with MinTarget as the
	// floor for cheap calls, while a call's latency stays within about
	// twice its service time.
	Completions = 1
	// ColdQueue is how many calls per slot may wait before any call has
	// completed, when the latency, and so the queue's cap, is not known:
	// a server started under a burst queues a few rounds of its slots
	// while its first MinSamples calls complete, instead of shedding.
	ColdQueue = 4
	// Patience is how many targets a call waits for a slot before it is
	// shed: a call at the back of a full queue expects to wait about one
	// target, and service times spread around their mean, so one target
	// would shed calls that were about to start.
	Patience = 2
	// MinTarget is the least Target while the server is overloaded: a Go
	// server whose CPU never idles reads its sockets in batches about
	// 10 ms apart (the runtime polls the network then), so a queue
	// shorter than two of those runs dry between batches and the CPU
	// idles while calls are shed.
	MinTarget = 5 * time.Millisecond
	// OpenTarget is the least Target while the server is not overloaded:
	// a server below its capacity absorbs a burst of a few times its
	// slots instead of shedding it, and the first moments of an overload
	// queue calls for no longer than this before shedding begins.
	OpenTarget = 25 * time.Millisecond
	// OverloadShare is the share of the calls offered lately that a
	// server sheds once it is overloaded: a tenth, an offered load a
	// ninth above what it completes. The bursts of random (Poisson)
	// arrivals at 80–90% of a server's capacity shed a few percent at
	// most with OpenTarget, and shed more with MinTarget, which a single
	// shed would otherwise switch to.
	OverloadShare = 0.1
	// YieldAbove is the least baseline at which an admitted call yields
	// the CPU once before it runs. In the Go scheduler, a goroutine just
	// made runnable (a call's, by its connection's reader or by the call
	// before it) runs ahead of those already waiting, the connections'
	// readers and writers among them, and a call of a millisecond or more
	// held them for its whole cost. Below it, the reschedule and the
	// smaller read batches cost more than the call would have held them.
	YieldAbove = time.Millisecond
	// MaxLimit bounds the limit: a handler blocked on something that
	// never shows in its service time must not grow it without end.
	MaxLimit = 10000
)

// A State is the law's memory. The zero State has no limit yet: Step, or
// Start, gives it one.
type State struct {
	// Limit is the concurrency limit: the calls admitted at once.
	Limit float64
	// Latency is the latest step's mean service time, Baseline the least
	// of the last Window steps' means, and Throughput the completions per
	// second, smoothed over ThroughputSteps steps (0 until a step has
	// measured a rate).
	Latency, Baseline time.Duration
	Throughput        float64
	// Last is when the latest step was taken.
	Last time.Time
	// Cut reports whether the limit has been cut: until then it grows by
	// SlowStart in a step where it bound and calls did not queue.
	Cut bool
	// Hold is how many more bound steps the limit holds before it may
	// grow; Backoff, the length of the latest hold (the next failed probe
	// multiplies it by HoldFactor; 0 once a growth has held); Grew,
	// whether the latest change was a growth.
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

// Bounds are the least and the greatest limit (Min ≥ 1).
type Bounds struct{ Min, Max float64 }

// Start returns the state of a new controller at now.
func Start(b Bounds, now time.Time) State { return State{Limit: b.Min, Last: now} }

// Due reports whether a step is due at now after n completions, bound
// telling whether a call found every slot taken since the last: every
// Interval, and the first as soon as there are samples enough, so that a
// server started under load knows its calls' cost within milliseconds.
// During slow start a bound limit steps once every slot has completed a
// call (SlowStartSamples at least), so that it reaches a pool's size
// within a few rounds of calls.
func Due(s State, n int, bound bool, now time.Time) bool {
	if bound && !s.Cut {
		return n >= max(SlowStartSamples, s.Slots())
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
		s.Throughput += (float64(x.N)/dt - s.Throughput) / ThroughputSteps
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
			s.Backoff = min(max(FirstHold, HoldFactor*s.Backoff), MaxHold)
			s.Hold = s.Backoff
		}
		s.Grew = false
	case !s.Cut:
		s.Limit *= SlowStart
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

// Floor returns the least queue target of a server offered offered calls
// lately, of which it shed shed (both counted over the same recent span):
// MinTarget once it sheds more than OverloadShare of them (an overload),
// OpenTarget otherwise.
func Floor(shed, offered float64) time.Duration {
	if shed > OverloadShare*offered {
		return MinTarget
	}
	return OpenTarget
}

// Target returns the queue target: Completions times the time between
// completions when every slot is busy, at least floor. The queue holds what
// the slots complete in it (QueueCap), and a call waits at most Patience
// of it (MaxWait).
func (s State) Target(floor time.Duration) time.Duration {
	return max(floor, time.Duration(Completions*float64(s.Latency)/float64(s.Slots())))
}

// MaxWait returns the longest a call waits for a slot: Patience targets.
func (s State) MaxWait(floor time.Duration) time.Duration { return Patience * s.Target(floor) }

// QueueCap returns how many calls may wait: what the slots complete in the
// target, at least one. Before any call has completed the latency is not
// known, and ColdQueue calls per slot may wait.
func (s State) QueueCap(floor time.Duration) int {
	if s.Latency <= 0 {
		return ColdQueue * s.Slots()
	}
	return max(1, int(math.Ceil(float64(s.Target(floor))*float64(s.Slots())/float64(s.Latency))))
}

// Places returns how many calls the server may hold, from the moment they
// enter to their end: the slots, and the queue's cap.
func (s State) Places(floor time.Duration) int { return s.Slots() + s.QueueCap(floor) }

// DeadlineWait returns how long a call whose deadline is left away may wait
// for a slot, at most wait, behind queued calls: until its deadline less
// the baseline, the time it needs to run as a call that does not queue. It
// returns false when the call should be shed at once, its work wasted:
// when that leaves no more than its expected wait (the calls ahead over
// the slots, at the latest mean service time), or no more than wait if
// that is shorter. The baseline, not the latest mean: a latency inflated
// by an overload must not shed every call that waits, or nothing would
// complete to correct it.
func (s State) DeadlineWait(left, wait time.Duration, queued int) (time.Duration, bool) {
	left -= s.Baseline
	expect := time.Duration(float64(s.Latency) * float64(queued) / float64(s.Slots()))
	if left <= min(expect, wait) {
		return 0, false
	}
	return min(wait, left), true
}

// Yields reports whether an admitted call yields the CPU once before it
// runs: when calls take YieldAbove or more (the baseline). The yield
// belongs to the call's service time: the time a call waits for the CPU
// behind others is the signal that the limit is above what the CPUs run at
// once.
func (s State) Yields() bool { return s.Baseline >= YieldAbove }
