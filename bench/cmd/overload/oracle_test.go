package main

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestOracleLimits: the search at one load walks the limit down by
// oracleFactor until a rate passes, halves the interval to the failure
// above it once, and stops; a pass at the first rate, or oracleSteps
// failures, end it too.
func TestOracleLimits(t *testing.T) {
	const capacity = 400.0
	// walk searches a server on which every limit up to holds passes.
	walk := func(holds float64) []OracleStep {
		var steps []OracleStep
		for {
			l, ok := oracleLimits(capacity, steps)
			if !ok {
				return steps
			}
			steps = append(steps, OracleStep{Load: 2, Limit: l, Pass: l <= holds, Window: Window{Goodput: min(l, holds)}})
			if len(steps) > 2*oracleSteps {
				t.Fatalf("the search does not end: %+v", steps)
			}
		}
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

	steps := walk(capacity)
	if len(steps) != 1 || !near(steps[0].Limit, oracleStart*capacity) {
		t.Errorf("a server that holds its capacity: %+v, want one step at %v", steps, oracleStart*capacity)
	}

	steps = walk(355)
	// 400, 380, 361, 342.95 (passes), then √(342.95 × 361).
	want := []float64{400, 380, 361, 342.95, math.Sqrt(342.95 * 361)}
	if len(steps) != len(want) {
		t.Fatalf("limits %+v, want %v", steps, want)
	}
	for i, s := range steps {
		if !near(s.Limit, want[i]) {
			t.Errorf("step %d: limit %v, want %v", i, s.Limit, want[i])
		}
	}
	if got := oracleGoodput(steps, 2); !near(got, want[4]) {
		t.Errorf("oracle %v, want the halving step's %v (it passed)", got, want[4])
	}
	if got := oracleGoodput(steps, 3); got != 0 {
		t.Errorf("oracle at a load not searched: %v, want 0", got)
	}

	steps = walk(0)
	if len(steps) != oracleSteps || oracleGoodput(steps, 2) != 0 {
		t.Errorf("a server that holds nothing: %d steps, oracle %v; want %d steps, 0", len(steps), oracleGoodput(steps, 2), oracleSteps)
	}
}

// TestOracleReport: with an oracle, the sweep's goodput targets are judged
// against the capacity under each load and say so, with the share of the
// measured capacity beside it; a load where no rate passed falls back to
// the measured capacity.
func TestOracleReport(t *testing.T) {
	const capacity = 300.0
	slo := 100 * time.Millisecond
	res := &Results{
		Config:   Config{Cost: 2 * time.Millisecond, Deadline: 500 * time.Millisecond, SLO: slo},
		Capacity: capacity,
		Fits:     map[string]Fit{},
	}
	sweep := Scenario{Name: "sweep", Segments: []Segment{
		{Name: loadName(2), Dur: 3 * time.Second, Load: 2, Measure: true},
		{Name: loadName(4), Dur: 3 * time.Second, Load: 4, Measure: true},
	}}
	res.Scenarios = []Scenario{sweep}
	// E serves half the calls within 10 ms and rejects the others.
	outcome := func(at time.Duration, tenant int) (outcome, time.Duration) {
		if at/time.Millisecond%2 == 0 {
			return outOK, 10 * time.Millisecond
		}
		return outRejected, time.Millisecond
	}
	res.Runs = append(res.Runs, analyse(synthRaw(sweep, capacity, outcome), sweep, "E", serverReady{}, capacity, slo))
	res.Oracle = []OracleStep{
		{Load: 2, Limit: 300, Window: Window{Goodput: 20, P99: 480}},
		{Load: 2, Limit: 285, Window: Window{Goodput: 280, P99: 60}, Pass: true},
		{Load: 4, Limit: 300, Window: Window{Goodput: 10, P99: 490}},
	}
	report, _ := renderReport(t, res)
	for _, want := range []string{
		"| capacity under overload | 2×: 280/s (93%), 4×: none passed |",
		"goodput at 2× ≥ 95% of the capacity under that load",
		"of 280/s (",
		"goodput at 4× ≥ 95% of the measured capacity",
		"<summary>oracle steps</summary>",
		"| 2× | 285 | 280 | 60.0 | true |",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}
