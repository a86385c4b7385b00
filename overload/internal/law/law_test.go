package law

import (
	"testing"
	"time"
)

var (
	t0 = time.Unix(1e9, 0)
	b  = Bounds{Min: 1, Max: 100}
)

// steps feeds s one sample per Interval, each of 20 calls of mean latency
// ms, bound or not, and returns the state after the last.
func steps(s State, n int, ms float64, bound bool) State {
	for range n {
		now := s.Last.Add(Interval)
		s = Step(s, Sample{N: 20, Sum: time.Duration(20 * ms * float64(time.Millisecond)), Bound: bound}, b, now)
	}
	return s
}

func TestStep(t *testing.T) {
	t.Run("grows while bound and within tolerance", func(t *testing.T) {
		s := steps(Start(b, t0), 1, 2, true)
		if got, want := s.Limit, 2.0; got != want {
			t.Errorf("Limit after one bound step = %v, want %v", got, want)
		}
		if s.Cut {
			t.Error("Cut after a step that grew the limit")
		}
		s = steps(s, 5, 2, true)
		// Slow start: it doubles until the first cut.
		if got, want := s.Limit, 64.0; got != want {
			t.Errorf("Limit after six bound steps = %v, want %v", got, want)
		}
		s = steps(s, 1, 4, true) // a cut: 64 × 2/4
		s = steps(s, 1, 2, true) // a step's hold: the growth before was cut
		s = steps(s, 2, 2, true) // then a quarter a step
		if got, want := s.Limit, 32*1.25*1.25; got < want-1e-9 || got > want+1e-9 {
			t.Errorf("Limit two steps after the hold = %v, want %v", got, want)
		}
	})
	t.Run("holds when not bound", func(t *testing.T) {
		s := steps(Start(b, t0), 1, 2, true)
		s = steps(s, 10, 50, false) // slow calls, but nothing waited
		if got, want := s.Limit, 2.0; got != want {
			t.Errorf("Limit = %v, want %v: a step without a waiting call must not move it", got, want)
		}
	})
	t.Run("cuts to what the throughput needs at the baseline", func(t *testing.T) {
		s := Start(Bounds{Min: 1, Max: 100}, t0)
		s.Limit = 10
		s = steps(s, 1, 2, true) // baseline 2 ms
		s.Limit = 20
		s = steps(s, 1, 6, true) // three times the baseline
		if got, want := s.Limit, 20.0/3; got < want-1e-9 || got > want+1e-9 {
			t.Errorf("Limit = %v, want %v", got, want)
		}
	})
	t.Run("never below the least or above the most", func(t *testing.T) {
		s := steps(Start(Bounds{Min: 2, Max: 3}, t0), 1, 2, true)
		s = Step(s, Sample{N: 20, Sum: 20 * 100 * time.Millisecond, Bound: true}, Bounds{Min: 2, Max: 3}, s.Last.Add(Interval))
		if got := s.Limit; got != 2 {
			t.Errorf("Limit after a deep cut = %v, want the least, 2", got)
		}
		for range 2 * Window {
			s = Step(s, Sample{N: 20, Sum: 20 * 100 * time.Millisecond, Bound: true}, Bounds{Min: 2, Max: 3}, s.Last.Add(Interval))
		}
		if got := s.Limit; got != 3 {
			t.Errorf("Limit after the cost settled = %v, want the most, 3", got)
		}
	})
	t.Run("a pool's size holds it", func(t *testing.T) {
		// A handler that holds one of 8 connections for 10 ms: beyond 8
		// calls at once, the service time grows with the limit. The
		// limit must settle near 8, and the baseline stay at 10 ms,
		// however long the overload lasts.
		const pool, hold = 8, 10.0
		s := Start(b, t0)
		var most float64
		for i := range 50 * Window {
			ms := hold * max(1, float64(s.Slots())/pool)
			s = steps(s, 1, ms, true)
			if i > 2*Window {
				most = max(most, s.Limit)
			}
		}
		// The most: a limit just short of a slot past where the service
		// time exceeds Tolerance, grown once more.
		if top := (pool*Tolerance + 1) * (1 + Growth); most > top {
			t.Errorf("Limit reached %v, want at most %v for a pool of %d", most, top, pool)
		}
		if s.Limit < pool {
			t.Errorf("Limit = %v, want at least the pool's %d", s.Limit, pool)
		}
		if got, want := s.Baseline, time.Duration(hold*float64(time.Millisecond)); got != want {
			t.Errorf("Baseline = %v, want %v", got, want)
		}
	})
	t.Run("a probe that is cut waits twice as long before the next", func(t *testing.T) {
		// A CPU-bound server on one CPU: every call beyond the first
		// shares it, so every probe above 1 is cut. Probes come after
		// holds of 1, 2, 4, … steps, up to MaxHold.
		s := Start(b, t0)
		probes := 0
		const n = 2000
		for range n {
			grew := s.Limit > 1
			s = steps(s, 1, 2*s.Limit, true)
			if grew {
				probes++
			}
		}
		// Slow start's first doubling, then one probe after each hold.
		var want int
		for hold, left := 1, n; left > 0; hold = min(2*hold, MaxHold) {
			want++
			left -= hold + 2 // the hold, the probe, its cut
		}
		if probes > want+1 || probes < want-1 {
			t.Errorf("%d probes in %d steps, want %d (holds doubling up to %d steps)", probes, n, want, MaxHold)
		}
		if s.Backoff != MaxHold {
			t.Errorf("Backoff = %d after %d failed probes, want the most, %d", s.Backoff, probes, MaxHold)
		}
		// A pool that grows: a probe that holds ends the hold, and the
		// limit then grows a quarter a step.
		s.Hold = 0
		s = steps(s, 1, 2, true) // probe: 1 → 2, within tolerance
		s = steps(s, 1, 2, true) // it held: 2 → 3
		if s.Backoff != 0 || s.Limit != 3 {
			t.Errorf("after a probe that held: Backoff %d, Limit %v; want 0, 3", s.Backoff, s.Limit)
		}
	})
	t.Run("the baseline follows a cost that rose", func(t *testing.T) {
		s := steps(Start(b, t0), 5, 2, true)
		s = steps(s, Window, 4, true)
		if got, want := s.Baseline, 4*time.Millisecond; got != want {
			t.Errorf("Baseline a window after the cost doubled = %v, want %v", got, want)
		}
		s = steps(Start(b, t0), 5, 2, true)
		s = steps(s, Window-1, 4, true)
		if got, want := s.Baseline, 2*time.Millisecond; got != want {
			t.Errorf("Baseline within a window of the change = %v, want %v", got, want)
		}
	})
	t.Run("an empty sample changes nothing", func(t *testing.T) {
		s := steps(Start(b, t0), 3, 2, true)
		if got := Step(s, Sample{Bound: true}, b, s.Last.Add(time.Second)); got != s {
			t.Errorf("Step(empty) = %+v, want %+v", got, s)
		}
	})
}

