package cpugate_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/floodgate-go/floodgate"
	"github.com/floodgate-go/floodgate/cpugate"
)

const interval = cpugate.DefaultInterval

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type step struct {
	at    time.Duration
	cpu   float64
	state cpugate.State
	scale float64
}

// trace feeds p one reading per interval for dur, with CPU given by load.
func trace(p cpugate.Policy, dur time.Duration, load func(time.Duration) float64) []step {
	var c cpugate.Control
	var out []step
	for at := time.Duration(0); at <= dur; at += interval {
		cpu := load(at)
		c = p.Step(c, cpugate.Reading{CPU: cpu}, t0.Add(at))
		out = append(out, step{at: at, cpu: cpu, state: c.State, scale: c.Scale()})
	}
	return out
}

// TestClassicScenario is the scenario the gate exists for, to the letter:
// CPU spikes to 90% and at once drops to 30%. The scale stays at 0.2 for the
// whole 5 s cooldown, measured from the hot sample, and is 1 right after.
func TestClassicScenario(t *testing.T) {
	const spike = 2 * time.Second
	steps := trace(cpugate.Fixed{}, 20*time.Second, func(at time.Duration) float64 {
		if at == spike {
			return 0.9
		}
		return 0.3
	})
	for _, s := range steps {
		want := 1.0
		if s.at >= spike && s.at < spike+5*time.Second {
			want = 0.2
		}
		if s.scale != want {
			t.Errorf("at %v (cpu %v): scale = %v, want %v", s.at, s.cpu, s.scale, want)
		}
	}
}

func TestClassicScenarioThroughGate(t *testing.T) {
	g, err := cpugate.New(cpugate.SamplerFunc(func() (cpugate.Reading, error) {
		return cpugate.Reading{CPU: 0.9}, nil
	}), cpugate.WithPolicy(cpugate.Fixed{}))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SampleAt(t0); err != nil {
		t.Fatal(err)
	}
	for at := interval; at <= 10*time.Second; at += interval {
		g.Observe(cpugate.Reading{CPU: 0.3}, t0.Add(at))
		want, wantState := 0.2, cpugate.Shedding
		if at >= 5*time.Second {
			want, wantState = 1, cpugate.Open
		}
		if got := g.Scale(); got != want {
			t.Errorf("at %v: Scale() = %v, want %v", at, got, want)
		}
		if got := g.State(); got != wantState {
			t.Errorf("at %v: State() = %v, want %v", at, got, wantState)
		}
		if got, want := g.Shedding(), wantState == cpugate.Shedding; got != want {
			t.Errorf("at %v: Shedding() = %v, want %v", at, got, want)
		}
	}
}

func TestFixedHoldsWhileHot(t *testing.T) {
	// Hot readings keep restarting the cooldown.
	steps := trace(cpugate.Fixed{}, 30*time.Second, func(at time.Duration) float64 {
		if at < 10*time.Second {
			return 0.85
		}
		return 0.1
	})
	for _, s := range steps {
		want := 0.2
		if s.at >= 9750*time.Millisecond+5*time.Second {
			want = 1
		}
		if s.scale != want {
			t.Errorf("at %v: scale = %v, want %v", s.at, s.scale, want)
		}
	}
}

func TestFixedThresholdIsInclusive(t *testing.T) {
	c := cpugate.Fixed{Threshold: 0.5}.Step(cpugate.Control{}, cpugate.Reading{CPU: 0.5}, t0)
	if c.State != cpugate.Shedding {
		t.Errorf("Step(cpu = threshold).State = %v, want shedding", c.State)
	}
	c = cpugate.Fixed{Threshold: 0.5}.Step(cpugate.Control{}, cpugate.Reading{CPU: 0.4999}, t0)
	if c.State != cpugate.Open {
		t.Errorf("Step(cpu < threshold).State = %v, want open", c.State)
	}
}

