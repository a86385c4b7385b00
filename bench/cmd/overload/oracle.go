package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// The oracle is the best a static limit does at each overloaded sweep
// load: P1, a global rate limit, told the highest rate it holds there.
// It is the capacity under that overload, the figure E's goodput is judged
// against. The measured capacity is what the server completes when it
// rejects nothing; under overload, every rejection costs CPU too (see
// rejcost), so what a server can serve at 4× is less than at 1×, for any
// admission control. Told the measured capacity itself, P1 collapses.
const oracleVariant = "P1"

// OracleStep is one step of the search for the oracle at one load.
type OracleStep struct {
	Load   float64 `json:"load"`  // offered load, × the measured capacity
	Limit  float64 `json:"limit"` // P1's rate, calls/s
	Window Window  `json:"window"`
	Pass   bool    `json:"pass"`
}

// Oracle search: the first limit tried, × the measured capacity; the
// factor between limits tried while they fail; the most steps at one
// load; the share of its limit P1 must serve within the SLO to pass.
const (
	oracleStart   = 1.0
	oracleFactor  = 0.95
	oracleSteps   = 8
	oracleHolds   = 0.97
	oracleStepDur = 7 * time.Second // the sweep's segment, judged alike
	oracleSkip    = 2 * time.Second
)

// oracleLimits returns the next limit to try at one load, given the steps
// taken there so far, and false when the search is over: limits fall by
// oracleFactor from oracleStart × capacity until one passes, then one step
// halves the interval between that pass and the failure above it.
func oracleLimits(capacity float64, steps []OracleStep) (float64, bool) {
	if len(steps) == 0 {
		return oracleStart * capacity, true
	}
	if len(steps) >= oracleSteps {
		return 0, false
	}
	last := steps[len(steps)-1]
	firstPass := slices.IndexFunc(steps, func(s OracleStep) bool { return s.Pass })
	switch {
	case firstPass < 0:
		return last.Limit * oracleFactor, true
	case firstPass == 0 || firstPass < len(steps)-1:
		// A pass at the first limit leaves nothing above to halve
		// towards; the halving step has been taken.
		return 0, false
	}
	return math.Sqrt(steps[firstPass].Limit * steps[firstPass-1].Limit), true
}

// oracleGoodput returns the oracle at load: the highest goodput of a
// passing step there, at most its limit; 0 when none passed or the load
// was not searched.
func oracleGoodput(steps []OracleStep, load float64) float64 {
	best := 0.0
	for _, s := range steps {
		if s.Load == load && s.Pass {
			best = max(best, min(s.Window.Goodput, s.Limit))
		}
	}
	return best
}

// measureOracle searches, at each load, for the highest limit at which a
// fresh P1 server serves at least oracleHolds of it within the SLO with
// its accepted p99 within the SLO, each step as long as a sweep segment
// and judged on the same seconds, after a second at half the capacity.
func measureOracle(ctx context.Context, start func(variant string, limit float64) (*serverProc, error), capacity float64, loads []float64, cfg Config) ([]OracleStep, error) {
	slo := float64(cfg.SLO) / float64(time.Millisecond)
	var all []OracleStep
	for _, load := range loads {
		var steps []OracleStep
		for {
			limit, ok := oracleLimits(capacity, steps)
			if !ok {
				break
			}
			if err := ctx.Err(); err != nil {
				return all, err
			}
			p, err := start(oracleVariant, limit)
			if err != nil {
				return all, fmt.Errorf("oracle server: %w", err)
			}
			time.Sleep(300 * time.Millisecond)
			sc := Scenario{Name: "oracle", Segments: []Segment{
				{Name: "warm-up", Dur: time.Second, Load: 0.5 * capacity},
				{Name: "step", Dur: oracleStepDur, Load: load * capacity, Skip: oracleSkip, Measure: true},
			}}
			raw, err := runScenario(ctx, p, sc, loadConfig{Capacity: 1, Deadline: cfg.Deadline, Seed: cfg.Seed})
			p.stop()
			if err != nil {
				return all, fmt.Errorf("oracle at %s: %w", loadName(load), err)
			}
			w := raw.window("step", time.Second+oracleSkip, time.Second+oracleStepDur, load*capacity, cfg.SLO)
			w.Load = load
			s := OracleStep{Load: load, Limit: limit, Window: w, Pass: w.P99 >= 0 && w.P99 <= slo && w.Goodput >= oracleHolds*limit}
			cfg.Log("oracle at %s: limit %.0f/s goodput %.0f/s p99 %.1f ms pass=%v", loadName(load), limit, w.Goodput, w.P99, s.Pass)
			steps = append(steps, s)
		}
		all = append(all, steps...)
	}
	return all, nil
}
