// Package burn spends CPU time on purpose: the simulated work of a request
// in floodgate's examples and overload experiment (pricing, validation,
// serialisation in a real service).
package burn

import (
	"context"
	"crypto/sha256"
	"runtime"
	"time"
)

// A Burner chains SHA-256 over a 32-byte block, a loop the compiler cannot
// skip and whose cost per iteration is steady, and converts durations to
// iterations with a rate calibrated at start. It is safe for concurrent use.
type Burner struct {
	perIter time.Duration // fastest observed time of one iteration, ≥ 1 ns
	sink    byte
}

// block is one iteration's work.
func block(b [32]byte) [32]byte { return sha256.Sum256(b[:]) }

// Calibrate measures the loop. It keeps the fastest of several short runs:
// on a shared machine a run can only be slowed down by other work, never sped
// up, so the fastest is the closest to the loop's own cost. Burning then takes
// about the asked CPU time when the CPU is free, and longer in wall time, as
// real work would, when it is not.
func Calibrate() *Burner {
	const iters, runs = 2000, 9
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var b [32]byte
	best := time.Duration(1<<63 - 1)
	for range runs {
		start := time.Now()
		for range iters {
			b = block(b)
		}
		best = min(best, time.Since(start))
	}
	return &Burner{perIter: max(best/iters, 1), sink: b[0]}
}

// WithPerIteration returns a Burner that takes one iteration to cost d, as
// an earlier Calibrate measured: processes that must burn the same work
// share one calibration instead of each measuring its own.
func WithPerIteration(d time.Duration) *Burner { return &Burner{perIter: max(d, 1)} }

// PerIteration returns the calibrated cost of one iteration.
func (bn *Burner) PerIteration() time.Duration { return bn.perIter }

// chunk is how much work Burn does between two looks at its context.
const chunk = 100 * time.Microsecond

// Burn spends about d of CPU time on the calling goroutine, in chunks, and
// stops early with ctx's error once ctx is done: work for a caller whose
// deadline has passed is wasted, and under overload that waste is what
// turns a queue into a collapse.
func (bn *Burner) Burn(ctx context.Context, d time.Duration) error {
	n := int(d / bn.perIter)
	step := max(int(chunk/bn.perIter), 1)
	var b [32]byte
	b[0] = bn.sink
	for done := 0; done < n; done += step {
		if err := ctx.Err(); err != nil {
			return err
		}
		for range min(step, n-done) {
			b = block(b)
		}
	}
	runtime.KeepAlive(b)
	return nil
}