func TestSchedGuardSignalCountsAsHot(t *testing.T) {
	for _, p := range []cpugate.Policy{
		cpugate.Fixed{SchedP99: 10 * time.Millisecond},
		cpugate.Adaptive{SchedP99: 10 * time.Millisecond},
	} {
		c := p.Step(cpugate.Control{}, cpugate.Reading{CPU: 0.1, SchedP99: 9 * time.Millisecond}, t0)
		if c.State != cpugate.Open {
			t.Errorf("%T: Step(p99 below limit).State = %v, want open", p, c.State)
		}
		c = p.Step(c, cpugate.Reading{CPU: 0.1, SchedP99: 10 * time.Millisecond}, t0.Add(interval))
		if c.State != cpugate.Shedding {
			t.Errorf("%T: Step(p99 at limit).State = %v, want shedding", p, c.State)
		}
	}
	// Off by default: any latency is ignored.
	c := cpugate.Fixed{}.Step(cpugate.Control{}, cpugate.Reading{CPU: 0.1, SchedP99: time.Hour}, t0)
	if c.State != cpugate.Open {
		t.Errorf("Fixed{}.Step(huge p99).State = %v, want open", c.State)
	}
}

func TestAdaptiveCuts(t *testing.T) {
	// Sustained saturation: ×0.5, then ×0.75 every half HoldOff, down to
	// the floor.
	steps := trace(cpugate.Adaptive{}, 10*time.Second, func(time.Duration) float64 { return 1.0 })
	want := map[time.Duration]float64{
		0:                       0.5,
		250 * time.Millisecond:  0.5,
		500 * time.Millisecond:  0.375,
		750 * time.Millisecond:  0.375,
		time.Second:             0.28125,
		2 * time.Second:         0.158203125,
		4 * time.Second:         0.05005645751953125,
		4500 * time.Millisecond: 0.05, // floor
		9 * time.Second:         0.05,
	}
	for _, s := range steps {
		if w, ok := want[s.at]; ok && s.scale != w {
			t.Errorf("at %v: scale = %v, want %v", s.at, s.scale, w)
		}
		if s.state != cpugate.Shedding {
			t.Errorf("at %v: state = %v, want shedding", s.at, s.state)
		}
	}
}

func TestAdaptiveCutsLessJustOverEnter(t *testing.T) {
	a := cpugate.Adaptive{}
	mid := (0.9 + 0.8) / 2
	var c cpugate.Control
	// Just over Enter: a cut to what would bring the reading to the middle
	// of the warm band, not FirstCut.
	c = a.Step(c, cpugate.Reading{CPU: 0.93}, t0)
	if want := mid / 0.93; c.State != cpugate.Shedding || math.Abs(c.Scale()-want) > 1e-9 {
		t.Fatalf("after 0.93: state, scale = %v, %v, want shedding, %v", c.State, c.Scale(), want)
	}
	level := c.Scale()
	c = a.Step(c, cpugate.Reading{CPU: 0.91}, t0.Add(time.Second))
	if want := level * mid / 0.91; math.Abs(c.Scale()-want) > 1e-9 {
		t.Errorf("after 0.91: scale = %v, want %v", c.Scale(), want)
	}
	level = c.Scale()
	// Saturated: the full Cut.
	c = a.Step(c, cpugate.Reading{CPU: 0.99}, t0.Add(2*time.Second))
	if want := level * 0.75; math.Abs(c.Scale()-want) > 1e-9 {
		t.Errorf("after 0.99: scale = %v, want %v", c.Scale(), want)
	}

	// Hot by the scheduling guard alone: FirstCut, whatever the CPU.
	g := cpugate.Adaptive{SchedP99: 10 * time.Millisecond}
	c = g.Step(cpugate.Control{}, cpugate.Reading{CPU: 0.3, SchedP99: 20 * time.Millisecond}, t0)
	if c.Scale() != 0.5 {
		t.Errorf("hot by SchedP99 at 30%% CPU: scale = %v, want 0.5", c.Scale())
	}
	// Saturated on entering: FirstCut.
	c = a.Step(cpugate.Control{}, cpugate.Reading{CPU: 1.0}, t0)
	if c.Scale() != 0.5 {
		t.Errorf("entering at 90%%: scale = %v, want 0.5", c.Scale())
	}
}

