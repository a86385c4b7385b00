package cpugate

import (
	"math"
	"runtime/metrics"
	"time"
)

const schedLatencies = "/sched/latencies:seconds"

// A SchedGuard wraps a [Sampler] and adds the guard signal to its readings:
// [Reading.SchedP99], the 99th percentile of the time goroutines spent
// runnable but not running during the interval, from the runtime/metrics
// histogram /sched/latencies:seconds.
//
// CPU use alone misses saturation it cannot see: a noisy neighbour on the
// host, or CPU throttling inside a quota period. Goroutines waiting to run
// see both. The guard is off by default because what counts as too slow
// depends on the service: set [Fixed.SchedP99] or [Adaptive.SchedP99] to
// turn it on.
//
// The histogram is cumulative since the program started, so the guard keeps
// the previous counts and takes the percentile of the difference. A
// SchedGuard is not safe for concurrent use.
type SchedGuard struct {
	inner   Sampler
	sample  [1]metrics.Sample
	prev    []uint64
	buckets []float64
}

// NewSchedGuard returns a SchedGuard around inner. Its first reading covers
// the time since this call.
func NewSchedGuard(inner Sampler) *SchedGuard {
	g := &SchedGuard{inner: inner}
	g.sample[0].Name = schedLatencies
	metrics.Read(g.sample[:])
	if g.sample[0].Value.Kind() == metrics.KindFloat64Histogram {
		h := g.sample[0].Value.Float64Histogram()
		g.prev = append([]uint64(nil), h.Counts...)
		g.buckets = h.Buckets // never changes for a given metric
	}
	return g
}

// Sample returns inner's reading with SchedP99 set. A failed inner read is
// returned as is; the latency baseline still moves on, so each reading's
// percentile covers one interval.
func (g *SchedGuard) Sample() (Reading, error) {
	r, err := g.inner.Sample()
	r.SchedP99 = g.p99()
	return r, err
}

// p99 reads the histogram and returns the 99th percentile of the counts
// added since the previous call, or 0 when nothing was scheduled.
func (g *SchedGuard) p99() time.Duration {
	if g.prev == nil {
		return 0
	}
	metrics.Read(g.sample[:])
	cur := g.sample[0].Value.Float64Histogram().Counts
	p := p99Delta(g.buckets, g.prev, cur)
	copy(g.prev, cur)
	return time.Duration(p * float64(time.Second))
}

// p99Delta returns the 99th percentile of the histogram cur minus prev, as
// the upper bound of the bucket holding it (an upper bound errs toward
// caution), or 0 for an empty difference.
func p99Delta(buckets []float64, prev, cur []uint64) float64 {
	var total uint64
	for i, c := range cur {
		total += c - prev[i]
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(0.99 * float64(total)))
	var seen uint64
	for i, c := range cur {
		if seen += c - prev[i]; seen >= rank {
			return upperBound(buckets, i)
		}
	}
	return 0 // unreachable: seen reaches total
}

// upperBound returns the upper bound of bucket i, or its lower bound for the
// last bucket, whose upper bound is +Inf.
func upperBound(b []float64, i int) float64 {
	if u := b[i+1]; !math.IsInf(u, 1) {
		return u
	}
	return b[i]
}
