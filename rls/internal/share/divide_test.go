package share

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var divideTests = []struct {
	name string
	c    float64
	d    []float64
	h    float64
	want []float64
}{
	{"empty", 10, nil, 0.1, nil},
	{"slack by demand", 100, []float64{10, 20, 30}, 0, []float64{100.0 / 6, 100.0 / 3, 50}},
	{"slack by demand, headroom", 100, []float64{10, 20, 30}, 0.1, []float64{100.0 / 6, 100.0 / 3, 50}},
	{"slack, all zero", 10, []float64{0, 0}, 0.1, []float64{5, 5}},
	{"slack, one zero", 10, []float64{0, 2}, 0.1, []float64{0, 10}},
	{"wants exactly c", 60, []float64{10, 20, 30}, 0, []float64{10, 20, 30}},
	// e = 30; 10 is under; S = 20, X = 20+70, r = 2/9.
	{"proportional beyond e", 90, []float64{10, 50, 100}, 0, []float64{10, 30 + 20*2.0/9, 30 + 70*2.0/9}},
	// w = 11, 55, 110; S = 19, X = 25+80.
	{"proportional beyond e, headroom", 90, []float64{10, 50, 100}, 0.1, []float64{11, 30 + 25*19.0/105, 30 + 80*19.0/105}},
	{"all over", 10, []float64{100, 100}, 0.1, []float64{5, 5}},
	{"zero demand leaves its part", 10, []float64{0, 100}, 0, []float64{0, 10}},
	{"one, over", 10, []float64{20}, 0, []float64{10}},
	{"one, under", 10, []float64{3}, 0.1, []float64{10}},
	{"no capacity", 0, []float64{1, 2}, 0.1, []float64{0, 0}},
	{"no capacity, no demand", 0, []float64{0, 0}, 0, []float64{0, 0}},
	// e = 250; w = 110, 220, 550, 1375; S = 140+30, X = 300+1125.
	{"headroom under e", 1000, []float64{100, 200, 500, 1250}, 0.1, []float64{110, 220, 250 + 300*170.0/1425, 250 + 1125*170.0/1425}},
}

func TestDivide(t *testing.T) {
	for _, tt := range divideTests {
		t.Run(tt.name, func(t *testing.T) {
			got := make([]float64, len(tt.d))
			Divide(tt.c, tt.d, tt.h, got)
			if diff := cmp.Diff(tt.want, got, cmpopts.EquateApprox(1e-12, 0), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Divide(%v, %v, %v) mismatch (-want +got):\n%s", tt.c, tt.d, tt.h, diff)
			}
			checkDivide(t, tt.c, tt.d, tt.h, got)
		})
	}
}

func TestDividePanics(t *testing.T) {
	out := make([]float64, 2)
	for name, f := range map[string]func(){
		"length":           func() { Divide(1, []float64{1}, 0, out) },
		"negative c":       func() { Divide(-1, []float64{1, 1}, 0, out) },
		"Inf c":            func() { Divide(math.Inf(1), []float64{1, 1}, 0, out) },
		"NaN h":            func() { Divide(1, []float64{1, 1}, math.NaN(), out) },
		"negative h":       func() { Divide(1, []float64{1, 1}, -0.1, out) },
		"negative demand":  func() { Divide(1, []float64{1, -1}, 0, out) },
		"NaN demand":       func() { Divide(1, []float64{math.NaN(), 1}, 0, out) },
		"Inf demand":       func() { Divide(1, []float64{math.Inf(1), 1}, 0, out) },
		"overflowing want": func() { Divide(1, []float64{math.MaxFloat64, 1}, 0.5, out) },
		"overflowing sum":  func() { Divide(1, []float64{math.MaxFloat64, math.MaxFloat64}, 0, out) },
	} {
		t.Run(name, func(t *testing.T) { mustPanic(t, f) })
	}
}

func TestDivideAllocs(t *testing.T) {
	d := []float64{10, 50, 100, 0, 3}
	out := make([]float64, len(d))
	if n := testing.AllocsPerRun(100, func() { Divide(90, d, 0.1, out) }); n != 0 {
		t.Errorf("Divide allocates %v times, want 0", n)
	}
}

