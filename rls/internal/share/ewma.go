package share

import "math"

// Default weights of an [EWMA]: a 10× jump in demand reaches 91% of the new
// level in two samples, while a drop takes seven to fall as far, so a
// subscriber is not starved by one quiet interval.
const (
	DefaultUp   = 0.7
	DefaultDown = 0.3
)

// EWMA smooths a subscriber's demand, in requests per second, with a faster
// rise than fall (the zero value uses Up 0.7, Down 0.3).
//
// A sample x above the current value v moves it to v + Up·(x−v), one below
// it to v + Down·(x−v). Up and Down lie in [0, 1]; a zero field means its
// default ([DefaultUp], [DefaultDown]), and 1 follows the samples exactly.
// An EWMA is not safe for concurrent use.
type EWMA struct {
	Up, Down float64
	v        float64
	set      bool
}

// Observe folds sample x in, returns the smoothed value; the first sample is
// taken as it is. It panics if x is negative or not finite, or if Up or Down
// lies outside [0, 1].
func (e *EWMA) Observe(x float64) float64 {
	if !finiteNonNeg(x) {
		panic("share: EWMA.Observe: sample is negative or not finite")
	}
	up, down := weight(e.Up, DefaultUp), weight(e.Down, DefaultDown)
	if !e.set {
		e.v, e.set = x, true
		return e.v
	}
	a := down
	if x > e.v {
		a = up
	}
	e.v += a * (x - e.v)
	return e.v
}

// Value returns the smoothed demand: the last value Observe returned, 0
// before the first sample.
func (e *EWMA) Value() float64 { return e.v }

// weight returns w, or def for a zero w.
func weight(w, def float64) float64 {
	if !(w >= 0 && w <= 1) { // also NaN
		panic("share: EWMA: weight outside [0, 1]")
	}
	if w == 0 {
		return def
	}
	return w
}

// finiteNonNeg reports whether x is a finite number ≥ 0.
func finiteNonNeg(x float64) bool { return x >= 0 && !math.IsInf(x, 1) }
