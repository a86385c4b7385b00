package loadgen

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// arrivals drains a schedule up to end.
func arrivals(s *schedule, end time.Duration) []time.Duration {
	var ts []time.Duration
	for {
		at, ok := s.next(end)
		if !ok {
			return ts
		}
		ts = append(ts, at)
	}
}

func TestScheduleMeanRate(t *testing.T) {
	// 100/s for 2,000 s: 200,000 arrivals expected, with a standard
	// deviation of about 450. The seeds are fixed, so this is not flaky:
	// the tolerance is for the check to mean something across seeds.
	const rate, secs = 100.0, 2000
	for seed := range uint64(3) {
		got := len(arrivals(newSchedule(seed, 7, rate, constantRate(rate)), secs*time.Second))
		want := rate * secs
		if math.Abs(float64(got)-want) > 4*math.Sqrt(want) {
			t.Errorf("seed %d: %d arrivals in %ds at %v/s, want %v ± %.0f", seed, got, secs, rate, want, 4*math.Sqrt(want))
		}
	}
}

func TestScheduleGapsAreExponential(t *testing.T) {
	// Poisson arrivals have exponential gaps: the mean is 1/rate and the
	// standard deviation equals the mean.
	const rate = 250.0
	ts := arrivals(newSchedule(42, 0, rate, constantRate(rate)), 400*time.Second)
	var sum, sumSq float64
	prev := time.Duration(0)
	for _, at := range ts {
		gap := (at - prev).Seconds()
		sum += gap
		sumSq += gap * gap
		prev = at
	}
	n := float64(len(ts))
	mean := sum / n
	sd := math.Sqrt(sumSq/n - mean*mean)
	if want := 1 / rate; math.Abs(mean-want)/want > 0.02 {
		t.Errorf("mean gap = %v s, want %v s within 2%%", mean, want)
	}
	if cv := sd / mean; math.Abs(cv-1) > 0.02 {
		t.Errorf("coefficient of variation of the gaps = %.4f, want 1 within 0.02", cv)
	}
}

func TestScheduleFollowsAChangingRate(t *testing.T) {
	// Thinning: 40/s for the first 500 s, then 160/s, drawn with a peak of 200/s.
	rate := func(at time.Duration) float64 {
		if at < 500*time.Second {
			return 40
		}
		return 160
	}
	ts := arrivals(newSchedule(9, 9, 200, rate), 1000*time.Second)
	var first int
	for _, at := range ts {
		if at < 500*time.Second {
			first++
		}
	}
	second := len(ts) - first
	for _, c := range []struct {
		name      string
		got, want float64
	}{{"first half", float64(first), 40 * 500}, {"second half", float64(second), 160 * 500}} {
		if math.Abs(c.got-c.want) > 4*math.Sqrt(c.want) {
			t.Errorf("%s: %v arrivals, want %v ± %.0f", c.name, c.got, c.want, 4*math.Sqrt(c.want))
		}
	}
}

func TestScheduleIsDeterministic(t *testing.T) {
	end := 30 * time.Second
	a := arrivals(newSchedule(1, 2, 50, constantRate(50)), end)
	b := arrivals(newSchedule(1, 2, 50, constantRate(50)), end)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("same seeds, different arrivals (-first +second):\n%s", diff)
	}
	c := arrivals(newSchedule(1, 3, 50, constantRate(50)), end)
	if cmp.Equal(a, c) {
		t.Error("different seeds gave the same arrivals")
	}
}

func TestScheduleEnds(t *testing.T) {
	end := 5 * time.Second
	s := newSchedule(3, 3, 100, constantRate(100))
	ts := arrivals(s, end)
	if len(ts) == 0 {
		t.Fatal("no arrivals")
	}
	for i, at := range ts {
		if at < 0 || at >= end {
			t.Fatalf("arrival %d at %v, outside [0, %v)", i, at, end)
		}
		if i > 0 && at < ts[i-1] {
			t.Fatalf("arrival %d at %v before arrival %d at %v", i, at, i-1, ts[i-1])
		}
	}
	if at, ok := s.next(time.Hour); ok {
		t.Errorf("next after the end = %v, true; want none, even with a later end", at)
	}
	if _, ok := newSchedule(1, 1, 0, constantRate(0)).next(time.Hour); ok {
		t.Error("a schedule with peak 0 has an arrival")
	}
}