// checkDivide checks the contract of Divide(c, d, h) = out.
func checkDivide(t testing.TB, c float64, d []float64, h float64, out []float64) {
	t.Helper()
	n := len(d)
	if n == 0 {
		return
	}
	k := 1 + h
	var sumW, sumOut float64
	for _, x := range d {
		sumW += x * k
	}
	e := c / float64(n)
	for i, x := range d {
		o, w := out[i], x*k
		if !(o >= 0) || math.IsInf(o, 1) {
			t.Fatalf("out[%d] = %v, want finite ≥ 0", i, o)
		}
		sumOut += o
		switch {
		case w <= e && sumW >= c && o != w:
			t.Fatalf("out[%d] = %v, want exactly w = %v (w ≤ e = %v, Σw = %v ≥ c)", i, o, w, e, sumW)
		case o < min(w, e):
			t.Fatalf("out[%d] = %v, want ≥ min(w, e) = %v", i, o, min(w, e))
		case sumW >= c && o > w:
			t.Fatalf("out[%d] = %v, want ≤ w = %v (Σw = %v ≥ c)", i, o, w, sumW)
		case sumW < c && o < w:
			t.Fatalf("out[%d] = %v, want ≥ w = %v (Σw = %v < c)", i, o, w, sumW)
		}
	}
	// The division uses all of c, within rounding.
	if tol := tolerance(c, n); sumOut > c+tol || sumOut < c-tol {
		t.Fatalf("Σout = %v, want c = %v", sumOut, c)
	}
}

// tolerance is the rounding allowed in a division of c among n: a relative
// 1e-9, and n of the smallest subnormals for a subnormal c.
func tolerance(c float64, n int) float64 {
	return 1e-9*c + float64(n)*4*math.SmallestNonzeroFloat64
}

// randomDemands returns n demands drawn from a mix that puts subscribers on
// both sides of the equal part, with zeros, ties and wide ranges.
func randomDemands(r *rand.Rand, n int, scale float64) []float64 {
	d := make([]float64, n)
	kind := r.IntN(5)
	for i := range d {
		switch kind {
		case 0: // uniform
			d[i] = r.Float64() * scale
		case 1: // heavy tail
			d[i] = scale * math.Pow(r.Float64(), 4)
		case 2: // some zeros
			if r.IntN(3) > 0 {
				d[i] = r.Float64() * scale
			}
		case 3: // few distinct values
			d[i] = float64(r.IntN(3)) * scale / 2
		case 4: // a few elephants among mice
			d[i] = r.Float64() * scale / 100
			if r.IntN(8) == 0 {
				d[i] = scale * (1 + r.Float64())
			}
		}
	}
	return d
}

func randomCase(r *rand.Rand) (c float64, d []float64, h float64) {
	n := 1 + r.IntN(40)
	scale := math.Pow(10, float64(r.IntN(9)-3)) // 1e-3 … 1e5
	d = randomDemands(r, n, scale)
	// Capacity from well below to well above the total demand.
	var sum float64
	for _, x := range d {
		sum += x
	}
	c = (sum + scale) * r.Float64() * 2
	if r.IntN(10) == 0 {
		c = 0
	}
	switch r.IntN(3) {
	case 0:
		h = 0
	case 1:
		h = 0.1
	default:
		h = r.Float64()
	}
	return c, d, h
}

func TestDivideProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		c, d, h := randomCase(r)
		out := make([]float64, len(d))
		Divide(c, d, h, out)
		checkDivide(t, c, d, h, out)
		checkMonotone(t, c, d, h, out, r.IntN(len(d)), 1+r.Float64()*3)
		checkMonotone(t, c, d, h, out, r.IntN(len(d)), 0)
		checkEqual(t, c, len(d), d[0], h)
	}
}