func TestAdaptiveHysteresisAndRamp(t *testing.T) {
	// Hot once, then warm (between 80% and 90%) for 10 s, then calm.
	steps := trace(cpugate.Adaptive{}, 30*time.Second, func(at time.Duration) float64 {
		switch {
		case at == 0:
			return 1.0
		case at <= 10*time.Second:
			return 0.85
		}
		return 0.3
	})
	for _, s := range steps {
		var wantState cpugate.State
		var want float64
		switch {
		case s.at < 15*time.Second: // warm holds; the cooldown runs from the last warm reading, at 10 s
			wantState, want = cpugate.Shedding, 0.5
		case s.at < 20*time.Second:
			// Ramping since 15 s: +0.05 every 500 ms.
			wantState = cpugate.Ramping
			want = 0.5 + 0.05*float64((s.at-15*time.Second)/(500*time.Millisecond))
		default:
			wantState, want = cpugate.Open, 1
		}
		if s.state != wantState || math.Abs(s.scale-want) > 1e-9 {
			t.Errorf("at %v: state, scale = %v, %v, want %v, %v", s.at, s.state, s.scale, wantState, want)
		}
	}
}

func TestAdaptiveRampPausesWhenWarm(t *testing.T) {
	a := cpugate.Adaptive{}
	var c cpugate.Control
	c = a.Step(c, cpugate.Reading{CPU: 1.0}, t0)
	c = a.Step(c, cpugate.Reading{CPU: 0.1}, t0.Add(5*time.Second))
	if c.State != cpugate.Ramping {
		t.Fatalf("after cooldown: state = %v, want ramping", c.State)
	}
	level := c.Scale()
	for at := 5 * time.Second; at < 20*time.Second; at += interval {
		c = a.Step(c, cpugate.Reading{CPU: 0.85}, t0.Add(at))
	}
	if c.State != cpugate.Ramping || c.Scale() != level {
		t.Errorf("warm while ramping: state, scale = %v, %v, want ramping, %v", c.State, c.Scale(), level)
	}
}

func TestAdaptiveCooldownDoublesOnFlapsAndResets(t *testing.T) {
	a := cpugate.Adaptive{}
	var c cpugate.Control
	at := time.Duration(0)
	observe := func(cpu float64) {
		c = a.Step(c, cpugate.Reading{CPU: cpu}, t0.Add(at))
		at += interval
	}
	// Each cycle: hot once, calm until ramping starts, then hot again: a flap.
	wantCooldowns := []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 40 * time.Second}
	for i, want := range wantCooldowns {
		observe(1.0)
		if c.Cooldown != want {
			t.Errorf("cycle %d: Cooldown = %v, want %v", i, c.Cooldown, want)
		}
		for c.State != cpugate.Ramping {
			observe(0.1)
		}
	}
	// A calm minute resets it.
	for c.State != cpugate.Open {
		observe(0.1)
	}
	for start := at; at-start < time.Minute; {
		observe(0.1)
	}
	observe(1.0)
	if c.Cooldown != 5*time.Second {
		t.Errorf("after a calm minute: Cooldown = %v, want 5s", c.Cooldown)
	}
}

