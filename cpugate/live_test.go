package cpugate

import (
	"errors"
	"math"
	"runtime"
	"testing"
	"time"
)

// burn keeps one CPU busy for d of wall time, so live samplers have
// something to see. It spins rather than sleeps: the point is to use CPU.
func burn(d time.Duration) {
	x := 1.0
	for start := time.Now(); time.Since(start) < d; {
		for range 1000 {
			x = math.Sqrt(x + 1)
		}
	}
	runtime.KeepAlive(x)
}

// burnCPU spins until this process has used d more CPU time. On a shared
// machine that may take longer than d; the CPU time is what is certain.
func burnCPU(t *testing.T, d time.Duration) {
	t.Helper()
	start, err := processCPUTime()
	if err != nil {
		t.Skip(err)
	}
	for {
		burn(time.Millisecond)
		if now, _ := processCPUTime(); now-start >= d {
			return
		}
	}
}

func sane(t *testing.T, name string, r Reading, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: Sample() error = %v", name, err)
	}
	if !(r.CPU >= 0 && r.CPU <= 1) {
		t.Errorf("%s: Sample().CPU = %v, want within [0, 1]", name, r.CPU)
	}
	t.Logf("%s: %+v", name, r)
}

// TestNewSamplerLive runs the chosen sampler on this machine: it must name
// itself and read twice with sane values.
func TestNewSamplerLive(t *testing.T) {
	s, source, err := NewSampler()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NewSampler chose %q (%T)", source, s)
	for range 2 {
		burn(30 * time.Millisecond)
		r, err := s.Sample()
		sane(t, source, r, err)
		if r.Source != source {
			t.Errorf("Reading.Source = %q, want %q", r.Source, source)
		}
	}
	if c, ok := s.(*CgroupSampler); ok {
		if b, most := c.Budget(), min(affinityCPUs(), runtime.GOMAXPROCS(0)); !(b > 0 && b <= float64(most)) {
			t.Errorf("Budget() = %v, want within (0, %d], the smaller of the affinity count and GOMAXPROCS", b, most)
		}
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}
}

func TestCgroupSamplerLive(t *testing.T) {
	s, err := NewCgroupSampler()
	if errors.Is(err, ErrNoCgroup) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	burn(30 * time.Millisecond)
	r, err := s.Sample()
	sane(t, s.Source(), r, err)
	t.Logf("budget %v CPUs", s.Budget())
}

func TestProcessSamplerLive(t *testing.T) {
	start := time.Now()
	s, err := newProcessSampler(start, liveLimits)
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.CPUs(), min(affinityCPUs(), runtime.GOMAXPROCS(0)); got != want || got < 1 {
		t.Errorf("CPUs() = %d, want the smaller of the affinity count and GOMAXPROCS, %d", got, want)
	}
	const spin = 30 * time.Millisecond
	burnCPU(t, spin)
	end := time.Now()
	r, err := s.sampleAt(end)
	sane(t, SourceProcess, r, err)
	// However little of the machine this test got, it spent spin of CPU
	// time: the reading times the wall time and the CPUs must cover it.
	seen := time.Duration(r.CPU * float64(end.Sub(start)) * float64(s.CPUs()))
	if seen < spin {
		t.Errorf("reading %v over %v on %d CPUs is %v of CPU time, want at least the %v spun",
			r.CPU, end.Sub(start), s.CPUs(), seen, spin)
	}
}

func TestHostSamplerLive(t *testing.T) {
	s, err := NewHostSampler()
	if err != nil {
		t.Fatal(err)
	}
	burn(50 * time.Millisecond) // /proc/stat moves in 10 ms ticks
	r, err := s.Sample()
	sane(t, SourceHost, r, err)
}

func TestSchedGuardLive(t *testing.T) {
	inner := SamplerFunc(func() (Reading, error) { return Reading{CPU: 0.5, Source: "inner"}, nil })
	g := NewSchedGuard(inner)
	// More runnable goroutines than Ps for 20 ms: some waited. The runtime
	// samples scheduling latencies rather than recording each, so a round
	// may record too few waits to move the 99th percentile: up to five
	// rounds, each read on its own.
	var r Reading
	for round := 0; round < 5 && r.SchedP99 <= 0; round++ {
		done := make(chan struct{})
		for range 4 * runtime.GOMAXPROCS(0) {
			go func() { burn(20 * time.Millisecond); done <- struct{}{} }()
		}
		for range 4 * runtime.GOMAXPROCS(0) {
			<-done
		}
		var err error
		r, err = g.Sample()
		if err != nil || r.CPU != 0.5 || r.Source != "inner" {
			t.Fatalf("Sample() = %+v, %v, want the inner reading", r, err)
		}
	}
	if r.SchedP99 <= 0 {
		t.Errorf("SchedP99 = %v after oversubscribing the scheduler five times, want > 0", r.SchedP99)
	}
	t.Logf("sched p99 %v", r.SchedP99)

	failing := NewSchedGuard(SamplerFunc(func() (Reading, error) { return Reading{}, ErrNoReading }))
	if _, err := failing.Sample(); !errors.Is(err, ErrNoReading) {
		t.Errorf("Sample() with a failing inner sampler: error = %v, want ErrNoReading", err)
	}
}

func TestP99Delta(t *testing.T) {
	buckets := []float64{math.Inf(-1), 0.001, 0.002, 0.004, math.Inf(1)}
	tests := []struct {
		name      string
		prev, cur []uint64
		want      float64
	}{
		{"nothing new", []uint64{5, 5, 5, 5}, []uint64{5, 5, 5, 5}, 0},
		{"all fast", []uint64{0, 0, 0, 0}, []uint64{0, 100, 0, 0}, 0.002},
		{"1% slow is the p99", []uint64{0, 0, 0, 0}, []uint64{0, 99, 0, 1}, 0.002},
		{"2% slow", []uint64{0, 0, 0, 0}, []uint64{0, 98, 0, 2}, 0.004},
		{"only the delta counts", []uint64{0, 0, 0, 1000}, []uint64{0, 100, 0, 1000}, 0.002},
		{"open last bucket reports its lower bound", []uint64{0, 0, 0, 0}, []uint64{0, 0, 0, 3}, 0.004},
	}
	for _, tt := range tests {
		if got := p99Delta(buckets, tt.prev, tt.cur); got != tt.want {
			t.Errorf("%s: p99Delta() = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestFraction(t *testing.T) {
	tests := []struct {
		busy, wall time.Duration
		cpus, want float64
	}{
		{time.Second, time.Second, 2, 0.5},
		{3 * time.Second, time.Second, 2, 1}, // reported as 1
		{-time.Second, time.Second, 2, 0},    // never negative
		{150 * time.Millisecond, time.Second, 0.5, 0.3},
	}
	for _, tt := range tests {
		if got := fraction(tt.busy, tt.wall, tt.cpus); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("fraction(%v, %v, %v) = %v, want %v", tt.busy, tt.wall, tt.cpus, got, tt.want)
		}
	}
}
