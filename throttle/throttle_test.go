package throttle_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/internal/fakeclock"
	"github.com/floodgate-go/floodgate/throttle"
)

// fakeClock is the tests' controlled clock.
type fakeClock = fakeclock.Clock

func newClock() *fakeClock { return fakeclock.New(time.Unix(1_700_000_000, 0)) }

// fixed returns a random source that always draws v.
func fixed(v float64) func() float64 { return func() float64 { return v } }

func TestAdaptiveDropProbability(t *testing.T) {
	for _, tc := range []struct {
		name              string
		k                 float64
		requests, accepts int
		want              float64
	}{
		{"no traffic", 2, 0, 0, 0},
		{"all accepted", 2, 100, 100, 0},
		{"half accepted, K=2", 2, 100, 50, 0},
		{"a tenth accepted, K=2", 2, 100, 10, (100 - 2*10) / 101.0},
		{"nothing accepted", 2, 100, 0, 100 / 101.0},
		{"a tenth accepted, K=1.1", 1.1, 100, 10, (100 - 1.1*10) / 101.0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := throttle.NewAdaptive(tc.k, throttle.WithClock(newClock()), throttle.WithRand(fixed(1)))
			if err != nil {
				t.Fatal(err)
			}
			for range tc.requests {
				if !a.Allow() {
					t.Fatal("Allow() = false with a random draw of 1, want true")
				}
			}
			for range tc.accepts {
				a.Accept()
			}
			if got := a.DropProbability(); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("DropProbability() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAdaptiveDropsByDraw(t *testing.T) {
	var draw float64
	a, err := throttle.NewAdaptive(2, throttle.WithClock(newClock()), throttle.WithRand(func() float64 { return draw }))
	if err != nil {
		t.Fatal(err)
	}
	draw = 0
	for range 99 {
		a.Allow() // p is 0 on the first call, then grows: nothing is accepted
	}
	p := a.DropProbability() // (99 − 0)/100
	if want := 0.99; math.Abs(p-want) > 1e-12 {
		t.Fatalf("DropProbability() = %v, want %v", p, want)
	}
	draw = p - 1e-9
	if a.Allow() {
		t.Errorf("Allow() = true with a draw just below the drop probability, want false")
	}
	draw = a.DropProbability()
	if !a.Allow() {
		t.Errorf("Allow() = false with a draw at the drop probability, want true")
	}
}

func TestAdaptiveForgetsAfterWindow(t *testing.T) {
	clk := newClock()
	a, err := throttle.NewAdaptive(2, throttle.WithClock(clk), throttle.WithWindow(16*time.Second), throttle.WithRand(fixed(1)))
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		a.Allow() // all rejected
	}
	if p := a.DropProbability(); p < 0.9 {
		t.Fatalf("DropProbability() = %v after 100 rejections, want ≥ 0.9", p)
	}
	// Eight seconds on, the window still holds them; accepted requests now
	// pull the probability down.
	clk.Advance(8 * time.Second)
	for range 50 {
		a.Allow()
		a.Accept()
	}
	if got, want := a.DropProbability(), (150-2*50)/151.0; math.Abs(got-want) > 1e-12 {
		t.Errorf("DropProbability() = %v with 150 requests and 50 accepts in the window, want %v", got, want)
	}
	// Once the first hundred are out of the window, only the accepted
	// half-window remains.
	clk.Advance(9 * time.Second)
	if got := a.DropProbability(); got != 0 {
		t.Errorf("DropProbability() = %v once the rejections left the window, want 0", got)
	}
	clk.Advance(16 * time.Second)
	for range 10 {
		a.Allow()
	}
	if got, want := a.DropProbability(), 10/11.0; math.Abs(got-want) > 1e-12 {
		t.Errorf("DropProbability() = %v with only 10 fresh rejections, want %v", got, want)
	}
}

func TestAdaptiveClockBackwards(t *testing.T) {
	clk := newClock()
	a, err := throttle.NewAdaptive(2, throttle.WithClock(clk), throttle.WithRand(fixed(1)))
	if err != nil {
		t.Fatal(err)
	}
	a.Allow()
	clk.Advance(-time.Hour)
	a.Allow()
	if got, want := a.DropProbability(), 2/3.0; math.Abs(got-want) > 1e-12 {
		t.Errorf("DropProbability() = %v after the clock went back, want %v (both requests counted)", got, want)
	}
}

func TestBudget(t *testing.T) {
	clk := newClock()
	// 10% of requests plus 0.5/s × 10 s = 5 retries.
	b, err := throttle.NewBudget(0.1, 0.5, throttle.WithClock(clk), throttle.WithWindow(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	retries := func() int {
		n := 0
		for b.Retry() {
			n++
			if n > 1000 {
				t.Fatal("Retry() never refuses")
			}
		}
		return n
	}
	if got, want := retries(), 5; got != want {
		t.Errorf("retries with no requests = %d, want %d (the minimum)", got, want)
	}
	for range 100 {
		b.Request()
	}
	if got, want := retries(), 10; got != want {
		t.Errorf("retries after 100 requests = %d, want %d more (10%%)", got, want)
	}
	clk.Advance(11 * time.Second)
	if got, want := retries(), 5; got != want {
		t.Errorf("retries once the window passed = %d, want %d", got, want)
	}
}

func TestOptionErrors(t *testing.T) {
	bad := []struct {
		name string
		err  func() error
	}{
		{"K below 1", func() error { _, err := throttle.NewAdaptive(0.5); return err }},
		{"K NaN", func() error { _, err := throttle.NewAdaptive(math.NaN()); return err }},
		{"K infinite", func() error { _, err := throttle.NewAdaptive(math.Inf(1)); return err }},
		{"ratio above 1", func() error { _, err := throttle.NewBudget(1.5, 0); return err }},
		{"negative minimum", func() error { _, err := throttle.NewBudget(0.1, -1); return err }},
		{"short window", func() error { _, err := throttle.NewAdaptive(2, throttle.WithWindow(time.Millisecond)); return err }},
		{"zero attempts", func() error { _, err := throttle.New(throttle.WithRetries(0)); return err }},
		{"zero backoff", func() error { _, err := throttle.New(throttle.WithBackoff(0)); return err }},
		{"New with bad K", func() error { _, err := throttle.New(throttle.WithK(0)); return err }},
		{"New with bad budget", func() error { _, err := throttle.New(throttle.WithRetryBudget(-0.1, 1)); return err }},
	}
	for _, tc := range bad {
		if err := tc.err(); !errors.Is(err, floodgate.ErrInvalidOption) {
			t.Errorf("%s: error = %v, want one wrapping floodgate.ErrInvalidOption", tc.name, err)
		}
	}
	if _, err := throttle.New(throttle.WithK(1), throttle.WithRetries(10), throttle.WithRetryBudget(0, 0)); err != nil {
		t.Errorf("New(valid edge values) = %v, want nil", err)
	}
}

// WithClock(nil) restores the real clock, as in every package.
func TestNilClockIsTheDefault(t *testing.T) {
	b, err := throttle.NewBudget(0.1, 1, throttle.WithClock(nil))
	if err != nil {
		t.Fatalf("NewBudget with WithClock(nil): %v", err)
	}
	if b == nil {
		t.Fatal("nil Budget")
	}
}
