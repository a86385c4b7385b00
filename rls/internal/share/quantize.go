package share

import (
	"math"
	"slices"
)

// Quantize turns rates r (tokens per second) into whole tokens per fill
// interval of fill seconds, out[i] = round(r[i]·fill) by largest remainder,
// such that Σout ≤ floor(c·fill) and each out[i] ≤ ceil(r[i]·fill).
//
// Let x = r·fill, counted as at most 2³²−1, the most a uint32 holds. Every
// out[i] is floor(x[i]) or ceil(x[i]), and Σout is the lesser of
// floor(c·fill) and Σx rounded to the nearest whole token: the tokens beyond
// Σfloor(x) go one each to the largest fractional parts, ties to the lower
// index. Only when the floors alone exceed floor(c·fill), which takes Σr > c,
// are the x first scaled down to sum to floor(c·fill); then each out[i] may
// fall below floor(x[i]), and Σout is floor(c·fill) or a token or two less.
// c is ≥ 0 and fill > 0, both finite; len(out) == len(r).
//
// Quantize panics if c, fill or a rate is out of range or not finite, or if
// len(out) != len(r).
func Quantize(c, fill float64, r []float64, out []uint32) {
	if len(out) != len(r) {
		panic("share: Quantize: len(out) != len(r)")
	}
	if !finiteNonNeg(c) {
		panic("share: Quantize: capacity is negative or not finite")
	}
	if !(fill > 0) || math.IsInf(fill, 1) {
		panic("share: Quantize: fill is not positive or not finite")
	}
	n := len(r)
	if n == 0 {
		return
	}
	for _, v := range r {
		if !finiteNonNeg(v) {
			panic("share: Quantize: rate is negative or not finite")
		}
	}
	// A product that overflows is +Inf, and min makes the bound finite.
	limit := min(math.Floor(c*fill), float64(n)*math.MaxUint32)

	scale := 1.0
	x := func(i int) float64 { return min(r[i]*fill, math.MaxUint32) * scale }
	var sumX, sumF float64
	for i := range r {
		v := x(i)
		sumX += v
		sumF += math.Floor(v)
	}
	total := min(limit, math.Floor(sumX+0.5))
	if sumF > total {
		// Σr > c: the floors alone break the bound. Scaling keeps the
		// shares' ratios; the trim below catches what rounding leaves.
		scale = total / sumX
		sumF = 0
		for i := range r {
			sumF += math.Floor(x(i))
		}
	}
	frac := func(i int) float64 { v := x(i); return v - math.Floor(v) }

	extra := total - sumF // tokens to hand out beyond the floors
	if extra <= 0 {
		for i := range out {
			out[i] = uint32(math.Floor(x(i)))
		}
		trim(out, x, sumF-total)
		return
	}
	// Sort the indices, in out itself so as not to allocate, by fraction
	// descending and index ascending; the first extra of them get a token.
	for i := range out {
		out[i] = uint32(i)
	}
	slices.SortFunc(out, func(a, b uint32) int {
		fa, fb := frac(int(a)), frac(int(b))
		switch {
		case fa > fb:
			return -1
		case fa < fb:
			return 1
		}
		return int(a) - int(b)
	})
	last := int(out[int(min(extra, float64(n)))-1])
	cut := frac(last)
	for i := range out {
		v := x(i)
		f := math.Floor(v)
		// A zero fraction never gets a token, so out[i] ≤ ceil(x[i]) even
		// when rounding made extra exceed the fractions' count.
		if fi := v - f; fi > 0 && (fi > cut || fi == cut && i <= last) {
			f++
		}
		out[i] = uint32(f)
	}
}

// trim takes excess tokens back from out, one at a time from the non-zero
// entry furthest above its x (ties to the higher index). Rounding in
// Quantize's scaling leaves an excess of a token or two at most, so the
// quadratic cost does not matter.
func trim(out []uint32, x func(int) float64, excess float64) {
	for ; excess > 0; excess-- {
		best, over := -1, 0.0
		for i, v := range out {
			if o := float64(v) - x(i); v > 0 && (best < 0 || o >= over) {
				best, over = i, o
			}
		}
		if best < 0 {
			return
		}
		out[best]--
	}
}