// TestSquareWave drives both policies with square waves of many periods and
// duty cycles. Whatever the wave, the gate enters Shedding at most once per
// cooldown and leaves it at most once per cooldown: it cannot flap faster
// than the cooldown, however fast the load does.
func TestSquareWave(t *testing.T) {
	policies := []cpugate.Policy{cpugate.Fixed{}, cpugate.Adaptive{}}
	periods := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second,
		8 * time.Second, 10 * time.Second, 11 * time.Second, 15 * time.Second, 30 * time.Second}
	for _, p := range policies {
		for _, period := range periods {
			for _, duty := range []float64{0.1, 0.5, 0.9} {
				name := fmt.Sprintf("%T/%v/%v", p, period, duty)
				t.Run(name, func(t *testing.T) {
					hot := time.Duration(float64(period) * duty)
					steps := trace(p, 10*time.Minute, func(at time.Duration) float64 {
						if at%period < hot {
							return 1.0
						}
						return 0.3
					})
					var enters, exits []time.Duration
					for i := range steps {
						was, is := i > 0 && steps[i-1].state == cpugate.Shedding, steps[i].state == cpugate.Shedding
						switch {
						case !was && is:
							enters = append(enters, steps[i].at)
						case was && !is:
							exits = append(exits, steps[i].at)
						}
					}
					for _, flips := range [][]time.Duration{enters, exits} {
						for i := 1; i < len(flips); i++ {
							if d := flips[i] - flips[i-1]; d < 5*time.Second { // the default cooldown
								t.Errorf("flips at %v and %v, %v apart: less than a cooldown", flips[i-1], flips[i], d)
							}
						}
					}
					t.Logf("%d entries into shedding in 10 min", len(enters))
				})
			}
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		p     cpugate.Policy
		field string
	}{
		{cpugate.Fixed{Threshold: 1.2}, "Fixed.Threshold"},
		{cpugate.Fixed{Threshold: -0.1}, "Fixed.Threshold"},
		{cpugate.Fixed{Threshold: math.NaN()}, "Fixed.Threshold"},
		{cpugate.Fixed{Factor: 1.5}, "Fixed.Factor"},
		{cpugate.Fixed{Cooldown: -time.Second}, "Fixed.Cooldown"},
		{cpugate.Fixed{SchedP99: -1}, "Fixed.SchedP99"},
		{cpugate.Adaptive{Enter: 2}, "Adaptive.Enter"},
		{cpugate.Adaptive{Recover: 0.95}, "Adaptive.Recover"},
		{cpugate.Adaptive{Enter: 0.7}, "Adaptive.Recover"}, // default 0.8 is not below 0.7
		{cpugate.Adaptive{FirstCut: 1}, "Adaptive.FirstCut"},
		{cpugate.Adaptive{Cut: 1.1}, "Adaptive.Cut"},
		{cpugate.Adaptive{HoldOff: -1}, "Adaptive.HoldOff"},
		{cpugate.Adaptive{Floor: -0.2}, "Adaptive.Floor"},
		{cpugate.Adaptive{Cooldown: -1}, "Adaptive.Cooldown"},
		{cpugate.Adaptive{Cooldown: 10 * time.Second, MaxCooldown: 5 * time.Second}, "Adaptive.MaxCooldown"},
		{cpugate.Adaptive{RampStep: 2}, "Adaptive.RampStep"},
		{cpugate.Adaptive{RampEvery: -1}, "Adaptive.RampEvery"},
		{cpugate.Adaptive{FlapWindow: -1}, "Adaptive.FlapWindow"},
		{cpugate.Adaptive{Calm: -1}, "Adaptive.Calm"},
		{cpugate.Adaptive{SchedP99: -1}, "Adaptive.SchedP99"},
	}
	for _, tt := range tests {
		t.Run(tt.field, func(t *testing.T) {
			err := tt.p.Validate()
			if !errors.Is(err, floodgate.ErrInvalidOption) || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("%+v.Validate() = %v, want ErrInvalidOption naming %s", tt.p, err, tt.field)
			}
			if _, err := cpugate.New(cpugate.SamplerFunc(nil), cpugate.WithPolicy(tt.p)); !errors.Is(err, floodgate.ErrInvalidOption) {
				t.Errorf("New(WithPolicy(%+v)) error = %v, want ErrInvalidOption", tt.p, err)
			}
		})
	}
	for _, p := range []cpugate.Policy{cpugate.Fixed{}, cpugate.Adaptive{}, cpugate.Fixed{Threshold: 1, Factor: 1}} {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v.Validate() = %v, want nil", p, err)
		}
	}
}
