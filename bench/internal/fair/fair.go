// Package fair computes the reference shares the experiments measure
// against.
package fair

import (
	"cmp"
	"slices"
)

// MaxMin returns the max-min fair shares of capacity (clamped at 0) among
// demands: every demand below an equal part of what is left gets all it
// wants, and the rest share the remainder equally. A demand of 0 or less
// gets nothing.
func MaxMin(capacity float64, demands []float64) []float64 {
	shares := make([]float64, len(demands))
	idx := make([]int, 0, len(demands))
	for i, d := range demands {
		if d > 0 {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(demands[a], demands[b]) })
	left := max(capacity, 0)
	for k, i := range idx {
		shares[i] = min(demands[i], left/float64(len(idx)-k))
		left -= shares[i]
	}
	return shares
}