func TestRampFactor(t *testing.T) {
	r := Ramp{From: 0.5, To: 3}
	for _, tc := range []struct{ x, want float64 }{
		{0, 0.5}, {0.05, 0.5}, {0.10, 0.5},
		{0.275, 1.75}, // halfway up
		{0.45, 3}, {0.5, 3}, {0.59, 3},
		{0.75, 1.75}, // halfway down
		{0.90, 0.5}, {1, 0.5},
	} {
		if got := r.Factor(tc.x); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("factor(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
}

func TestGeneratorSplitsTheRamp(t *testing.T) {
	prof := &Profile{
		Ramp: Ramp{From: 0.5, To: 3},
		Callers: []CallerSpec{
			{Name: "a", Rate: 30}, {Name: "b", Rate: 20}, {Name: "noisy", Ramp: true},
		},
	}
	g := &Generator{prof: prof, capacity: 200, length: 100 * time.Second}
	for _, tc := range []struct {
		at               time.Duration
		target, rampRate float64
	}{
		{0, 100, 50},
		{50 * time.Second, 600, 550},
		{99 * time.Second, 100, 50},
	} {
		if got := g.targetAt(tc.at); got != tc.target {
			t.Errorf("targetAt(%v) = %v, want %v", tc.at, got, tc.target)
		}
		if got := g.rampRate(tc.at); got != tc.rampRate {
			t.Errorf("rampRate(%v) = %v, want %v", tc.at, got, tc.rampRate)
		}
		if got := g.offeredAt(tc.at); got != tc.target {
			t.Errorf("offeredAt(%v) = %v, want %v", tc.at, got, tc.target)
		}
	}
	if got, want := g.rampPeak(), 550.0; got != want {
		t.Errorf("rampPeak() = %v, want %v", got, want)
	}
	// Steady callers above the ramp's target: the ramp caller sends nothing.
	g.capacity = 40
	if got := g.rampRate(0); got != 0 {
		t.Errorf("rampRate with steady callers above the target = %v, want 0", got)
	}
	if got, want := g.offeredAt(0), 50.0; got != want {
		t.Errorf("offeredAt with steady callers above the target = %v, want %v", got, want)
	}
}

func TestParseProfiles(t *testing.T) {
	for _, name := range []string{"profile.yaml", "test-profile.yaml"} {
		t.Run(name, func(t *testing.T) {
			p, err := LoadProfile(testdata(t, name))
			if err != nil {
				t.Fatal(err)
			}
			var ramps, anonymous int
			for _, c := range p.Callers {
				if c.Ramp {
					ramps++
				}
				if c.Key == "" {
					anonymous++
				}
			}
			if ramps != 1 || anonymous != 1 || len(p.Callers) != 11 {
				t.Errorf("%d callers, %d ramp, %d anonymous; want 11, 1 and 1", len(p.Callers), ramps, anonymous)
			}
			if p.ProbeKey == "" || p.Capacity <= 0 {
				t.Errorf("probe_key %q, capacity %v: want both set", p.ProbeKey, p.Capacity)
			}
		})
	}
	// The demo's profile must match what the multitenant command's doc
	// comment promises.
	p, err := LoadProfile(testdata(t, "profile.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.Ramp, (Ramp{From: 0.5, To: 3}); got != want {
		t.Errorf("profile.yaml ramp = %+v, want %+v", got, want)
	}
}

func TestParseProfileDefaults(t *testing.T) {
	p, err := ParseProfile([]byte("callers: [{name: a, rate: 1}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := &Profile{
		Deadline:    Duration(defaultDeadline),
		MaxInFlight: defaultMaxInFlight,
		Callers:     []CallerSpec{{Name: "a", Rate: 1, Method: methodAllocate}},
	}
	if diff := cmp.Diff(want, p, cmp.AllowUnexported(Profile{})); diff != "" {
		t.Errorf("parseProfile (-want +got):\n%s", diff)
	}
}

func TestParseProfileErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"unknown field", "callers: [{name: a, rate: 1, colour: red}]", "field colour not found"},
		{"no callers", "capacity: 10", "callers: none"},
		{"bad deadline", "deadline: soon\ncallers: [{name: a}]", "invalid duration"},
		{"negative rate", "callers: [{name: a, rate: -1}]", "callers[0].rate"},
		{"duplicate name", "callers: [{name: a}, {name: a}]", `"a" appears twice`},
		{"empty name", "callers: [{rate: 1}]", "callers[0].name: empty"},
		{"two ramps", "callers: [{name: a, ramp: true}, {name: b, ramp: true}]", "want at most one"},
		{"method", "callers: [{name: a, method: Delete}]", "callers[0].method"},
		{"ramp", "ramp: {from: -1, to: 2}\ncallers: [{name: a}]", "ramp:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseProfile([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parseProfile(%q) = %v, want an error containing %q", tc.in, err, tc.want)
			}
		})
	}
	if _, err := LoadProfile("no-such-profile.yaml"); !os.IsNotExist(err) {
		t.Errorf("loadProfile(missing) = %v, want a not-exist error", err)
	}
}

// testdata returns the path of a file in the repository's
// testdata/multitenant directory.
func testdata(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join("..", "..", "..", "..", "testdata", "multitenant", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}
