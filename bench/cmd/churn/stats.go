package main

import (
	"slices"
	"time"
)

// A Result is one variant's run of one scenario. A token bucket of rate r
// and burst b admits at most b + r·t in any window of length t; ours
// starts full, so the first second may hold b + r and the windows after
// it should hold r.
type Result struct {
	Variant  string  `json:"variant"`
	Scenario string  `json:"scenario"`
	Replicas int     `json:"replicas"`
	Seconds  float64 `json:"seconds"`
	Events   []Event `json:"events,omitempty"`
	Admitted int     `json:"admitted"`
	Over     int64   `json:"over_limit"`
	Errors   int64   `json:"errors"`
	// Per whole second from the load's start (the last may be partial):
	// admitted, calls started, answers OVER_LIMIT, failed calls.
	PerSecond []int   `json:"admitted_per_s"`
	Calls     []int64 `json:"calls_per_s"`
	OverPerS  []int64 `json:"over_limit_per_s"`
	ErrPerS   []int64 `json:"errors_per_s"`
	// Max1s is the most admitted in a sliding second counting only what
	// came after the first second; Max1sAll counts everything.
	Max1s    int `json:"max_1s"`
	Max1sAll int `json:"max_1s_all"`
	// MaxLong is the most admitted in a sliding window of Long seconds:
	// 10, or the whole run when shorter.
	Long    float64 `json:"long_window_s"`
	MaxLong int     `json:"max_long"`
	// Share is Admitted / (rate·Seconds + burst). Steady is what the
	// seconds after the first admitted, over rate·their length, counting
	// only the seconds in which the callers started 2×rate calls or more:
	// SteadySeconds long.
	Share         float64 `json:"share"`
	Steady        float64 `json:"steady_share"`
	SteadySeconds float64 `json:"steady_seconds"`
	// To95 is the end of the first sliding second, counting what came
	// after the first second, to admit 0.95·rate: 1.95 for a perfect
	// bucket. -1 if none did.
	To95 float64 `json:"to95_s"`
}

// analyse sums up a run of length run: ok holds the receipt time of every
// admitted answer, sorted; calls, over and errs count per whole second.
func analyse(ok []time.Duration, calls, over, errs []int64, run time.Duration) *Result {
	res := &Result{Seconds: run.Seconds(), Admitted: len(ok), Calls: calls, OverPerS: over, ErrPerS: errs,
		PerSecond: make([]int, len(calls)), To95: -1}
	for i := range calls {
		res.Over += over[i]
		res.Errors += errs[i]
	}
	for _, ts := range ok {
		res.PerSecond[ts/time.Second]++
	}
	after := ok[sinceIndex(ok, time.Second):]
	res.Max1s, res.Max1sAll = maxWindow(after, time.Second), maxWindow(ok, time.Second)
	long := min(10*time.Second, run)
	res.Long, res.MaxLong = long.Seconds(), maxWindow(ok, long)
	res.Share = float64(len(ok)) / (rate*run.Seconds() + burst)
	var admitted, allowed float64
	for k := 1; k < len(calls); k++ {
		length := min(run, time.Duration(k+1)*time.Second) - time.Duration(k)*time.Second
		if float64(calls[k]) >= 2*rate*length.Seconds() {
			admitted += float64(res.PerSecond[k])
			allowed += rate * length.Seconds()
			res.SteadySeconds += length.Seconds()
		}
	}
	if allowed > 0 {
		res.Steady = admitted / allowed
	}
	for j, lo := 0, 0; j < len(after); j++ {
		for after[j]-after[lo] >= time.Second {
			lo++
		}
		if j-lo+1 >= int(0.95*rate) {
			res.To95 = after[j].Seconds()
			break
		}
	}
	return res
}

// sinceIndex is the index of the first time in the sorted ts at or after
// from.
func sinceIndex(ts []time.Duration, from time.Duration) int {
	i, _ := slices.BinarySearch(ts, from)
	return i
}

// maxWindow is the most times of the sorted ts within any window (t−w, t]:
// every window that could hold the most ends at one of them.
func maxWindow(ts []time.Duration, w time.Duration) int {
	best := 0
	for j, lo := 0, 0; j < len(ts); j++ {
		for ts[j]-ts[lo] >= w {
			lo++
		}
		best = max(best, j-lo+1)
	}
	return best
}
