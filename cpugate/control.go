package cpugate

import (
	"fmt"
	"math"
	"time"

	"github.com/floodgate-go/floodgate"
)

// State is the gate's regime.
type State uint8

const (
	// Open: full limits, scale 1.
	Open State = iota
	// Shedding: limits scaled down, because CPU is hot or was hot less than
	// a cooldown ago.
	Shedding
	// Ramping: the cooldown is over and the scale is climbing back to 1
	// ([Adaptive] only; [Fixed] restores full limits at once).
	Ramping
)

var stateNames = [...]string{"open", "shedding", "ramping"}

// String returns the state's lower-case name, such as "shedding".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// Control is the controller's memory: the value a [Policy] maps to its
// successor at each reading. Policies are pure functions of (Control,
// Reading, time), so a trace of readings replays to the same decisions.
//
// The zero Control is Open with full limits and no history.
type Control struct {
	// State is the current regime and Since when it began.
	State State
	Since time.Time
	// Level is the scale while Shedding or Ramping. In Open the scale is 1
	// whatever Level holds; use [Control.Scale].
	Level float64
	// LastHot is the time of the last hot reading (for [Adaptive], also of
	// the last warm one while Shedding): the cooldown runs from it.
	LastHot time.Time
	// LastCut is the time of the last multiplicative cut ([Adaptive]).
	LastCut time.Time
	// LastRamp is the time of the last ramp step ([Adaptive]).
	LastRamp time.Time
	// Recovered is when the gate last left Shedding ([Adaptive]): re-entering
	// soon after counts as a flap.
	Recovered time.Time
	// Cooldown is the cooldown in force, which [Adaptive] doubles on flaps;
	// 0 means the policy's base cooldown.
	Cooldown time.Duration
}

// Scale returns the factor limits are multiplied by: 1 when Open, else Level.
func (c Control) Scale() float64 {
	if c.State == Open {
		return 1
	}
	return c.Level
}

// A Policy decides the gate's scale from CPU readings. Step must be a pure
// function: the same Control, Reading and time give the same result. Validate
// reports a configuration error, wrapping [floodgate.ErrInvalidOption] and naming the
// field; [New] calls it.
type Policy interface {
	Step(c Control, r Reading, now time.Time) Control
	Validate() error
}

// frac reports whether v is in (0, 1]; NaN is not.
func frac(v float64) bool { return v > 0 && v <= 1 }

func invalid(field string, v any, want string) error {
	return fmt.Errorf("%w: cpugate: %s = %v, want %s", floodgate.ErrInvalidOption, field, v, want)
}

// Fixed is the classic policy. When a reading is at or above Threshold the
// scale drops to Factor; it stays there until no reading has been hot for a
// whole Cooldown, measured from the last hot reading, and then full limits
// return at once.
//
// Its strength is predictability: one threshold, one factor, one wait. Its
// weakness is the cliff: under sustained overload it alternates between
// Factor and full limits at most once per Cooldown, and Factor is either too
// harsh or too mild for a given load. [Adaptive] finds the level instead.
//
// The zero value is the classic configuration: a zero field takes the
// default given in its comment.
type Fixed struct {
	// Threshold is the CPU fraction, in (0, 1], at or above which a reading
	// is hot. Default 0.8.
	Threshold float64
	// Factor is the scale while shedding, in (0, 1]. Default 0.2.
	Factor float64
	// Cooldown is how long readings must stay below Threshold, from the last
	// hot one, before full limits return. Default 5 s.
	Cooldown time.Duration
	// SchedP99, when positive, also counts a reading hot when its
	// [Reading.SchedP99] is at or above it (see [SchedGuard]). Default 0, off.
	SchedP99 time.Duration
}

// DefaultFactor is the default of [Fixed.Factor], the scale while shedding.
const DefaultFactor = 0.2

// defaultCooldown is the default Cooldown of both policies.
const defaultCooldown = 5 * time.Second

