package loadgen

import (
	"errors"
	"math"
	"math/bits"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// An Outcome is what became of one scheduled call, as the caller saw it.
type Outcome uint8

const (
	OutcomeOK       Outcome = iota // admitted and served
	OutcomeQuota                   // RESOURCE_EXHAUSTED: the tenant is over its quota
	OutcomeOverload                // UNAVAILABLE with details: the server shed load
	OutcomeDeadline                // DEADLINE_EXCEEDED: the call's deadline passed
	OutcomeError                   // anything else, including a plain UNAVAILABLE
	OutcomeDropped                 // never sent: the caller hit its in-flight cap
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"ok", "quota", "overload", "deadline", "error", "dropped"}

func (o Outcome) String() string { return outcomeNames[o] }

// Classify maps a call's error to its outcome. The codes are the middleware's
// defaults: a quota rejection is RESOURCE_EXHAUSTED, an overload rejection
// UNAVAILABLE carrying an ErrorInfo. A bare UNAVAILABLE, without details, is
// the transport's (a refused or broken connection) and counts as an error, so
// that connection trouble never passes for shedding.
func Classify(err error) Outcome {
	if err == nil {
		return OutcomeOK
	}
	st, ok := status.FromError(err)
	if !ok {
		if errors.Is(err, errDropped) {
			return OutcomeDropped
		}
		return OutcomeError
	}
	switch st.Code() {
	case codes.OK:
		return OutcomeOK
	case codes.ResourceExhausted:
		return OutcomeQuota
	case codes.DeadlineExceeded:
		return OutcomeDeadline
	case codes.Unavailable:
		for _, d := range st.Details() {
			if _, ok := d.(*errdetails.ErrorInfo); ok {
				return OutcomeOverload
			}
		}
	}
	return OutcomeError
}

// errDropped marks an arrival that the generator did not send.
var errDropped = errors.New("loadgen: in-flight cap reached, call not sent")

// Counts holds one counter per outcome, plus the arrivals (offered) and the
// attempts on the wire (more than the calls sent when the client retried).
type Counts struct {
	Offered  uint64
	Attempts uint64
	By       [numOutcomes]uint64
}

func (c *Counts) add(o Counts) {
	c.Offered += o.Offered
	c.Attempts += o.Attempts
	for i := range c.By {
		c.By[i] += o.By[i]
	}
}

// Shed is the number of calls the server refused on purpose.
func (c Counts) Shed() uint64 { return c.By[OutcomeQuota] + c.By[OutcomeOverload] }

// Sent is the number of calls that reached the client library.
func (c Counts) Sent() uint64 {
	var n uint64
	for o, v := range c.By {
		if Outcome(o) != OutcomeDropped {
			n += v
		}
	}
	return n
}

// Histogram counts durations in log-linear buckets: exact below 64 ns, then
// 64 buckets per power of two, so a quantile is within 1/128 (0.8%) of a
// value that was recorded. It holds about 2,000 counters whatever the number
// of samples. The zero Histogram is empty and ready; it is not safe for
// concurrent use.
type Histogram struct {
	buckets  [histBuckets]uint64
	n        uint64
	min, max time.Duration
	sum      time.Duration
}

const (
	histSubBits = 6
	histSub     = 1 << histSubBits
	// Durations from 2^36 ns (about 69 s) up share the last bucket;
	// calls in this program have deadlines far below that.
	histMaxBits = 36
	histBuckets = (histMaxBits - histSubBits + 1) * histSub
)

func bucketOf(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < histSub {
		return int(v)
	}
	shift := bits.Len64(v) - histSubBits - 1
	i := (shift+1)*histSub + int(v>>shift) - histSub
	return min(i, histBuckets-1)
}

// bucketRange returns the smallest and largest duration of bucket i.
func bucketRange(i int) (lo, hi time.Duration) {
	if i < histSub {
		return time.Duration(i), time.Duration(i)
	}
	shift := i/histSub - 1
	base := uint64(i%histSub+histSub) << shift
	return time.Duration(base), time.Duration(base + 1<<shift - 1)
}

// Record adds one duration; negative durations count as 0.
func (h *Histogram) Record(d time.Duration) {
	d = max(d, 0)
	h.buckets[bucketOf(d)]++
	if h.n == 0 || d < h.min {
		h.min = d
	}
	if d > h.max {
		h.max = d
	}
	h.n++
	h.sum += d
}

// Merge adds o's samples to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.buckets {
		h.buckets[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Count returns the number of samples.
func (h *Histogram) Count() uint64 { return h.n }

// Mean returns the mean sample, or 0 for an empty histogram.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of the samples: the midpoint of
// the bucket holding the sample of rank ⌈q·n⌉, kept within the smallest and
// largest sample, which q = 0 and q = 1 return exactly. It returns 0 for an
// empty histogram.
func (h *Histogram) Quantile(q float64) time.Duration {
	switch {
	case h.n == 0:
		return 0
	case q <= 0:
		return h.min
	case q >= 1:
		return h.max
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.buckets {
		seen += c
		if seen >= rank {
			lo, hi := bucketRange(i)
			return min(max(lo+(hi-lo)/2, h.min), h.max)
		}
	}
	return h.max
}

// Reset empties h.
func (h *Histogram) Reset() { *h = Histogram{} }

// callerStats accumulates one simulated caller's outcomes and the latency of
// its admitted calls, both since the start and since the last roll. It is safe
// for concurrent use: calls finish on many goroutines.
type callerStats struct {
	mu            sync.Mutex
	total, window Counts
	totalLat      Histogram
	windowLat     Histogram
}

func (s *callerStats) offered() {
	s.mu.Lock()
	s.total.Offered++
	s.window.Offered++
	s.mu.Unlock()
}

func (s *callerStats) attempt() {
	s.mu.Lock()
	s.total.Attempts++
	s.window.Attempts++
	s.mu.Unlock()
}

// done records a call's outcome; latency counts only for admitted calls,
// since a rejection's latency says nothing about the service.
func (s *callerStats) done(o Outcome, latency time.Duration) {
	s.mu.Lock()
	s.total.By[o]++
	s.window.By[o]++
	if o == OutcomeOK {
		s.totalLat.Record(latency)
		s.windowLat.Record(latency)
	}
	s.mu.Unlock()
}

// roll returns the window's counts and latencies and starts a new window.
func (s *callerStats) roll() (Counts, Histogram) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, h := s.window, s.windowLat
	s.window = Counts{}
	s.windowLat.Reset()
	return c, h
}

// totals returns the counts and latencies since the start.
func (s *callerStats) totals() (Counts, Histogram) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total, s.totalLat
}
