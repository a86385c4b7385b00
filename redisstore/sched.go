package redisstore

import (
	"math"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// A process whose CPUs are saturated (say, callers spinning on decisions
// that the deny cache or the fallback make for free) runs a goroutine long
// after it became runnable: with two CPUs and a few dozen busy goroutines,
// the one whose reply from Redis has arrived can wait hundreds of
// milliseconds, and its read then misses the deadline although Redis
// answered in time. Blaming Redis for that opens the breaker; the breaker's
// probes miss their deadline for the same reason, so it stays open while
// the fallback, being cheap, keeps the CPUs saturated; and every decision
// the fallback makes beside a healthy Redis is one the shared bucket does
// not count.
//
// schedWatch tells the two apart. It reads the runtime's histogram of how
// long runnable goroutines waited for a CPU (/sched/latencies:seconds) at
// most once per schedWindow, on the goroutine that asks, and keeps the
// longest wait seen in each of the last schedWindows windows. Reading it
// costs about 150 ns and allocates nothing.
type schedWatch struct {
	next  atomic.Int64 // ns since monoBase when the next sample is due
	delay atomic.Int64 // ns: the longest wait in the last two windows

	mu     sync.Mutex
	sample [1]metrics.Sample
	prev   []uint64
	ring   [schedWindows]schedSpan
	pos    int
}

// schedSpan is the longest wait that ended in (start, end].
type schedSpan struct {
	start, end, longest int64 // ns since monoBase
}

const (
	schedWindow  = 10 * time.Millisecond
	schedWindows = 64
	staleWindow  = 2 * time.Second
)

// sched is process-wide, as the histogram it reads is.
var sched = schedWatch{sample: [1]metrics.Sample{{Name: "/sched/latencies:seconds"}}}

// recent returns the longest scheduling delay of the last two windows,
// sampling first when the last sample is older than a window.
func (w *schedWatch) recent() time.Duration {
	if now := int64(time.Since(monoBase)); now >= w.next.Load() && w.mu.TryLock() {
		w.read(now)
		w.mu.Unlock()
	}
	return time.Duration(w.delay.Load())
}

// since samples now and returns the longest scheduling delay that ended
// after start (ns since monoBase), as far back as the windows reach.
func (w *schedWatch) since(start int64) time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.read(int64(time.Since(monoBase)))
	var longest int64
	for _, sp := range w.ring {
		if sp.end > start {
			longest = max(longest, sp.longest)
		}
	}
	return time.Duration(longest)
}

func (w *schedWatch) read(now int64) {
	metrics.Read(w.sample[:])
	if w.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		w.next.Store(math.MaxInt64) // not on this runtime: never starved
		return
	}
	h := w.sample[0].Value.Float64Histogram()
	var longest int64
	if len(w.prev) == len(h.Counts) {
		for i := len(h.Counts) - 1; i >= 0; i-- {
			if h.Counts[i] != w.prev[i] {
				// The bucket's upper bound; the last one's is +Inf.
				up := h.Buckets[i+1]
				if math.IsInf(up, 1) {
					up = h.Buckets[i]
				}
				longest = int64(up * 1e9)
				break
			}
		}
	}
	w.prev = append(w.prev[:0], h.Counts...)
	last := w.ring[w.pos]
	w.pos = (w.pos + 1) % schedWindows
	w.ring[w.pos] = schedSpan{start: last.end, end: now, longest: longest}
	// A window over which nobody asked for seconds (an idle process) may
	// hold a wait from long ago, and stretching calls by it now would only
	// wait for a slow Redis in vain: it does not count as recent. A
	// starved process asks late too, but not that late.
	switch {
	case now-last.end > int64(staleWindow):
		w.delay.Store(0)
	case last.end-last.start > int64(staleWindow):
		w.delay.Store(longest)
	default:
		w.delay.Store(max(longest, last.longest))
	}
	w.next.Store(now + int64(schedWindow))
}

// maxStretch bounds how far the store stretches Redis's budget while the
// process is starved.
const maxStretch = time.Second

// starved reports whether a scheduling delay d can make this store's calls
// miss their budget: it is a quarter of it or more.
func (s *Store) starved(d time.Duration) bool { return d >= s.budget/4 }

// stretch returns how much longer than its budget a call may wait for Redis
// now: twice the scheduling delay while the process is starved, else 0.
func (s *Store) stretch() time.Duration {
	if d := sched.recent(); s.starved(d) {
		return min(2*d, maxStretch)
	}
	return 0
}
