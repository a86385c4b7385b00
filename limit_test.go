package floodgate_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
)

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		lim floodgate.Limit
		ok  bool
	}{
		{floodgate.Limit{}, true},
		{floodgate.PerSecond(10, 5), true},
		{floodgate.PerSecond(0, 5), true},
		{floodgate.Inf, true},
		{floodgate.Limit{Rate: math.Inf(1), Burst: -1}, true}, // burst ignored
		{floodgate.PerSecond(1, floodgate.MaxBurst), true},
		{floodgate.PerSecond(math.NaN(), 1), false},
		{floodgate.PerSecond(-1, 1), false},
		{floodgate.PerSecond(math.Inf(-1), 1), false},
		{floodgate.PerSecond(1, -1), false},
		{floodgate.PerSecond(1, floodgate.MaxBurst+1), false},
		{floodgate.PerSecond(1, 0), false},
		{floodgate.Limit{Rate: 1, Burst: 1, Debt: floodgate.NoDebt}, true},
		{floodgate.Limit{Rate: 1, Burst: 1, Debt: floodgate.MaxBurst}, true},
		{floodgate.Limit{Rate: 1, Burst: 1, Debt: -2}, false},
		{floodgate.Limit{Rate: 1, Burst: 1, Debt: floodgate.MaxBurst + 1}, false},
		{floodgate.Limit{Rate: math.Inf(1), Debt: -2}, true}, // debt ignored
	} {
		err := c.lim.Validate()
		if (err == nil) != c.ok {
			t.Errorf("%v.Validate() = %v, want ok %v", c.lim, err, c.ok)
		}
		if err != nil && !errors.Is(err, floodgate.ErrInvalidLimit) {
			t.Errorf("%v.Validate() = %v, want it to wrap ErrInvalidLimit", c.lim, err)
		}
	}
}

func TestScale(t *testing.T) {
	for _, c := range []struct {
		lim  floodgate.Limit
		f    float64
		want floodgate.Limit
	}{
		{floodgate.PerSecond(100, 50), 0.2, floodgate.PerSecond(20, 10)},
		{floodgate.PerSecond(100, 50), 1, floodgate.PerSecond(100, 50)},
		{floodgate.PerSecond(100, 3), 0.2, floodgate.PerSecond(20, 1)}, // burst never below 1
		{floodgate.PerSecond(10, 3), 2, floodgate.PerSecond(20, 6)},
		{floodgate.PerSecond(10, 3), 0, floodgate.Limit{}},
		{floodgate.PerSecond(10, 3), -1, floodgate.Limit{}},
		{floodgate.PerSecond(10, 3), math.NaN(), floodgate.Limit{}},
		{floodgate.Limit{}, 0.5, floodgate.Limit{}},
		{floodgate.PerSecond(0, 4), 0.5, floodgate.PerSecond(0, 2)},
		{floodgate.Inf, 0.2, floodgate.Inf},
		{floodgate.PerSecond(1, floodgate.MaxBurst), 4, floodgate.PerSecond(4, floodgate.MaxBurst)},
		{floodgate.PerSecond(0, 98), 1.0 / 49, floodgate.PerSecond(0, 2)},    // 1.9999… is 2
		{floodgate.PerSecond(0, 100), 0.29, floodgate.PerSecond(0, 29)},      // 28.9999… is 29
		{floodgate.PerSecond(0, 100), 0.295, floodgate.PerSecond(0, 29)},     // 29.5 is 29
		{floodgate.PerSecond(0, 3), 0.1 / 3 * 10, floodgate.PerSecond(0, 1)}, // a third of 3
		// An explicit debt limit scales as the burst does; the default
		// (one burst) and NoDebt stay.
		{floodgate.Limit{Rate: 10, Burst: 4, Debt: 40}, 0.5, floodgate.Limit{Rate: 5, Burst: 2, Debt: 20}},
		{floodgate.Limit{Rate: 10, Burst: 4, Debt: 3}, 0.1, floodgate.Limit{Rate: 1, Burst: 1, Debt: 1}},
		{floodgate.Limit{Rate: 10, Burst: 4, Debt: floodgate.NoDebt}, 0.5, floodgate.Limit{Rate: 5, Burst: 2, Debt: floodgate.NoDebt}},
		{floodgate.Limit{Rate: 10, Burst: 4, Debt: floodgate.MaxBurst}, 2, floodgate.Limit{Rate: 20, Burst: 8, Debt: floodgate.MaxBurst}},
	} {
		if got := c.lim.Scale(c.f); got != c.want {
			t.Errorf("%v.Scale(%v) = %v, want %v", c.lim, c.f, got, c.want)
		}
	}
}

func TestDebtLimit(t *testing.T) {
	for _, c := range []struct {
		lim  floodgate.Limit
		want int
	}{
		{floodgate.PerSecond(1, 5), 5}, // the default: one burst
		{floodgate.Limit{Rate: 1, Burst: 5, Debt: 12}, 12},
		{floodgate.Limit{Rate: 1, Burst: 5, Debt: floodgate.NoDebt}, 0},
		{floodgate.Limit{}, 0},
	} {
		if got := c.lim.DebtLimit(); got != c.want {
			t.Errorf("%v.DebtLimit() = %d, want %d", c.lim, got, c.want)
		}
	}
}

func TestEvery(t *testing.T) {
	if got, want := floodgate.Every(100*time.Millisecond, 3), floodgate.PerSecond(10, 3); got != want {
		t.Errorf("Every(100ms, 3) = %v, want %v", got, want)
	}
	for _, d := range []time.Duration{0, -time.Second} {
		if got := floodgate.Every(d, 1); !got.IsInf() {
			t.Errorf("Every(%v, 1) = %v, want Inf", d, got)
		}
	}
}

func TestDurationFor(t *testing.T) {
	for _, c := range []struct {
		lim    floodgate.Limit
		tokens float64
		want   time.Duration
	}{
		{floodgate.PerSecond(10, 1), 1, 100 * time.Millisecond},
		{floodgate.PerSecond(3, 1), 1, 333333334 * time.Nanosecond}, // rounded up
		{floodgate.PerSecond(10, 1), 0, 0},
		{floodgate.PerSecond(0, 1), 1, floodgate.Never},
		{floodgate.Inf, 1e9, 0},
		{floodgate.PerSecond(1e-12, 1), 1, floodgate.Never},
	} {
		if got := c.lim.DurationFor(c.tokens); got != c.want {
			t.Errorf("%v.DurationFor(%v) = %v, want %v", c.lim, c.tokens, got, c.want)
		}
	}
}

func TestString(t *testing.T) {
	for lim, want := range map[floodgate.Limit]string{
		floodgate.PerSecond(2.5, 10):  "2.5/s burst 10",
		floodgate.Inf:                 "inf",
		{}:                            "0/s burst 0",
		{Rate: 1, Burst: 2, Debt: 10}: "1/s burst 2 debt 10",
		{Rate: 1, Burst: 2, Debt: floodgate.NoDebt}: "1/s burst 2 debt none",
	} {
		if got := lim.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
	if got := floodgate.SourceFallback.String(); got != "fallback" {
		t.Errorf("SourceFallback.String() = %q", got)
	}
	if got := floodgate.Source(200).String(); got != "unknown" {
		t.Errorf("Source(200).String() = %q", got)
	}
}
