package fair

import (
	"slices"
	"testing"
)

func TestMaxMin(t *testing.T) {
	for _, tc := range []struct {
		capacity float64
		demands  []float64
		want     []float64
	}{
		{100, []float64{10, 100, 300}, []float64{10, 45, 45}},
		{100, []float64{10, 20}, []float64{10, 20}},
		{90, []float64{50, 0, 50}, []float64{45, 0, 45}},
		{-1, []float64{5}, []float64{0}},
	} {
		if got := MaxMin(tc.capacity, tc.demands); !slices.Equal(got, tc.want) {
			t.Errorf("MaxMin(%v, %v) = %v, want %v", tc.capacity, tc.demands, got, tc.want)
		}
	}
}
