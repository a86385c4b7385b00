package loadgen

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"go.yaml.in/yaml/v3"
)

// A Profile describes the simulated callers: who calls, how often, with which
// API key, and how the offered load ramps. It is what a profile file (YAML)
// decodes to; see testdata/multitenant/profile.yaml.
type Profile struct {
	// Capacity is the server's capacity in calls per second that the ramp
	// is a multiple of, when it is neither measured nor given by a flag.
	Capacity float64 `yaml:"capacity"`
	// Deadline is every call's deadline. Default 500ms.
	Deadline Duration `yaml:"deadline"`
	// MaxInFlight bounds each caller's calls in flight; an arrival beyond
	// it is counted as dropped, never queued, so the load stays open-loop.
	// Default 2000.
	MaxInFlight int `yaml:"max_in_flight"`
	// Ramp is the offered load, as a multiple of the capacity.
	Ramp Ramp `yaml:"ramp"`
	// ProbeKey is the API key of an unlimited tenant, which the demo uses
	// to measure the server's capacity before the run. Optional.
	ProbeKey string `yaml:"probe_key"`
	// Callers are the simulated callers, in the order tables list them.
	Callers []CallerSpec `yaml:"callers"`
}

// CallerSpec is one simulated caller: a tenant, or anonymous callers.
type CallerSpec struct {
	// Name labels the caller in tables and the summary.
	Name string `yaml:"name"`
	// Key is the API key sent as x-api-key metadata; empty for an
	// anonymous caller.
	Key string `yaml:"key"`
	// Rate is the mean of the caller's Poisson arrivals, in calls per
	// second. Ignored for the ramp caller.
	Rate float64 `yaml:"rate"`
	// Ramp marks the one caller whose rate makes up the rest of the ramp:
	// the ramp's offered load minus every steady caller's rate.
	Ramp bool `yaml:"ramp"`
	// Method is "Allocate" (default) or "GetStock".
	Method string `yaml:"method"`
}

// Ramp shapes the offered load over a run as a multiple of the capacity:
// From for the first tenth, up to To over the next 35%, To for 15%, back down
// to From over 30%, and From for the last tenth, so that a run shows the
// server entering overload, holding in it, and recovering.
type Ramp struct {
	From float64 `yaml:"from"`
	To   float64 `yaml:"to"`
}

// Factor returns the ramp's multiple of the capacity at fraction x ∈ [0, 1]
// of the run.
func (r Ramp) Factor(x float64) float64 {
	lerp := func(a, b, t float64) float64 { return a + (b-a)*t }
	switch {
	case x < 0.10:
		return r.From
	case x < 0.45:
		return lerp(r.From, r.To, (x-0.10)/0.35)
	case x < 0.60:
		return r.To
	case x < 0.90:
		return lerp(r.To, r.From, (x-0.60)/0.30)
	default:
		return r.From
	}
}

// Duration is a time.Duration written as "500ms" in YAML.
type Duration time.Duration

func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*d = Duration(v)
	return nil
}

const (
	defaultDeadline    = 500 * time.Millisecond
	defaultMaxInFlight = 2000
	methodAllocate     = "Allocate"
	methodGetStock     = "GetStock"
)

// LoadProfile reads and validates a profile file.
func LoadProfile(path string) (*Profile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := ParseProfile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParseProfile decodes a profile strictly (unknown fields are errors), fills
// in the defaults and validates it.
func ParseProfile(data []byte) (*Profile, error) {
	var p Profile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&p); err != nil {
		return nil, err
	}
	if p.Deadline == 0 {
		p.Deadline = Duration(defaultDeadline)
	}
	if p.MaxInFlight == 0 {
		p.MaxInFlight = defaultMaxInFlight
	}
	for i := range p.Callers {
		if p.Callers[i].Method == "" {
			p.Callers[i].Method = methodAllocate
		}
	}
	return &p, p.validate()
}

func (p *Profile) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.Capacity < 0 || math.IsNaN(p.Capacity) || math.IsInf(p.Capacity, 0) {
		bad("capacity: must be a finite number ≥ 0")
	}
	if p.Deadline < 0 {
		bad("deadline: must be positive")
	}
	if p.MaxInFlight < 0 {
		bad("max_in_flight: must be positive")
	}
	if !(p.Ramp.From >= 0 && p.Ramp.To >= 0) || math.IsInf(p.Ramp.From, 0) || math.IsInf(p.Ramp.To, 0) {
		bad("ramp: from and to must be finite numbers ≥ 0")
	}
	if len(p.Callers) == 0 {
		bad("callers: none")
	}
	names := make(map[string]bool)
	ramps := 0
	for i, c := range p.Callers {
		switch {
		case c.Name == "":
			bad("callers[%d].name: empty", i)
		case names[c.Name]:
			bad("callers[%d].name: %q appears twice", i, c.Name)
		}
		names[c.Name] = true
		if c.Ramp {
			ramps++
		} else if !(c.Rate >= 0) || math.IsInf(c.Rate, 0) {
			bad("callers[%d].rate: must be a finite number ≥ 0", i)
		}
		if c.Method != methodAllocate && c.Method != methodGetStock {
			bad("callers[%d].method: want %s or %s", i, methodAllocate, methodGetStock)
		}
	}
	if ramps > 1 {
		bad("callers: %d callers have ramp: true, want at most one", ramps)
	}
	return errors.Join(errs...)
}

// SteadyRate is the sum of the steady callers' rates.
func (p *Profile) SteadyRate() float64 {
	var sum float64
	for _, c := range p.Callers {
		if !c.Ramp {
			sum += c.Rate
		}
	}
	return sum
}
