package share

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestQuantize(t *testing.T) {
	tests := []struct {
		name    string
		c, fill float64
		r       []float64
		want    []uint32
	}{
		{"empty", 10, 1, nil, nil},
		{"whole", 10, 1, []float64{3, 7}, []uint32{3, 7}},
		{"largest remainder", 10, 1, []float64{3.4, 3.3, 3.3}, []uint32{4, 3, 3}},
		{"largest remainder wins", 10, 1, []float64{3.3, 3.4, 3.3}, []uint32{3, 4, 3}},
		{"ties to lower index", 10, 1, []float64{0.4, 0.4}, []uint32{1, 0}},
		{"ties, two extra", 2, 1, []float64{0.5, 0.5, 0.5, 0.5}, []uint32{1, 1, 0, 0}},
		{"sum rounds down", 10, 1, []float64{0.2, 0.2}, []uint32{0, 0}},
		{"fill interval", 4, 2, []float64{1.25, 2.75}, []uint32{3, 5}},
		{"long fill interval", 0.5, 60, []float64{0.1, 0.2, 0.2}, []uint32{6, 12, 12}},
		{"capacity floors the total", 10.9, 1, []float64{5.45, 5.45}, []uint32{5, 5}},
		{"over capacity scales down", 10, 1, []float64{8, 8}, []uint32{5, 5}},
		{"over capacity keeps ratios", 10, 1, []float64{15, 5}, []uint32{8, 2}}, // 7.5, 2.5: tie to index 0
		{"no capacity", 0, 1, []float64{1, 2}, []uint32{0, 0}},
		{"uint32 cap", 1e10, 1, []float64{1e10}, []uint32{math.MaxUint32}},
		{"zero rates", 10, 1, []float64{0, 0, 0}, []uint32{0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make([]uint32, len(tt.r))
			Quantize(tt.c, tt.fill, tt.r, got)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Quantize(%v, %v, %v) mismatch (-want +got):\n%s", tt.c, tt.fill, tt.r, diff)
			}
			checkQuantize(t, tt.c, tt.fill, tt.r, got)
		})
	}
}

func TestQuantizePanics(t *testing.T) {
	out := make([]uint32, 2)
	for name, f := range map[string]func(){
		"length":        func() { Quantize(1, 1, []float64{1}, out) },
		"negative c":    func() { Quantize(-1, 1, []float64{1, 1}, out) },
		"NaN c":         func() { Quantize(math.NaN(), 1, []float64{1, 1}, out) },
		"zero fill":     func() { Quantize(1, 0, []float64{1, 1}, out) },
		"Inf fill":      func() { Quantize(1, math.Inf(1), []float64{1, 1}, out) },
		"negative rate": func() { Quantize(1, 1, []float64{1, -1}, out) },
		"NaN rate":      func() { Quantize(1, 1, []float64{math.NaN(), 1}, out) },
	} {
		t.Run(name, func(t *testing.T) { mustPanic(t, f) })
	}
}

func TestQuantizeAllocs(t *testing.T) {
	r := []float64{3.4, 3.3, 3.3, 0.5, 12.25}
	out := make([]uint32, len(r))
	if n := testing.AllocsPerRun(100, func() { Quantize(30, 1, r, out) }); n != 0 {
		t.Errorf("Quantize allocates %v times, want 0", n)
	}
}

// checkQuantize checks the contract of Quantize(c, fill, r) = out.
func checkQuantize(t testing.TB, c, fill float64, r []float64, out []uint32) {
	t.Helper()
	var sum, sumX, sumR float64
	for i, v := range r {
		x := min(v*fill, math.MaxUint32)
		sumX += x
		sumR += v
		o := float64(out[i])
		sum += o
		if o > math.Ceil(x) {
			t.Fatalf("out[%d] = %v, want ≤ ceil(%v·%v) = %v", i, o, v, fill, math.Ceil(x))
		}
	}
	limit := math.Floor(c * fill)
	if sum > limit {
		t.Fatalf("Σout = %v, want ≤ floor(%v·%v) = %v", sum, c, fill, limit)
	}
	if sumR > c {
		return // scaled: the ratios hold only roughly
	}
	// Within capacity every entry is its floor or ceil, and the total is Σx
	// rounded, unless that breaks the bound.
	for i, v := range r {
		x := min(v*fill, math.MaxUint32)
		if o := float64(out[i]); o < math.Floor(x) {
			t.Fatalf("out[%d] = %v, want ≥ floor(%v·%v) = %v", i, o, v, fill, math.Floor(x))
		}
	}
	if want := min(limit, math.Floor(sumX+0.5)); sum != want {
		t.Fatalf("Σout = %v, want min(floor(c·fill), round(Σx)) = %v (Σx = %v)", sum, want, sumX)
	}
}

func TestQuantizeProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	fills := []float64{1, 1, 2, 10, 60, 0.5}
	for range 5000 {
		fill := fills[r.IntN(len(fills))]
		var c float64
		var rates []float64
		switch r.IntN(3) {
		case 0: // what Divide hands Quantize
			var d []float64
			var h float64
			c, d, h = randomCase(r)
			rates = make([]float64, len(d))
			Divide(c, d, h, rates)
		case 1: // arbitrary rates within capacity
			rates = randomDemands(r, 1+r.IntN(40), math.Pow(10, float64(r.IntN(6)-2)))
			for _, v := range rates {
				c += v
			}
			c *= 1 + r.Float64()
		default: // arbitrary rates over capacity
			rates = randomDemands(r, 1+r.IntN(40), math.Pow(10, float64(r.IntN(6)-2)))
			for _, v := range rates {
				c += v
			}
			c *= r.Float64()
		}
		out := make([]uint32, len(rates))
		Quantize(c, fill, rates, out)
		checkQuantize(t, c, fill, rates, out)
	}
}

func TestTrim(t *testing.T) {
	x := []float64{2.5, 2, 0, 1}
	tests := []struct {
		excess float64
		want   []uint32
	}{
		{0, []uint32{3, 2, 0, 1}},
		{1, []uint32{2, 2, 0, 1}}, // furthest above its x
		{2, []uint32{2, 2, 0, 0}}, // ties to the higher index
		{3, []uint32{2, 1, 0, 0}},
		{9, []uint32{0, 0, 0, 0}}, // more than there is
	}
	for _, tt := range tests {
		out := []uint32{3, 2, 0, 1}
		trim(out, func(i int) float64 { return x[i] }, tt.excess)
		if diff := cmp.Diff(tt.want, out); diff != "" {
			t.Errorf("trim(%v) mismatch (-want +got):\n%s", tt.excess, diff)
		}
	}
}

func FuzzQuantize(f *testing.F) {
	f.Add(10.0, 1.0, encodeFloats([]float64{3.4, 3.3, 3.3}))
	f.Add(10.0, 1.0, encodeFloats([]float64{8, 8}))
	f.Add(0.5, 60.0, encodeFloats([]float64{0.1, 0.2, 0.2}))
	f.Fuzz(func(t *testing.T, c, fill float64, raw []byte) {
		r := decodeFloats(raw)
		valid := finiteNonNeg(c) && fill > 0 && !math.IsInf(fill, 1)
		for _, v := range r {
			valid = valid && finiteNonNeg(v)
		}
		out := make([]uint32, len(r))
		if !valid {
			mustPanic(t, func() { Quantize(c, fill, r, out) })
			return
		}
		Quantize(c, fill, r, out)
		checkQuantize(t, c, fill, r, out)
	})
}
