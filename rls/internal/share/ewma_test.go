package share

import (
	"math"
	"testing"
)

func TestEWMA(t *testing.T) {
	tests := []struct {
		name     string
		up, down float64
		samples  []float64
		want     []float64
	}{
		{"first sample as is", 0, 0, []float64{10}, []float64{10}},
		{"default rise and fall", 0, 0, []float64{10, 20, 10}, []float64{10, 17, 14.9}},
		{"10x jump reaches 91% in 2", 0, 0, []float64{1, 10, 10}, []float64{1, 7.3, 9.19}},
		{"zero sample", 0, 0, []float64{0, 0, 8}, []float64{0, 0, 5.6}},
		{"custom weights", 1, 0.5, []float64{4, 8, 0, 0}, []float64{4, 8, 4, 2}},
		{"only Up set", 0.5, 0, []float64{0, 10, 0}, []float64{0, 5, 3.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := EWMA{Up: tt.up, Down: tt.down}
			if got := e.Value(); got != 0 {
				t.Fatalf("Value() before Observe = %v, want 0", got)
			}
			for i, x := range tt.samples {
				got := e.Observe(x)
				if want := tt.want[i]; math.Abs(got-want) > 1e-12 {
					t.Fatalf("Observe(%v) #%d = %v, want %v", x, i, got, want)
				}
				if v := e.Value(); v != got {
					t.Fatalf("Value() = %v, want %v", v, got)
				}
			}
		})
	}
}

func TestEWMAPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"negative sample": func() { new(EWMA).Observe(-1) },
		"NaN sample":      func() { new(EWMA).Observe(math.NaN()) },
		"Inf sample":      func() { new(EWMA).Observe(math.Inf(1)) },
		"Up above 1":      func() { (&EWMA{Up: 1.5}).Observe(1) },
		"Down negative":   func() { (&EWMA{Down: -0.1}).Observe(1) },
		"Down NaN":        func() { (&EWMA{Down: math.NaN()}).Observe(1) },
	} {
		t.Run(name, func(t *testing.T) { mustPanic(t, f) })
	}
}

func mustPanic(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		if recover() == nil {
			t.Error("did not panic")
		}
	}()
	f()
}
