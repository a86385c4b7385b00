package share

import "math"

// Newcomer returns the starting rate of a new subscriber when n already
// share capacity c with reserve rho (a fraction of the limit kept for
// newcomers): min(c/(n+1), rho·limit/4).
//
// The first bound is the equal part the newcomer will have once counted; the
// second lets four newcomers arrive in one round before the reserve is spent.
// limit and c are rates in tokens per second, finite and ≥ 0, rho lies in
// [0, 1] and n ≥ 0; Newcomer panics otherwise.
func Newcomer(limit, c, rho float64, n int) float64 {
	if !finiteNonNeg(limit) || !finiteNonNeg(c) {
		panic("share: Newcomer: rate is negative or not finite")
	}
	if !(rho >= 0 && rho <= 1) {
		panic("share: Newcomer: reserve outside [0, 1]")
	}
	if n < 0 {
		panic("share: Newcomer: negative count")
	}
	return min(c/float64(n+1), rho*limit/4)
}

// Changed reports whether an assignment moved enough to be re-sent (so
// that Envoy, which refills a changed token bucket, is not refilled on
// noise): |new−old| > max(1 token, frac·old).
//
// A move of exactly one token, or of exactly frac·old, is noise. frac is
// finite and ≥ 0 (0.05 for 5%); Changed panics otherwise. It judges one
// assignment alone: a caller must still send a decrease that keeps the sum
// of assignments within capacity.
func Changed(old, new uint32, frac float64) bool {
	if !finiteNonNeg(frac) {
		panic("share: Changed: fraction is negative or not finite")
	}
	diff := math.Abs(float64(new) - float64(old))
	return diff > max(1, frac*float64(old))
}
