package share

import "math"

// Divide divides the capacity c (tokens per second, ≥ 0) among subscribers
// whose smoothed demands are d (≥ 0), into out (len(out) == len(d)), by
// Doorman's proportional share with headroom h (≥ 0, 0.1 for 10%).
//
// Each subscriber wants w = d(1+h). With e = c/n the equal part of n
// subscribers:
//
//   - When Σw ≥ c, a subscriber with w ≤ e gets exactly w. The others share
//     what those leave of their equal parts, S = Σ(e−w) over them, in
//     proportion to what they want beyond e: each gets e + (w−e)·min(1, S/X),
//     where X = Σ(w−e) over them, so at least e and at most w.
//   - When Σw < c, everyone gets what it wants and the slack is spread in
//     proportion to demand: each gets c·d/Σd, at least w (equally
//     c/n when all demands are 0).
//
// So Σout ≤ c up to floating-point rounding (about n ulps of c), out[i] ≥ 0,
// a subscriber wanting no more than an equal part gets at least all it
// wants, raising one demand never lowers its own share, and equal demands get
// equal shares. The division is continuous in d: at Σw = c both cases give
// every subscriber w.
//
// Divide panics if c, h or a demand is negative or not finite, if Σw
// overflows, or if len(out) != len(d).
func Divide(c float64, d []float64, h float64, out []float64) {
	if len(out) != len(d) {
		panic("share: Divide: len(out) != len(d)")
	}
	if !finiteNonNeg(c) {
		panic("share: Divide: capacity is negative or not finite")
	}
	if !finiteNonNeg(h) {
		panic("share: Divide: headroom is negative or not finite")
	}
	n := len(d)
	if n == 0 {
		return
	}
	k := 1 + h
	var sumD, sumW float64
	for _, x := range d {
		if !finiteNonNeg(x) {
			panic("share: Divide: demand is negative or not finite")
		}
		sumD += x
		sumW += x * k
	}
	if math.IsInf(sumW, 1) {
		panic("share: Divide: demands overflow")
	}

	if sumW < c {
		if sumD == 0 {
			e := c / float64(n)
			for i := range out {
				out[i] = e
			}
			return
		}
		for i, x := range d {
			// c·(x/Σd) rather than c·x/Σd: the product could overflow.
			// max guards "at least w" against rounding.
			out[i] = max(c*(x/sumD), x*k)
		}
		return
	}

	e := c / float64(n)
	var spare, extra float64 // S and X above
	for _, x := range d {
		if w := x * k; w <= e {
			spare += e - w
		} else {
			extra += w - e
		}
	}
	r := 1.0
	if extra > spare { // Σw ≥ c makes X ≥ S but for rounding
		r = spare / extra
	}
	for i, x := range d {
		w := x * k
		if w <= e {
			out[i] = w
			continue
		}
		// min guards "at most w": e + (w−e) may round above w.
		out[i] = min(e+(w-e)*r, w)
	}
}