func (f Fixed) withDefaults() Fixed {
	if f.Threshold == 0 {
		f.Threshold = 0.8
	}
	if f.Factor == 0 {
		f.Factor = DefaultFactor
	}
	if f.Cooldown == 0 {
		f.Cooldown = defaultCooldown
	}
	return f
}

// Validate reports whether f's fields are in range. Zero fields are valid:
// they take their defaults.
func (f Fixed) Validate() error {
	f = f.withDefaults()
	switch {
	case !frac(f.Threshold):
		return invalid("Fixed.Threshold", f.Threshold, "a fraction in (0, 1]")
	case !frac(f.Factor):
		return invalid("Fixed.Factor", f.Factor, "a scale in (0, 1]")
	case f.Cooldown < 0:
		return invalid("Fixed.Cooldown", f.Cooldown, "a positive duration")
	case f.SchedP99 < 0:
		return invalid("Fixed.SchedP99", f.SchedP99, "0 (off) or a positive duration")
	}
	return nil
}

// Step returns the Control after reading r at time now.
func (f Fixed) Step(c Control, r Reading, now time.Time) Control {
	f = f.withDefaults()
	c.Cooldown = f.Cooldown
	if r.CPU >= f.Threshold || (f.SchedP99 > 0 && r.SchedP99 >= f.SchedP99) {
		if c.State != Shedding {
			c.State, c.Since = Shedding, now
		}
		c.Level, c.LastHot = f.Factor, now
		return c
	}
	if c.State != Open && now.Sub(c.LastHot) >= f.Cooldown {
		c.State, c.Since, c.Level = Open, now, 1
	}
	return c
}

// Adaptive is a policy with hysteresis that searches for the scale the
// server can carry, instead of jumping between two fixed levels.
//
//   - A reading at or above Enter is hot. Hot readings cut the scale
//     multiplicatively, at most once per HoldOff (half of it when the
//     reading is saturated) so that the CPU has time to answer a cut
//     before the next one. A saturated reading (97% or more, where CPU no
//     longer tells how far the load exceeds what the server can carry)
//     cuts by FirstCut on entering Shedding from Open, and by Cut on
//     re-entering it from Ramping (the scale already reflects earlier
//     cuts) and on every cut after that; a reading between Enter and
//     saturation cuts only by what would bring it to the middle of the
//     warm band, (Enter+Recover)/2, never harsher than those. A reading
//     hot by SchedP99 alone cuts by FirstCut or Cut. The scale never goes
//     below Floor.
//   - Readings between Recover and Enter are warm: they neither cut nor let
//     the gate recover. While Shedding they restart the cooldown; while
//     Ramping they pause the ramp. This band is where the gate settles
//     under sustained overload.
//   - Once every reading for a whole cooldown, from the last hot or warm
//     one, has been below Recover, the gate ramps: the scale rises by
//     RampStep every RampEvery until it reaches 1 (Open).
//   - Entering Shedding while Ramping, or less than FlapWindow after
//     reaching Open, is a flap: the cooldown doubles, up to MaxCooldown. It
//     returns to Cooldown after Calm without a hot reading.
//
// The zero value is the default configuration: a zero field takes the
// default given in its comment.
type Adaptive struct {
	// Enter is the CPU fraction at or above which a reading is hot. Default
	// 0.9: with the warm band below it, the gate settles with the CPU
	// between Recover and Enter, so an overloaded server keeps serving
	// close to its capacity.
	Enter float64
	// Recover is the CPU fraction below which a reading is calm, less than
	// Enter. Default 0.8.
	Recover float64
	// FirstCut multiplies the scale on entering Shedding from Open.
	// Default 0.5.
	FirstCut float64
	// Cut multiplies the scale on re-entering Shedding from Ramping and on
	// later hot readings. Default 0.75.
	Cut float64
	// HoldOff is the least time between two cuts; half of it between
	// cuts on saturated readings. Default 1 s.
	HoldOff time.Duration
	// Floor is the lowest scale, in (0, 1]. Default 0.05: limits are
	// usually overbooked (their sum several times what the server
	// carries), and when a request's cost rises the scale the server can
	// carry may fall well below Fixed's factor of 0.2.
	Floor float64
	// Cooldown is the base wait from the last hot or warm reading before the
	// ramp starts. Default 5 s.
	Cooldown time.Duration
	// MaxCooldown caps the doubled cooldown. Default 8 × Cooldown.
	MaxCooldown time.Duration
	// RampStep is added to the scale at each ramp step, in (0, 1]. Default
	// 0.05.
	RampStep float64
	// RampEvery is the time between ramp steps. Default 500 ms.
	RampEvery time.Duration
	// FlapWindow is how soon after reaching Open a hot reading counts as a
	// flap. Default 2 × Cooldown.
	FlapWindow time.Duration
	// Calm is how long without a hot reading resets the cooldown to its
	// base. Default 1 min.
	Calm time.Duration
	// SchedP99, when positive, also counts a reading hot when its
	// [Reading.SchedP99] is at or above it (see [SchedGuard]). Default 0, off.
	SchedP99 time.Duration
}

