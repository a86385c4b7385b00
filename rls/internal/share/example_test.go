package share_test

import (
	"fmt"

	"github.com/floodgate-go/floodgate/rls/internal/share"
)

func ExampleEWMA() {
	var e share.EWMA // Up 0.7, Down 0.3
	for _, x := range []float64{10, 100, 100, 20} {
		fmt.Printf("%.2f ", e.Observe(x))
	}
	fmt.Println()
	// Output: 10.00 73.00 91.90 70.33
}

func ExampleDivide() {
	// 90 tokens/s among three subscribers with 10% headroom: the equal part
	// is 30, so the first, wanting 11, gets 11; the other two share the 19
	// it leaves in proportion to what they want beyond 30 (25 and 80).
	d := []float64{10, 50, 100}
	out := make([]float64, len(d))
	share.Divide(90, d, 0.1, out)
	fmt.Printf("%.2f\n", out)

	// With enough for everyone, the slack follows demand.
	share.Divide(320, d, 0.1, out)
	fmt.Printf("%.2f\n", out)
	// Output:
	// [11.00 34.52 44.48]
	// [20.00 100.00 200.00]
}

func ExampleQuantize() {
	r := []float64{11, 34.52, 44.48}
	out := make([]uint32, len(r))
	share.Quantize(90, 1, r, out) // fill interval 1 s
	fmt.Println(out)
	// Output: [11 35 44]
}

func ExampleNewcomer() {
	// A limit of 1000/s with a 2% reserve, 19 subscribers sharing 980/s.
	fmt.Println(share.Newcomer(1000, 980, 0.02, 19))
	// Output: 5
}

func ExampleChanged() {
	fmt.Println(share.Changed(100, 105, 0.05), share.Changed(100, 106, 0.05))
	// Output: false true
}