// checkMonotone checks that raising d[i] to max(d[i]·f, something) does not
// lower out[i], the share Divide gave it before.
func checkMonotone(t testing.TB, c float64, d []float64, h float64, out []float64, i int, f float64) {
	t.Helper()
	d2 := append([]float64(nil), d...)
	d2[i] = d[i] * f
	if f == 0 || d2[i] == d[i] { // from 0, or by a step
		d2[i] = d[i] + c/float64(len(d)+1) + 1
	}
	var sum float64
	for _, x := range d2 {
		sum += x * (1 + h)
	}
	if math.IsInf(sum, 1) || math.IsInf(d2[i], 1) {
		return
	}
	out2 := make([]float64, len(d))
	Divide(c, d2, h, out2)
	if out2[i] < out[i]-tolerance(c, len(d)) {
		t.Fatalf("Divide(%v, d, %v): raising d[%d] from %v to %v lowered its share from %v to %v (d = %v)",
			c, h, i, d[i], d2[i], out[i], out2[i], d)
	}
}

// checkEqual checks that n equal demands x get equal shares.
func checkEqual(t testing.TB, c float64, n int, x, h float64) {
	t.Helper()
	d := make([]float64, n)
	for i := range d {
		d[i] = x
	}
	if math.IsInf(x*(1+h)*float64(n)*2, 1) {
		return
	}
	out := make([]float64, n)
	Divide(c, d, h, out)
	for i := range out {
		if out[i] != out[0] {
			t.Fatalf("Divide(%v, %d × %v, %v) = %v, want equal shares", c, n, x, h, out)
		}
	}
	checkDivide(t, c, d, h, out)
}

func FuzzDivide(f *testing.F) {
	for _, tt := range divideTests {
		f.Add(tt.c, tt.h, encodeFloats(tt.d), uint8(0))
	}
	f.Add(1000.0, 0.1, []byte{1, 0, 0, 2, 0, 3, 255, 255}, uint8(0x80))
	f.Fuzz(func(t *testing.T, c, h float64, raw []byte, i uint8) {
		var d []float64
		if i&0x80 == 0 {
			d = decodeFloats(raw)
		} else {
			// Demands of the same order as c, where the cases differ.
			d = decodeScaled(raw, (c+1)/4096)
		}
		valid := finiteNonNeg(c) && finiteNonNeg(h)
		var sumW float64
		for _, x := range d {
			valid = valid && finiteNonNeg(x)
			sumW += x * (1 + h)
		}
		valid = valid && !math.IsInf(sumW, 1)
		out := make([]float64, len(d))
		if !valid {
			mustPanic(t, func() { Divide(c, d, h, out) })
			return
		}
		Divide(c, d, h, out)
		checkDivide(t, c, d, h, out)
		if len(d) == 0 {
			return
		}
		j := int(i&0x7f) % len(d)
		checkMonotone(t, c, d, h, out, j, 2)
		checkMonotone(t, c, d, h, out, j, 0)
		checkEqual(t, c, len(d), d[j], h)
	})
}

// encodeFloats and decodeFloats turn demands into fuzzer bytes and back, 8
// little-endian bytes each, at most 64 of them.
func encodeFloats(d []float64) []byte {
	b := make([]byte, 0, 8*len(d))
	for _, x := range d {
		u := math.Float64bits(x)
		for s := 0; s < 64; s += 8 {
			b = append(b, byte(u>>s))
		}
	}
	return b
}

func decodeFloats(b []byte) []float64 {
	d := make([]float64, 0, min(len(b)/8, 64))
	for len(b) >= 8 && len(d) < 64 {
		var u uint64
		for s := 0; s < 8; s++ {
			u |= uint64(b[s]) << (8 * s)
		}
		d = append(d, math.Float64frombits(u))
		b = b[8:]
	}
	return d
}

// decodeScaled turns each 2 bytes into a demand of that many units, at most
// 64 of them.
func decodeScaled(b []byte, unit float64) []float64 {
	d := make([]float64, 0, min(len(b)/2, 64))
	for len(b) >= 2 && len(d) < 64 {
		d = append(d, float64(uint16(b[0])|uint16(b[1])<<8)*unit)
		b = b[2:]
	}
	return d
}
