package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestBucketsTileTheDurations(t *testing.T) {
	// Consecutive buckets meet without a gap or an overlap, and every value
	// falls in the bucket whose range holds it.
	for i := 0; i+1 < histBuckets; i++ {
		_, hi := bucketRange(i)
		lo, _ := bucketRange(i + 1)
		if lo != hi+1 {
			t.Fatalf("bucketRange(%d).hi = %d, bucketRange(%d).lo = %d: want adjacent", i, hi, i+1, lo)
		}
	}
	for _, v := range []time.Duration{0, 1, 63, 64, 65, 127, 128, 129, 1000, 1 << 20, time.Millisecond, 3 * time.Second, 1<<36 - 1} {
		lo, hi := bucketRange(bucketOf(v))
		if v < lo || v > hi {
			t.Errorf("bucketOf(%d) = %d holding [%d, %d]", v, bucketOf(v), lo, hi)
		}
		if v >= histSub && float64(hi-lo+1)/float64(lo) > 1.0/histSub {
			t.Errorf("bucket of %d is [%d, %d]: wider than 1/%d of its values", v, lo, hi, histSub)
		}
	}
	if got, want := bucketOf(time.Hour), histBuckets-1; got != want {
		t.Errorf("bucketOf(1h) = %d, want the last bucket %d", got, want)
	}
	if got := bucketOf(-5); got != 0 {
		t.Errorf("bucketOf(-5) = %d, want 0", got)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	// 1µs, 2µs, …, 10000µs: the q-quantile is q × 10ms.
	for i := 1; i <= 10000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	if got, want := h.Count(), uint64(10000); got != want {
		t.Errorf("Count() = %d, want %d", got, want)
	}
	for _, q := range []float64{0.01, 0.25, 0.5, 0.9, 0.99, 0.999} {
		want := time.Duration(q*10000) * time.Microsecond
		got := h.Quantile(q)
		if rel := math.Abs(float64(got-want)) / float64(want); rel > 1.0/(2*histSub)+1e-9 {
			t.Errorf("Quantile(%v) = %v, want %v within 1/%d (off by %.4f)", q, got, want, 2*histSub, rel)
		}
	}
	if got, want := h.Quantile(0), time.Microsecond; got != want {
		t.Errorf("Quantile(0) = %v, want the smallest sample %v", got, want)
	}
	if got, want := h.Quantile(1), 10*time.Millisecond; got != want {
		t.Errorf("Quantile(1) = %v, want the largest sample %v", got, want)
	}
	if got, want := h.Mean(), 5000500*time.Nanosecond; got != want {
		t.Errorf("Mean() = %v, want %v", got, want)
	}
}

func TestHistogramSmallValuesAreExact(t *testing.T) {
	var h Histogram
	for _, v := range []time.Duration{3, 7, 7, 40} {
		h.Record(v)
	}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.25, 3}, {0.5, 7}, {0.75, 7}, {1, 40}} {
		if got := h.Quantile(tc.q); got != tc.want {
			t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
}

func TestHistogramEmptyAndMerge(t *testing.T) {
	var empty Histogram
	if got := empty.Quantile(0.99); got != 0 {
		t.Errorf("empty Quantile(0.99) = %v, want 0", got)
	}
	if got := empty.Mean(); got != 0 {
		t.Errorf("empty Mean() = %v, want 0", got)
	}

	var a, b, all Histogram
	for i := range 1000 {
		d := time.Duration(i*i) * time.Microsecond
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	a.Merge(&b)
	a.Merge(&empty)
	if diff := cmp.Diff(all, a, cmp.AllowUnexported(Histogram{})); diff != "" {
		t.Errorf("merged halves differ from one histogram of everything (-want +got):\n%s", diff)
	}
	a.Reset()
	if got := a.Count(); got != 0 {
		t.Errorf("Count() after Reset = %d, want 0", got)
	}
}

func TestClassify(t *testing.T) {
	overload := status.New(codes.Unavailable, "overloaded")
	overload, err := overload.WithDetails(&errdetails.ErrorInfo{Reason: "OVERLOADED", Domain: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		err  error
		want Outcome
	}{
		{nil, OutcomeOK},
		{status.Error(codes.ResourceExhausted, "over quota"), OutcomeQuota},
		{overload.Err(), OutcomeOverload},
		// A bare UNAVAILABLE is the transport's, not a rejection.
		{status.Error(codes.Unavailable, "connection refused"), OutcomeError},
		{status.Error(codes.DeadlineExceeded, "late"), OutcomeDeadline},
		{status.FromContextError(context.DeadlineExceeded).Err(), OutcomeDeadline},
		{status.Error(codes.FailedPrecondition, "insufficient stock"), OutcomeError},
		{errDropped, OutcomeDropped},
		{fmt.Errorf("wrapped: %w", errDropped), OutcomeDropped},
		{errors.New("other"), OutcomeError},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestCallerStatsRollAndTotals(t *testing.T) {
	var s callerStats
	for range 5 {
		s.offered()
		s.attempt()
	}
	s.attempt() // one retry
	s.done(OutcomeOK, 2*time.Millisecond)
	s.done(OutcomeOK, 4*time.Millisecond)
	s.done(OutcomeQuota, time.Millisecond)
	s.done(OutcomeOverload, time.Millisecond)
	s.done(OutcomeDropped, 0)

	want := Counts{Offered: 5, Attempts: 6}
	want.By[OutcomeOK], want.By[OutcomeQuota], want.By[OutcomeOverload], want.By[OutcomeDropped] = 2, 1, 1, 1
	w, h := s.roll()
	if diff := cmp.Diff(want, w); diff != "" {
		t.Errorf("roll() counts (-want +got):\n%s", diff)
	}
	// Only admitted calls have a latency.
	if got, want := h.Count(), uint64(2); got != want {
		t.Errorf("roll() latency samples = %d, want %d", got, want)
	}
	if got, want := w.Shed(), uint64(2); got != want {
		t.Errorf("Shed() = %d, want %d", got, want)
	}
	if got, want := w.Sent(), uint64(4); got != want {
		t.Errorf("Sent() = %d, want %d (the dropped call was never sent)", got, want)
	}

	s.offered()
	s.done(OutcomeDeadline, time.Second)
	w, h = s.roll()
	wantWindow := Counts{Offered: 1}
	wantWindow.By[OutcomeDeadline] = 1
	if diff := cmp.Diff(wantWindow, w); diff != "" {
		t.Errorf("second roll() counts (-want +got):\n%s", diff)
	}
	if got := h.Count(); got != 0 {
		t.Errorf("second roll() latency samples = %d, want 0", got)
	}

	total, lat := s.totals()
	want.add(wantWindow)
	if diff := cmp.Diff(want, total); diff != "" {
		t.Errorf("totals() counts (-want +got):\n%s", diff)
	}
	if got, want := lat.Quantile(1), 4*time.Millisecond; got != want {
		t.Errorf("totals() max latency = %v, want %v", got, want)
	}
}