func TestThroughput(t *testing.T) {
	s := steps(Start(b, t0), 1, 2, false) // 20 calls in 100 ms
	if got, want := s.Throughput, 200.0; got != want {
		t.Errorf("Throughput = %v, want %v", got, want)
	}
	s = Step(s, Sample{N: 40, Sum: 40 * 2 * time.Millisecond}, b, s.Last.Add(Interval))
	if got, want := s.Throughput, 300.0; got != want {
		t.Errorf("Throughput after 400/s = %v, want %v (half way)", got, want)
	}
}

// A step taken at the same instant as the one before (a clock that has not
// moved, as in a test's bubble or at a server's first calls) tells nothing
// of the throughput and must not make it infinite: the next step would
// turn it into NaN, and a NaN throughput holds every flow over its split.
func TestThroughputAfterAnInstantStep(t *testing.T) {
	s := Step(Start(b, t0), Sample{N: 20, Sum: 20 * 2 * time.Millisecond}, b, t0)
	if got := s.Throughput; got != 0 {
		t.Errorf("Throughput after a first step at dt = 0: %v, want 0 (nothing measured)", got)
	}
	s = steps(s, 1, 2, false) // 20 calls in 100 ms
	if got, want := s.Throughput, 200.0; got != want {
		t.Errorf("Throughput a step later = %v, want %v", got, want)
	}
	s = Step(s, Sample{N: 20, Sum: 20 * 2 * time.Millisecond}, b, s.Last)
	if got, want := s.Throughput, 200.0; got != want {
		t.Errorf("Throughput after a later step at dt = 0 = %v, want %v (unchanged)", got, want)
	}
}

