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
// gains Rate tokens per second. A bucket may also owe tokens, down to Debt
// below zero, when a [Reservation] settles at more than it reserved.
//
// The zero Limit admits nothing. A Limit with a zero Rate and a positive Burst
// admits Burst events in all and never refills. [Inf] (an infinite Rate)
// admits every event, whatever its Burst. A Limit is a small value: copy it
// freely. A Limit{Rate: r, Burst: b} literal has the default debt limit of
// one burst, which only settles use: takes never go below zero.
type Limit struct {
	// Rate is the refill rate in tokens per second: finite and ≥ 0, or +Inf.
	Rate float64
	// Burst is the bucket's capacity in tokens, 0 ≤ Burst ≤ MaxBurst.
	Burst int
	// Debt is the most tokens the bucket may owe after settles that
	// charged more than was reserved: 0 means one Burst, [NoDebt] means
	// none, and otherwise 1 ≤ Debt ≤ MaxBurst. [Limit.DebtLimit] resolves
	// it. While the bucket owes tokens every take is refused.
	Debt int
}

// NoDebt, as a [Limit]'s Debt, lets no settle take a bucket below zero:
// the part of a charge that the bucket does not hold is not charged.
const NoDebt = -1

// DebtLimit returns the most tokens a bucket under l may owe: Debt, one
// Burst when Debt is 0, and 0 under [NoDebt].
func (l Limit) DebtLimit() int {
	switch {
	case l.Debt == 0:
		return l.Burst
	case l.Debt < 0:
		return 0
	}
	return l.Debt
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

// Scale returns l with its rate, burst and debt limit multiplied by f. The
// burst is rounded down but never below 1 for a Limit that admits
// something, so a scaled-down limit still admits single events; an explicit
// Debt is rounded down but never below 1, and the default (one burst) and
// [NoDebt] stay as they are. [Inf] scales to itself. A factor ≤ 0 or NaN
// returns the zero Limit; a factor > 1 raises the limit.
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
	debt := l.Debt
	if debt > 0 {
		debt = scaleCount(debt, f)
	}
	return Limit{Rate: l.Rate * f, Burst: scaleCount(l.Burst, f), Debt: debt}
}

// scaleCount returns n × f rounded down, at most MaxBurst, and at least 1
// for a positive n.
func scaleCount(n int, f float64) int {
	b := float64(n) * f
	// A product that should be whole may come out a hair below it (98 ×
	// (1/49) is 1.9999…): snap it, or rounding down would lose a token.
	if r := math.Round(b); math.Abs(b-r) <= 1e-12*r {
		b = r
	}
	c := MaxBurst
	if b < MaxBurst {
		c = int(b)
	}
	if c < 1 && n > 0 {
		c = 1
	}
	return c
}

// Validate reports whether l is a usable limit: Rate is not NaN, not
// negative and not -Inf; Burst is within [0, MaxBurst]; a positive finite
// Rate comes with a Burst of at least 1 (such a bucket could never admit
// anything; use the zero Limit to admit nothing); and Debt is [NoDebt], 0
// or within [1, MaxBurst]. [Inf] ignores Burst and Debt. The error wraps
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
	case l.Debt < NoDebt:
		return fmt.Errorf("%w: debt %d is negative and not NoDebt (-1)", ErrInvalidLimit, l.Debt)
	case l.Debt > MaxBurst:
		return fmt.Errorf("%w: debt %d exceeds %d", ErrInvalidLimit, l.Debt, MaxBurst)
	}
	return nil
}

// String formats l as "rate/s burst b", followed by " debt d" or
// " debt none" when Debt is not the default, or as "inf".
func (l Limit) String() string {
	if l.IsInf() {
		return "inf"
	}
	s := strconv.FormatFloat(l.Rate, 'g', -1, 64) + "/s burst " + strconv.Itoa(l.Burst)
	switch {
	case l.Debt == NoDebt:
		s += " debt none"
	case l.Debt != 0:
		s += " debt " + strconv.Itoa(l.Debt)
	}
	return s
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