func (a Adaptive) withDefaults() Adaptive {
	if a.Enter == 0 {
		a.Enter = 0.9
	}
	if a.Recover == 0 {
		a.Recover = 0.8
	}
	if a.FirstCut == 0 {
		a.FirstCut = 0.5
	}
	if a.Cut == 0 {
		a.Cut = 0.75
	}
	if a.HoldOff == 0 {
		a.HoldOff = time.Second
	}
	if a.Floor == 0 {
		a.Floor = 0.05
	}
	if a.Cooldown == 0 {
		a.Cooldown = defaultCooldown
	}
	if a.MaxCooldown == 0 {
		a.MaxCooldown = 8 * a.Cooldown
	}
	if a.RampStep == 0 {
		a.RampStep = 0.05
	}
	if a.RampEvery == 0 {
		a.RampEvery = 500 * time.Millisecond
	}
	if a.FlapWindow == 0 {
		a.FlapWindow = 2 * a.Cooldown
	}
	if a.Calm == 0 {
		a.Calm = time.Minute
	}
	return a
}

// Validate reports whether a's fields are in range and consistent. Zero
// fields are valid: they take their defaults.
func (a Adaptive) Validate() error {
	a = a.withDefaults()
	switch {
	case !frac(a.Enter):
		return invalid("Adaptive.Enter", a.Enter, "a fraction in (0, 1]")
	case !(a.Recover > 0 && a.Recover < a.Enter):
		return invalid("Adaptive.Recover", a.Recover, "a fraction in (0, Enter)")
	case !(a.FirstCut > 0 && a.FirstCut < 1):
		return invalid("Adaptive.FirstCut", a.FirstCut, "a factor in (0, 1)")
	case !(a.Cut > 0 && a.Cut < 1):
		return invalid("Adaptive.Cut", a.Cut, "a factor in (0, 1)")
	case a.HoldOff < 0:
		return invalid("Adaptive.HoldOff", a.HoldOff, "a positive duration")
	case !frac(a.Floor):
		return invalid("Adaptive.Floor", a.Floor, "a scale in (0, 1]")
	case a.Cooldown < 0:
		return invalid("Adaptive.Cooldown", a.Cooldown, "a positive duration")
	case a.MaxCooldown < a.Cooldown:
		return invalid("Adaptive.MaxCooldown", a.MaxCooldown, "at least Cooldown")
	case !frac(a.RampStep):
		return invalid("Adaptive.RampStep", a.RampStep, "a step in (0, 1]")
	case a.RampEvery < 0:
		return invalid("Adaptive.RampEvery", a.RampEvery, "a positive duration")
	case a.FlapWindow < 0:
		return invalid("Adaptive.FlapWindow", a.FlapWindow, "a positive duration")
	case a.Calm < 0:
		return invalid("Adaptive.Calm", a.Calm, "a positive duration")
	case a.SchedP99 < 0:
		return invalid("Adaptive.SchedP99", a.SchedP99, "0 (off) or a positive duration")
	}
	return nil
}

