package main

import (
	"bytes"
	"context"
	"github.com/floodgate-go/floodgate/bench/internal/fair"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary be the experiment's server and neighbour:
// the tests re-execute it with "server" or "neighbour" as its first
// argument.
func TestMain(m *testing.M) {
	if sub, run, ok := subcommand(os.Args); ok {
		if err := run(os.Args[2:]); err != nil {
			os.Stderr.WriteString("overload " + sub + ": " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestQuick runs the quick experiment over loopback, unpinned and outside
// any cgroup, and checks that it produces well-formed, plausible results
// and a report. It asserts no timings.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("runs servers for about 15 s")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 35*time.Second)
	defer cancel()
	cfg := Config{
		Quick: true, Cost: time.Millisecond, Deadline: 500 * time.Millisecond, SLO: 100 * time.Millisecond,
		Variants: []string{"A", "E"}, Seed: 1, Exe: []string{exe}, Log: t.Logf,
	}
	res, err := experiment(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Capacity <= 0 {
		t.Fatalf("capacity = %v, want > 0", res.Capacity)
	}
	if want := 2 * 2; len(res.Runs) != want {
		t.Fatalf("%d runs, want %d", len(res.Runs), want)
	}
	for _, r := range res.Runs {
		all := r.window("all")
		if all == nil || all.Sent <= 0 {
			t.Errorf("%s/%s: no calls sent", r.Scenario, r.Variant)
			continue
		}
		if len(r.Seconds) == 0 || len(r.Gate) == 0 {
			t.Errorf("%s/%s: %d seconds, %d gate readings", r.Scenario, r.Variant, len(r.Seconds), len(r.Gate))
		}
		for _, g := range r.Gate {
			if g.Scale <= 0 || g.Scale > 1 {
				t.Errorf("%s/%s: gate scale %v out of (0, 1]", r.Scenario, r.Variant, g.Scale)
				break
			}
		}
		if all.HealthSent == 0 {
			t.Errorf("%s/%s: no health probes", r.Scenario, r.Variant)
		}
	}
	// At half the capacity, a server without admission control serves.
	if w := res.run("sweep", "A").window(loadName(0.5)); w == nil || w.OKRate <= 0 {
		t.Errorf("sweep/A at 0.5×: no OK calls (%+v)", w)
	}
	if r := res.run("step", "A"); r == nil || r.window("high") == nil {
		t.Error("step/A: no window of the high segment")
	}

	// The rejection-cost scenario ran against E alone (A rejects nothing):
	// its figures are well-formed, whatever their values.
	if len(res.RejCosts) != 1 || res.RejCosts[0].Variant != "E" {
		t.Fatalf("rejection costs: %+v, want one, of E", res.RejCosts)
	}
	rc := res.RejCosts[0]
	if len(rc.Phases) != 4 {
		t.Fatalf("rejcost/E: %d phases, want 4", len(rc.Phases))
	}
	for _, ph := range rc.Phases {
		if ph.Secs <= 0 || ph.CPUSec < 0 || math.IsNaN(ph.CPUSec) {
			t.Errorf("rejcost/E %s: %.3f s, %v CPU-s", ph.Name, ph.Secs, ph.CPUSec)
		}
		if ph.Name != "idle" && ph.Sent == 0 {
			t.Errorf("rejcost/E %s: nothing sent", ph.Name)
		}
	}
	if rj := rc.phase("reject"); rj == nil || rj.Rej == 0 {
		t.Errorf("rejcost/E: no rejections in the reject phase (%+v)", rj)
	}
	// The served phase offers half the capacity: under the race detector
	// on a shared machine the controller may still shed a few of its
	// calls, but it must serve nearly all of them.
	if sv := rc.phase("served"); sv == nil || sv.Handle == 0 || 10*sv.Rej > sv.Sent {
		t.Errorf("rejcost/E: the served phase served nothing or rejected more than a tenth (%+v)", sv)
	}
	for _, v := range []float64{rc.IdleCPU, rc.PerServedUs, rc.PerRejectedUs, rc.Ratio, rc.FloorUs} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			t.Errorf("rejcost/E: a figure is not finite: %+v", rc)
			break
		}
	}
	if rc.Valid() != (rc.Ratio >= 0) {
		t.Errorf("rejcost/E: Valid() = %v with ratio %v", rc.Valid(), rc.Ratio)
	}

	dir := t.TempDir()
	res.Command = "cd bench && go run ./cmd/overload -quick"
	jsonPath := filepath.Join(dir, "results.json")
	if err := writeResults(res, jsonPath); err != nil {
		t.Fatal(err)
	}
	back, err := readResults(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	md := filepath.Join(dir, "BENCHMARKS.md")
	charts := filepath.Join(dir, "charts")
	if err := renderAll(back, md, charts); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# Benchmarks", "## Sweep", "## Step", "measured capacity", "## Cost of a rejection", "rejcost", "| scenario | target | E |", "| cost of a rejection | ≤ 1% of a served call's CPU |"} {
		if !bytes.Contains(report, []byte(want)) {
			t.Errorf("the report lacks %q", want)
		}
	}
	for _, name := range []string{"overload-sweep.png", "overload-step.png"} {
		b, err := os.ReadFile(filepath.Join(charts, name))
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Errorf("chart %s: %v", name, err)
		}
	}
	if strings.Contains(string(report), "NaN") {
		t.Error("the report shows NaN")
	}
}

func TestAnalysisHelpers(t *testing.T) {
	if j := jain([]float64{1, 1, 1}); j < 0.999 || j > 1.001 {
		t.Errorf("jain(equal) = %v, want 1", j)
	}
	if j := jain([]float64{1, 0, 0, 0}); j < 0.249 || j > 0.251 {
		t.Errorf("jain(one has all) = %v, want 0.25", j)
	}
	g := []GatePoint{{Scale: 1}, {Scale: 0.5}, {Scale: 0.5}, {Scale: 0.6}, {Scale: 0.4}, {Scale: 0.4}}
	if r := directionReversals("D", g, 0, 1); r != 2 {
		t.Errorf("reversals = %v, want 2", r)
	}
	// CPU = 2 ms per served call + 20 µs per rejection + 0.05 CPU.
	var runs []Run
	r := Run{}
	for i := range 20 {
		h, rej := float64(100+10*(i%5)), 50*(i%7)
		r.Seconds = append(r.Seconds, Second{Handled: h, Rejected: rej, CPU: 0.002*h + 20e-6*float64(rej) + 0.05})
	}
	runs = append(runs, r)
	f := fitCPU(runs)
	if f.PerServedMs < 1.99 || f.PerServedMs > 2.01 || f.PerRejectedUs < 19.9 || f.PerRejectedUs > 20.1 {
		t.Errorf("fit = %+v, want 2 ms and 20 µs", f)
	}
	if countCPUList("0-3,6") != 5 {
		t.Error("countCPUList")
	}
}

func TestSwings(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		hyst float64
		want int
	}{
		{nil, 0, 0},
		{[]float64{3, 3, 3}, 0, 0},
		{[]float64{1, 2, 3, 4}, 0, 0},
		{[]float64{1, 2, 1, 2, 1}, 0, 3},
		// A ripple of ±10% around 10 is no reversal at 25% hysteresis...
		{[]float64{10, 11, 10, 11, 10, 9, 10, 11}, 0.25, 0},
		// ...but counts at 0.
		{[]float64{10, 11, 10, 11}, 0, 2},
		// A climb from 4 to 20, a fall to 8, a climb to 16: two swings,
		// whatever the ripple on the way.
		{[]float64{4, 6, 5, 9, 14, 13, 20, 18, 12, 13, 8, 10, 16}, 0.25, 2},
		// A fall first: setting off is no reversal.
		{[]float64{20, 10, 5, 10}, 0.25, 1},
	} {
		if got := swings(c.xs, c.hyst); got != c.want {
			t.Errorf("swings(%v, %v) = %d, want %d", c.xs, c.hyst, got, c.want)
		}
	}
	// E counts its limit, with hysteresis; points without a limit are
	// skipped, and the window bounds apply.
	g := []GatePoint{{T: 0, Scale: 1, Limit: 10}, {T: 1, Scale: 1, Limit: 20}, {T: 2, Scale: 1}, {T: 3, Scale: 1, Limit: 11}, {T: 4, Scale: 1, Limit: 19}, {T: 5, Scale: 1, Limit: 5}}
	if got := directionReversals("E", g, 0, 10); got != 3 {
		t.Errorf("E reversals = %d, want 3", got)
	}
	if got := directionReversals("E", g, 0, 4); got != 1 {
		t.Errorf("E reversals in [0, 4) = %d, want 1", got)
	}
	if got := directionReversals("A", g, 0, 10); got != 0 {
		t.Errorf("A reversals = %d, want 0 (a constant scale)", got)
	}
}

func TestMaxMinFair(t *testing.T) {
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	for _, c := range []struct {
		capacity float64
		demands  []float64
		want     []float64
	}{
		// Everyone fits: everyone gets its demand.
		{100, []float64{10, 20, 30}, []float64{10, 20, 30}},
		// The burst: nine light tenants well under the equal split get
		// their demand, the heavy one the rest.
		{100, []float64{150, 3, 3, 3, 3, 3, 3, 3, 3, 3}, []float64{73, 3, 3, 3, 3, 3, 3, 3, 3, 3}},
		// Two over the split share what the small one leaves equally.
		{90, []float64{100, 10, 100}, []float64{40, 10, 40}},
		// No demand, no share.
		{100, []float64{0, 50}, []float64{0, 50}},
		{0, []float64{5, 5}, []float64{0, 0}},
	} {
		got := fair.MaxMin(c.capacity, c.demands)
		for i := range got {
			if !near(got[i], c.want[i]) {
				t.Errorf("maxMinFair(%v, %v) = %v, want %v", c.capacity, c.demands, got, c.want)
				break
			}
		}
	}
}

func TestFairJain(t *testing.T) {
	sent := []float64{150, 3, 3, 3, 3, 3, 3, 3, 3, 3}
	// Everyone got its fair share, the heavy tenant more: 1, capped.
	good := []float64{80, 3, 3, 3, 3, 3, 3, 3, 3, 3}
	if j := fairJain(100, sent, good); math.Abs(j-1) > 1e-9 {
		t.Errorf("fairJain(all served) = %v, want 1", j)
	}
	// The light tenants served in full and the heavy one not at all:
	// shares (0, 1, ..., 1), index 9² / (10 × 9) = 0.9.
	good[0] = 0
	if j := fairJain(100, sent, good); math.Abs(j-0.9) > 1e-9 {
		t.Errorf("fairJain(heavy starved) = %v, want 0.9", j)
	}
	// The heavy tenant at its fair share, the light ones at half of theirs:
	// shares (1, 0.5 × 9): (1 + 4.5)² / (10 × (1 + 9 × 0.25)) = 0.9308.
	good = []float64{73, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5}
	if j := fairJain(100, sent, good); math.Abs(j-30.25/32.5) > 1e-9 {
		t.Errorf("fairJain(light halved) = %v, want %v", j, 30.25/32.5)
	}
	if j := fairJain(100, nil, nil); j != -1 {
		t.Errorf("fairJain(nothing) = %v, want -1", j)
	}
}

func TestReachTime(t *testing.T) {
	secs := []Second{{Good: 10}, {Good: 60}, {Good: 40}, {Good: 55}, {Good: 52}, {Good: 51}, {Good: 60}}
	if got := reachTime(secs, 50, 3); got != 3 {
		t.Errorf("reachTime = %v, want 3", got)
	}
	if got := reachTime(secs, 70, 1); got != -1 {
		t.Errorf("reachTime(never) = %v, want -1", got)
	}
}