func TestDue(t *testing.T) {
	cold := Start(b, t0)
	warm := cold
	warm.Latency = 2 * time.Millisecond
	for _, c := range []struct {
		s    State
		n    int
		at   time.Duration
		want bool
	}{
		{warm, MinSamples, Interval, true},
		{warm, MinSamples - 1, Interval, false},
		{warm, MinSamples, Interval - 1, false},
		{warm, 1000, time.Hour, true},
		// The first step, as soon as there are samples enough.
		{cold, MinSamples, time.Millisecond, true},
		{cold, MinSamples - 1, time.Hour, false},
	} {
		if got := Due(c.s, c.n, false, t0.Add(c.at)); got != c.want {
			t.Errorf("Due(latency %v, n=%d, after %v) = %v, want %v", c.s.Latency, c.n, c.at, got, c.want)
		}
	}
}

func TestTargetAndQueueCap(t *testing.T) {
	for _, c := range []struct {
		limit   float64
		latency time.Duration
		target  time.Duration
		cap     int
	}{
		{1, 0, MinTarget, 4},                                   // nothing measured yet
		{1, 2 * time.Millisecond, MinTarget, 3},                // 5 ms of 2 ms calls
		{1, 500 * time.Microsecond, MinTarget, 10},             // 5 ms of 0.5 ms calls
		{1, 20 * time.Millisecond, 20 * time.Millisecond, 1},   // one completion's worth
		{4, 500 * time.Microsecond, MinTarget, 40},             // four slots of 0.5 ms calls
		{12, 15 * time.Millisecond, MinTarget, 4},              // a pool: 1.25 ms between completions
		{1.9, 20 * time.Millisecond, 20 * time.Millisecond, 1}, // one slot
	} {
		s := State{Limit: c.limit, Latency: c.latency}
		if got := s.Target(MinTarget); got != c.target {
			t.Errorf("Target(limit %v, latency %v) = %v, want %v", c.limit, c.latency, got, c.target)
		}
		if got := s.QueueCap(MinTarget); got != c.cap {
			t.Errorf("QueueCap(limit %v, latency %v) = %v, want %v", c.limit, c.latency, got, c.cap)
		}
	}
}

func TestFloor(t *testing.T) {
	for _, c := range []struct {
		shed, offered float64
		want          time.Duration
	}{
		{0, 0, OpenTarget},
		{0, 100, OpenTarget},
		{10, 100, OpenTarget}, // a tenth: not yet an overload
		{10.5, 100, MinTarget},
		{1, 0, MinTarget},
	} {
		if got := Floor(c.shed, c.offered); got != c.want {
			t.Errorf("Floor(%v shed of %v offered) = %v, want %v", c.shed, c.offered, got, c.want)
		}
	}
}

// A call waits at most Patience targets, less when its deadline comes
// sooner than that plus the time it then needs to run, and none when its
// deadline leaves no more than its expected wait.
func TestWaits(t *testing.T) {
	s := State{Limit: 2, Latency: 20 * time.Millisecond, Baseline: 10 * time.Millisecond}
	if got, want := s.MaxWait(MinTarget), 2*s.Target(MinTarget); got != want {
		t.Fatalf("MaxWait = %v, want %v", got, want)
	}
	if got, want := s.Places(MinTarget), s.Slots()+s.QueueCap(MinTarget); got != want {
		t.Errorf("Places = %v, want %v", got, want)
	}
	wait := s.MaxWait(MinTarget) // 20 ms: two 10 ms targets
	for _, c := range []struct {
		left   time.Duration
		queued int
		want   time.Duration
		ok     bool
	}{
		{time.Second, 4, wait, true},                            // the longest wait
		{25 * time.Millisecond, 0, 15 * time.Millisecond, true}, // its deadline less the baseline
		{40 * time.Millisecond, 4, 20 * time.Millisecond, true}, // 40 ms of expected wait, but within the longest
		{29 * time.Millisecond, 4, 0, false},                    // 19 ms to wait 40 ms, or 20 ms
		{30 * time.Millisecond, 4, 0, false},                    // 20 ms: no more than the longest wait
		{10 * time.Millisecond, 0, 0, false},                    // no time to run
	} {
		got, ok := s.DeadlineWait(c.left, wait, c.queued)
		if got != c.want || ok != c.ok {
			t.Errorf("DeadlineWait(%v left, %d queued) = %v, %v; want %v, %v", c.left, c.queued, got, ok, c.want, c.ok)
		}
	}
}

func TestYields(t *testing.T) {
	if (State{Baseline: YieldAbove - 1}).Yields() || !(State{Baseline: YieldAbove}).Yields() {
		t.Errorf("Yields: want calls of %v or more to yield, and only those", YieldAbove)
	}
}
