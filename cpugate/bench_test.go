package cpugate

import (
	"errors"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
)

func benchGate(b *testing.B) *Gate {
	b.Helper()
	g, err := New(SamplerFunc(func() (Reading, error) { return Reading{CPU: 0.9}, nil }))
	if err != nil {
		b.Fatal(err)
	}
	if err := g.SampleAt(time.Now()); err != nil || g.Scale() != 0.2 {
		b.Fatalf("gate not shedding: %v, %v", g.Scale(), err)
	}
	return g
}

// BenchmarkScale is the request path's cost of the gate.
func BenchmarkScale(b *testing.B) {
	g := benchGate(b)
	b.ReportAllocs()
	for b.Loop() {
		g.Scale()
	}
}

func BenchmarkScaleParallel(b *testing.B) {
	g := benchGate(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			g.Scale()
		}
	})
}

func BenchmarkApply(b *testing.B) {
	g := benchGate(b)
	lim := floodgate.PerSecond(100, 10)
	b.ReportAllocs()
	for b.Loop() {
		g.Apply(lim)
	}
}

// timedSampler is what a benchmark needs of a sampler: a sample at an
// explicit time, so that each iteration covers a whole 250 ms interval as in
// Run and the periodic limit re-reads are amortized as they are in
// production.
type timedSampler interface {
	sampleAt(time.Time) (Reading, error)
}

// BenchmarkSample measures one sample of each sampler on this machine, and
// reports what sampling at the default interval costs as a share of one
// core (4 samples per second).
func BenchmarkSample(b *testing.B) {
	cg, cgErr := NewCgroupSampler()
	if cgErr == nil {
		b.Cleanup(func() { cg.Close() })
	}
	proc, procErr := NewProcessSampler()
	host, hostErr := NewHostSampler()
	chosen, source, chosenErr := NewSampler()

	run := func(name string, err error, sample func(now time.Time) error) {
		b.Run(name, func(b *testing.B) {
			if err != nil {
				b.Skip(err)
			}
			now := time.Now()
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(DefaultInterval)
				if err := sample(now); err != nil && !errors.Is(err, ErrNoReading) {
					b.Fatal(err)
				}
			}
			perOp := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(perOp*float64(time.Second/DefaultInterval)/1e9*100, "%core")
		})
	}
	at := func(s timedSampler) func(time.Time) error {
		return func(now time.Time) error { _, err := s.sampleAt(now); return err }
	}
	run("cgroup", cgErr, at(cg))
	run("process", procErr, at(proc))
	run("host", hostErr, func(time.Time) error { _, err := host.Sample(); return err })
	run("guard", chosenErr, func() func(time.Time) error {
		if chosenErr != nil {
			return nil
		}
		g := NewSchedGuard(chosen)
		return func(time.Time) error { _, err := g.Sample(); return err }
	}())
	// A whole gate tick: the chosen sampler plus the policy step.
	run("gate/"+source, chosenErr, func() func(time.Time) error {
		if chosenErr != nil {
			return nil
		}
		g, err := New(chosen, WithPolicy(Adaptive{}))
		if err != nil {
			b.Fatal(err)
		}
		return g.SampleAt
	}())
}

func BenchmarkObserve(b *testing.B) {
	g, err := New(SamplerFunc(func() (Reading, error) { return Reading{}, nil }), WithPolicy(Adaptive{}))
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	cpus := []float64{0.3, 0.9, 0.7, 0.5}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(DefaultInterval)
		g.Observe(Reading{CPU: cpus[i%len(cpus)]}, now)
		i++
	}
}
