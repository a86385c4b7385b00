package floodgate

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// MaxBurst is the largest burst a [Limit] may have. Stores keep tokens as
// fixed-point integers in units of 1e-9 token, and this bound keeps a full
// bucket within an int64.
const MaxBurst = 1 << 33

// ErrInvalidLimit is wrapped by every error that [Limit.Validate] returns.
var ErrInvalidLimit = errors.New("floodgate: invalid limit")

// A Limit is the shape of a token bucket: it holds at most Burst tokens and
// gains Rate tokens per second.
//
// The zero Limit admits nothing. A Limit with a zero Rate and a positive Burst
// admits Burst events in all and never refills. [Inf] (an infinite Rate)
// admits every event, whatever its Burst. A Limit is a small value: copy it
// freely.
type Limit struct {
	// Rate is the refill rate in tokens per second: finite and ≥ 0, or +Inf.
	Rate float64
	// Burst is the bucket's capacity in tokens, 0 ≤ Burst ≤ MaxBurst.
	Burst int
}

// Inf is the unlimited Limit: every take succeeds and no state is kept.
var Inf = Limit{Rate: math.Inf(1)}

// PerSecond returns a Limit of rate tokens per second with the given burst.
func PerSecond(rate float64, burst int) Limit {
	return Limit{Rate: rate, Burst: burst}
}

// Every returns a Limit that gains one token every interval and holds at most
// burst. An interval ≤ 0 means no wait between events: Every returns [Inf].
func Every(interval time.Duration, burst int) Limit {
	if interval <= 0 {
		return Inf
	}
	return Limit{Rate: float64(time.Second) / float64(interval), Burst: burst}
}

// IsInf reports whether l admits every event.
func (l Limit) IsInf() bool { return math.IsInf(l.Rate, 1) }

// IsZero reports whether l admits nothing at all: a zero burst and no
// unlimited rate.
func (l Limit) IsZero() bool { return l.Burst == 0 && !l.IsInf() }

// Scale returns l with its rate and burst multiplied by f. The burst is
// rounded down but never below 1 for a Limit that admits something, so a
// scaled-down limit still admits single events. [Inf] scales to itself. A
// factor ≤ 0 or NaN returns the zero Limit; a factor > 1 raises the limit.
func (l Limit) Scale(f float64) Limit {
	if l.IsInf() {
		return l
	}
	if !(f > 0) { // also NaN
		return Limit{}
	}
	if f == 1 {
		return l
	}
	b := float64(l.Burst) * f
	// A product that should be whole may come out a hair below it (98 ×
	// (1/49) is 1.9999…): snap it, or rounding down would lose a token.
	if r := math.Round(b); math.Abs(b-r) <= 1e-12*r {
		b = r
	}
	burst := MaxBurst
	if b < MaxBurst {
		burst = int(b)
	}
	if burst < 1 && l.Burst > 0 {
		burst = 1
	}
	return Limit{Rate: l.Rate * f, Burst: burst}
}

// Validate reports whether l is a usable limit: Rate is not NaN, not
// negative and not -Inf; Burst is within [0, MaxBurst]; and a positive finite
// Rate comes with a Burst of at least 1 (such a bucket could never admit
// anything; use the zero Limit to admit nothing). The error wraps
// [ErrInvalidLimit].
func (l Limit) Validate() error {
	switch {
	case math.IsNaN(l.Rate):
		return fmt.Errorf("%w: rate is NaN", ErrInvalidLimit)
	case l.Rate < 0:
		return fmt.Errorf("%w: rate %v is negative", ErrInvalidLimit, l.Rate)
	case l.IsInf():
		return nil
	case l.Burst < 0:
		return fmt.Errorf("%w: burst %d is negative", ErrInvalidLimit, l.Burst)
	case l.Burst > MaxBurst:
		return fmt.Errorf("%w: burst %d exceeds %d", ErrInvalidLimit, l.Burst, MaxBurst)
	case l.Rate > 0 && l.Burst == 0:
		return fmt.Errorf("%w: rate %v with burst 0 admits nothing", ErrInvalidLimit, l.Rate)
	}
	return nil
}

// String formats l as "rate/s burst b", or "inf".
func (l Limit) String() string {
	if l.IsInf() {
		return "inf"
	}
	return strconv.FormatFloat(l.Rate, 'g', -1, 64) + "/s burst " + strconv.Itoa(l.Burst)
}

// DurationFor returns how long l takes to gain tokens tokens, rounded up to
// the nanosecond. It returns 0 for tokens ≤ 0 or an unlimited rate, and
// [Never] when the rate is zero or the wait does not fit a Duration.
func (l Limit) DurationFor(tokens float64) time.Duration {
	if !(tokens > 0) || l.IsInf() {
		return 0
	}
	if !(l.Rate > 0) {
		return Never
	}
	ns := math.Ceil(tokens * 1e9 / l.Rate)
	if ns >= float64(Never) {
		return Never
	}
	return time.Duration(ns)
}