// Step returns the Control after reading r at time now.
func (a Adaptive) Step(c Control, r Reading, now time.Time) Control {
	a = a.withDefaults()
	// Reset only outside Shedding, so a long doubled cooldown is never cut
	// short while it is being waited out.
	if c.Cooldown == 0 || (c.State != Shedding && !c.LastHot.IsZero() && now.Sub(c.LastHot) >= a.Calm) {
		c.Cooldown = a.Cooldown
	}
	hot := r.CPU >= a.Enter || (a.SchedP99 > 0 && r.SchedP99 >= a.SchedP99)
	warm := !hot && r.CPU >= a.Recover

	switch {
	case hot && c.State != Shedding:
		flap := c.State == Ramping || (!c.Recovered.IsZero() && now.Sub(c.Recovered) < a.FlapWindow)
		if flap {
			c.Cooldown = min(2*c.Cooldown, a.MaxCooldown)
		}
		cut := a.FirstCut
		if c.State == Ramping {
			cut = a.Cut // the level already reflects earlier cuts
		}
		c.Level = math.Max(a.Floor, c.Scale()*a.cutFor(r.CPU, cut))
		c.State, c.Since, c.LastCut, c.LastHot = Shedding, now, now, now
	case hot: // Shedding
		if now.Sub(c.LastCut) >= a.holdOff(r) {
			c.Level = math.Max(a.Floor, c.Level*a.cutFor(r.CPU, a.Cut))
			c.LastCut = now
		}
		c.LastHot = now
	case c.State == Shedding && warm:
		// Warm readings hold the gate where it is: the level is good
		// enough not to cut, not good enough to give back.
		c.LastHot = now
	case c.State == Shedding && now.Sub(c.LastHot) >= c.Cooldown:
		c.State, c.Since, c.LastRamp, c.Recovered = Ramping, now, now, now
	case c.State == Ramping && !warm && now.Sub(c.LastRamp) >= a.RampEvery:
		c.Level += a.RampStep
		c.LastRamp = now
		if c.Level >= 1-1e-9 { // sums of RampStep may fall short of 1 by rounding
			c.State, c.Since, c.Level, c.Recovered = Open, now, 1, now
		}
	case c.State == Ramping && warm:
		// A paused ramp resumes a full RampEvery after the warmth ends, not
		// at once, so the CPU can show the effect of the last step.
		c.LastRamp = now
	}
	return c
}

// saturated is the CPU reading from which Adaptive cuts by its full factors:
// this close to 100% a reading no longer says how much more load than
// capacity there is, only that there is more (readings average over an
// interval, so a saturated server often reads a little under 100%).
const saturated = 0.97

// holdOff returns the least time from the last cut to one for reading r:
// HoldOff, or half of it for a saturated reading. A saturated server's
// queue grows by the excess every moment, and its calls start missing
// their deadlines within a second or two, so it cannot wait as long for
// the CPU to answer the last cut as a server that is merely hot.
func (a Adaptive) holdOff(r Reading) time.Duration {
	if r.CPU >= saturated {
		return a.HoldOff / 2
	}
	return a.HoldOff
}

// cutFor returns the factor a hot reading of cpu cuts the scale by: base
// when the reading is saturated or hot by SchedP99 alone, else the factor
// that would bring the reading to the middle of the warm band, never
// harsher than base. A reading just over Enter, as noise around a load that
// the server carries, then costs a small cut instead of half the limits.
func (a Adaptive) cutFor(cpu, base float64) float64 {
	if cpu >= saturated || cpu < a.Enter {
		return base
	}
	return math.Max(base, math.Min(1, (a.Enter+a.Recover)/2/cpu))
}
