package share

import (
	"math"
	"testing"
)

func TestNewcomer(t *testing.T) {
	tests := []struct {
		limit, c, rho float64
		n             int
		want          float64
	}{
		{1000, 980, 0.02, 19, 5}, // reserve bound: 1000·0.02/4
		{1000, 30, 0.02, 9, 3},   // equal part: 30/10
		{100, 50, 0.02, 0, 0.5},  // the first subscriber
		{1000, 980, 0, 19, 0},    // no reserve, no start
		{1000, 0, 0.02, 5, 0},    // no capacity
		{1000, 1000, 1, 3, 250},  // both bounds equal
	}
	for _, tt := range tests {
		if got := Newcomer(tt.limit, tt.c, tt.rho, tt.n); math.Abs(got-tt.want) > 1e-12 {
			t.Errorf("Newcomer(%v, %v, %v, %d) = %v, want %v", tt.limit, tt.c, tt.rho, tt.n, got, tt.want)
		}
	}
}

func TestChanged(t *testing.T) {
	tests := []struct {
		old, new uint32
		frac     float64
		want     bool
	}{
		{100, 100, 0.05, false},
		{100, 105, 0.05, false}, // exactly 5% is noise
		{100, 106, 0.05, true},
		{100, 94, 0.05, true},
		{200, 190, 0.05, false},
		{200, 189, 0.05, true},
		{10, 11, 0.05, false}, // one token is noise
		{10, 12, 0.05, true},
		{0, 1, 0, false},
		{0, 2, 0, true},
		{1, 0, 0.05, false},
		{math.MaxUint32, 0, 0.05, true},
		{0, math.MaxUint32, 0.05, true},
		{1000, 1400, 0.5, false},
		{1000, 1501, 0.5, true},
	}
	for _, tt := range tests {
		if got := Changed(tt.old, tt.new, tt.frac); got != tt.want {
			t.Errorf("Changed(%d, %d, %v) = %v, want %v", tt.old, tt.new, tt.frac, got, tt.want)
		}
	}
}

func TestLeasePanics(t *testing.T) {
	for name, f := range map[string]func(){
		"Newcomer negative limit": func() { Newcomer(-1, 1, 0.02, 1) },
		"Newcomer NaN capacity":   func() { Newcomer(1, math.NaN(), 0.02, 1) },
		"Newcomer Inf capacity":   func() { Newcomer(1, math.Inf(1), 0.02, 1) },
		"Newcomer reserve > 1":    func() { Newcomer(1, 1, 1.5, 1) },
		"Newcomer negative n":     func() { Newcomer(1, 1, 0.02, -1) },
		"Changed negative frac":   func() { Changed(1, 2, -0.1) },
		"Changed NaN frac":        func() { Changed(1, 2, math.NaN()) },
	} {
		t.Run(name, func(t *testing.T) { mustPanic(t, f) })
	}
}
