package main

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMatrixCells: the matrices hold the cells the experiment promises,
// each short enough, and fit their time budgets with every variant this
// build runs and ghz.
func TestMatrixCells(t *testing.T) {
	for _, c := range []struct {
		name   string
		budget time.Duration
		want   []string // cells that must be there
		ghz    []string // cells ghz must drive
	}{
		{"full", 45 * time.Minute, []string{
			"2ms-warm-own-2x", "2ms-warm-own-4x", // the centre
			"0.2ms-warm-own-2x", "0.5ms-warm-own-4x", "10ms-warm-own-2x", "20ms-warm-own-4x", "block-warm-own-1.8x",
			"2ms-cold-own-4x", "2ms-warm-shared-4x", "2ms-warm-misread-4x",
			"2ms-warm-own-1.2x", "2ms-warm-own-10x", "2ms-warm-own-step", "2ms-warm-own-burst",
			"0.5ms-cold-misread-4x", "2ms-cold-misread-4x", // the corners
		}, []string{"2ms-warm-own-2x", "2ms-warm-own-4x", "0.5ms-warm-own-4x", "10ms-warm-own-2x"}},
		{"quick", 5 * time.Minute, []string{"2ms-warm-own-4x", "2ms-cold-misread-4x"}, []string{"2ms-warm-own-4x"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cells, err := matrixCells(c.name)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, cl := range cells {
				if slices.Contains(names, cl.Name) {
					t.Errorf("cell %s twice", cl.Name)
				}
				names = append(names, cl.Name)
				if d := cl.scenario().Duration(); d > 15*time.Second {
					t.Errorf("cell %s lasts %v, want ≤ 15 s", cl.Name, d)
				}
				if cl.Ghz && (cl.Cold || cl.Shape != shapeSteady) {
					t.Errorf("cell %s: ghz drives warm steady cells only", cl.Name)
				}
				if cl.scenario().segmentStart(0) != 0 || cl.scenario().Segments[0].Measure && cl.judged() == "" {
					t.Errorf("cell %s: malformed scenario", cl.Name)
				}
			}
			for _, w := range c.want {
				if !slices.Contains(names, w) {
					t.Errorf("no cell %s in %v", w, names)
				}
			}
			for _, w := range c.ghz {
				if i := slices.Index(names, w); i < 0 || !cells[i].Ghz {
					t.Errorf("ghz does not drive cell %s", w)
				}
			}
			n := len(slices.DeleteFunc(slices.Clone(matrixVariants), func(v string) bool { return !runnable(v) }))
			got := matrixBudget(cells, n, true)
			t.Logf("%s: %d cells, %d variants: at most %.1f min", c.name, len(cells), n, got.Minutes())
			if got >= c.budget {
				t.Errorf("matrixBudget(%s, %d variants) = %v, want < %v", c.name, n, got, c.budget)
			}
		})
	}
	// A quick cell is the full matrix's cell of the same name, so that the
	// two compare.
	full, _ := matrixCells("full")
	quick, _ := matrixCells("quick")
	for _, q := range quick {
		if i := slices.IndexFunc(full, func(c Cell) bool { return c.Name == q.Name }); i < 0 || full[i].Axis != q.Axis && q.Axis != "corner" {
			t.Errorf("quick cell %s is not in the full matrix", q.Name)
		}
	}
	if _, err := matrixCells("huge"); err == nil {
		t.Error(`matrixCells("huge"): no error`)
	}
	if got, err := chooseCells(full, "2ms-warm-own-step,block-warm-own-4x"); err != nil || len(got) != 2 || !got[1].Blocking {
		t.Errorf("chooseCells = %v, %v", got, err)
	}
	if _, err := chooseCells(full, "2ms-warm-own-3x"); err == nil {
		t.Error("chooseCells(unknown cell): no error")
	}
}

// TestParseGhz reads a ghz JSON report (a real one, its calls replaced by
// ten of known starts, latencies and codes) and judges its window as a
// cell's.
func TestParseGhz(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "ghz-report.json"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := parseGhz(b)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(raw.Calls), 10; got != want {
		t.Fatalf("%d calls, want %d", got, want)
	}
	byStart := slices.Clone(raw.Calls)
	slices.SortFunc(byStart, func(a, b callRec) int { return int(a.At - b.At) })
	near := func(a, b time.Duration) bool { return (a - b).Abs() < time.Microsecond }
	for i, want := range []struct {
		at  time.Duration
		lat time.Duration
		out outcome
	}{
		{0, 1200 * time.Microsecond, outOK},
		{500 * time.Millisecond, 150 * time.Millisecond, outOK},
		{time.Second, 2 * time.Millisecond, outOK},
		{1250 * time.Millisecond, 300 * time.Microsecond, outRejected}, // ResourceExhausted
		{1500 * time.Millisecond, 3 * time.Millisecond, outOK},
		{2 * time.Second, 400 * time.Microsecond, outRejected}, // Unavailable
		{2500 * time.Millisecond, 500 * time.Millisecond, outDeadline},
		{3 * time.Second, 80 * time.Millisecond, outOK},
		{3500 * time.Millisecond, 120 * time.Millisecond, outOK},
		{3900 * time.Millisecond, 5 * time.Millisecond, outOther}, // Internal
	} {
		if c := byStart[i]; !near(c.At, want.at) || !near(c.Lat, want.lat) || c.Out != want.out {
			t.Errorf("call %d = {At %v, Lat %v, Out %d}, want {%v, %v, %d}", i, c.At, c.Lat, c.Out, want.at, want.lat, want.out)
		}
	}
	// From 1 s to 4 s: 8 calls, 4 OK of which 3 within the SLO, 2
	// rejected, 1 past its deadline; the OK calls' p99 is the slowest.
	w := raw.window("steady", time.Second, 4*time.Second, 2, 100*time.Millisecond)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"sent", w.Sent, 8.0 / 3}, {"goodput", w.Goodput, 1}, {"ok", w.OKRate, 4.0 / 3},
		{"rejected", w.Rejected, 2.0 / 3}, {"deadline", w.Deadline, 1.0 / 3}, {"p99", w.P99, 120},
	} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("window %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	cr := ghzCellRun(raw, Cell{Name: "x", Shape: shapeSteady, Load: 2}, "E", serverReady{}, 100, 200, 100*time.Millisecond, 500*time.Millisecond)
	if cr.Driver != driverGhz || cr.Judged.LightSuccess != -1 || cr.Offered != 200 {
		t.Errorf("ghzCellRun = %+v: want driver ghz, no tenant figures, offered 200", cr)
	}

	for _, bad := range []string{`{`, `{"count": 0, "details": []}`, `{"count": 5, "details": [{"timestamp": "2026-12-03T10:30:02Z", "latency": 1, "status": "OK"}]}`} {
		if _, err := parseGhz([]byte(bad)); err == nil {
			t.Errorf("parseGhz(%s): no error", bad)
		}
	}
	args := strings.Join(ghzArgs("inv.proto", "127.0.0.1:1", 899.6, 12*time.Second, 500*time.Millisecond, "out.json"), " ")
	for _, want := range []string{"--async", "-r 900 ", "-z 12s", "-t 500ms", "--proto inv.proto", "--call inventory.v1.Inventory.Allocate", "-O json -o out.json", "127.0.0.1:1"} {
		if !strings.Contains(args, want) {
			t.Errorf("ghz arguments %q lack %q", args, want)
		}
	}
	if path, why := findGhz("off", "inv.proto"); path != "" || why == "" {
		t.Errorf(`findGhz("off") = %q, %q: want none, and why`, path, why)
	}
	if path, why := findGhz(filepath.Join(t.TempDir(), "ghz"), "inv.proto"); path != "" || !strings.Contains(why, "no ghz") {
		t.Errorf("findGhz(missing) = %q, %q: want none, and why", path, why)
	}
}

func TestJudge(t *testing.T) {
	slo := 100 * time.Millisecond
	capy := CellCapacity{Capacity: 400, UnloadedP99: 3}        // p99 limit: the SLO
	slow := CellCapacity{Capacity: 40, UnloadedP99: 30}        // p99 limit: 150 ms
	steady := Cell{Shape: shapeSteady, Load: 2}                //
	cold := Cell{Shape: shapeSteady, Load: 4, Cold: true}      //
	step := Cell{Shape: shapeStep, Load: 3}                    //
	burst := Cell{Shape: shapeBurst, Load: burstBase}          //
	good := Window{Goodput: 390, P99: 80, LightSuccess: 0.995} // 97.5%
	for _, c := range []struct {
		name string
		r    CellRun
		c    Cell
		capy CellCapacity
		want verdict
	}{
		{"met", CellRun{Judged: good}, steady, capy, verdict{}},
		{"goodput low", CellRun{Judged: Window{Goodput: 379, P99: 80}}, steady, capy, verdict{Goodput: true}},
		{"goodput at the target", CellRun{Judged: Window{Goodput: 380, P99: 80}}, steady, capy, verdict{}},
		{"p99 over the SLO", CellRun{Judged: Window{Goodput: 390, P99: 101}}, steady, capy, verdict{P99: true}},
		{"nothing admitted", CellRun{Judged: Window{Goodput: 0, P99: -1}}, steady, capy, verdict{Goodput: true, P99: true}},
		{"p99 within 5× a slow unloaded p99", CellRun{Judged: Window{Goodput: 39, P99: 149}}, steady, slow, verdict{}},
		{"p99 over 5× a slow unloaded p99", CellRun{Judged: Window{Goodput: 39, P99: 151}}, steady, slow, verdict{P99: true}},
		{"cold, slow first 2 s", CellRun{Judged: good, First: &Window{Goodput: 359}}, cold, capy, verdict{First: true}},
		{"cold, quick first 2 s", CellRun{Judged: good, First: &Window{Goodput: 361}}, cold, capy, verdict{}},
		{"step met", CellRun{Judged: good, ShedStartS: 0.25, RecoverS: 2}, step, capy, verdict{}},
		{"step late", CellRun{Judged: good, ShedStartS: 0.75, RecoverS: 2.25}, step, capy, verdict{Shed: true, Recover: true}},
		{"step never", CellRun{Judged: good, ShedStartS: -1, RecoverS: -1}, step, capy, verdict{Shed: true, Recover: true}},
		// A steady cell has no step: its zero times are no misses.
		{"steady, no step", CellRun{Judged: good, ShedStartS: -1}, steady, capy, verdict{}},
		{"burst, light tenants served", CellRun{Driver: driverOwn, Judged: good}, burst, capy, verdict{}},
		{"burst, light tenants shed", CellRun{Driver: driverOwn, Judged: Window{Goodput: 390, P99: 80, LightSuccess: 0.98}}, burst, capy, verdict{Light: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := judge(c.r, c.c, c.capy, slo); got != c.want {
				t.Errorf("judge = %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestCellRunStep analyses a step cell's synthetic run: shedding starts in
// the second quarter second after the step up, and calls succeed again
// from the fourth after the step down.
func TestCellRunStep(t *testing.T) {
	const capacity = 400.0
	slo := 100 * time.Millisecond
	c := Cell{Name: "2ms-warm-own-step", Cost: 2 * time.Millisecond, Placement: placeOwn, Shape: shapeStep, Load: 3}
	sc := c.scenario()
	up, down := sc.segmentStart(1), sc.segmentStart(2)
	raw := synthRaw(sc, capacity, func(at time.Duration, tenant int) (outcome, time.Duration) {
		switch {
		case at >= up+300*time.Millisecond && at < down && at%10 < 7:
			return outRejected, time.Millisecond
		case at >= down && at < down+600*time.Millisecond:
			return outDeadline, 500 * time.Millisecond
		}
		return outOK, 10 * time.Millisecond
	})
	cr := cellRun(raw, c, "E", serverReady{}, capacity, slo)
	if cr.ShedStartS != 0.25 || cr.RecoverS != 0.75 {
		t.Errorf("shed start %v, recovery %v; want 0.25 and 0.75", cr.ShedStartS, cr.RecoverS)
	}
	if got, want := cr.Offered, 3*capacity; math.Abs(got-want) > 1e-6 {
		t.Errorf("offered %v, want %v", got, want)
	}
	if cr.Judged.Name != "high" || cr.First != nil {
		t.Errorf("judged window %q, first window %v: want high and none", cr.Judged.Name, cr.First)
	}
}

// TestMatrixReport renders the matrix from synthetic runs, alone and
// beside the scenarios, and again from its JSON.
func TestMatrixReport(t *testing.T) {
	slo := 100 * time.Millisecond
	cells, _ := matrixCells("full")
	cells, _ = chooseCells(cells, "2ms-warm-own-4x,2ms-cold-misread-4x,2ms-warm-own-step,2ms-warm-own-burst")
	m := &MatrixResults{Name: "full", Command: "cd bench && go run ./cmd/overload -matrix full", SLO: slo, Deadline: 500 * time.Millisecond,
		Variants: []string{"A", "E"}, Cells: cells, Ghz: "ghz v0.120.0 (/root/go/bin/ghz)",
		Isolation: &Isolation{Taskset: "/usr/bin/taskset", CgroupCPU: "/sys/fs/cgroup/cpu/x"}}
	for _, k := range []string{"2ms/own", "2ms/misread"} {
		m.Capacities = append(m.Capacities, CellCapacity{Key: k, Capacity: 400, Ceiling: 430, UnloadedP50: 2.2, UnloadedP99: 3, InFlight: capInFlight,
			Server: serverReady{GOMAXPROCS: 1, Affinity: 1, Budget: 1, Source: "cgroup"}})
	}
	for _, c := range cells {
		for _, v := range []string{"A", "E"} {
			raw := synthRaw(c.scenario(), 400, func(time.Duration, int) (outcome, time.Duration) {
				if v == "A" {
					return outDeadline, 500 * time.Millisecond
				}
				return outOK, 10 * time.Millisecond
			})
			m.Runs = append(m.Runs, cellRun(raw, c, v, serverReady{}, 400, slo))
			if c.Ghz {
				r := m.Runs[len(m.Runs)-1]
				r.Driver = driverGhz
				m.Runs = append(m.Runs, r)
			}
		}
	}
	report, _ := renderReport(t, &Results{Matrix: m})
	for _, want := range []string{
		"## Scenario matrix", "### Capacity of each handler and placement", "| 2ms/misread | 1, 1, 1.00 (cgroup) |",
		"| 2 ms · warm · own · 4× | goodput ≥ 95% of 400/s, p99 ≤ 100 ms |",
		"2 ms · cold · misread · 4×", "step 0.5× → 3× → 0.5×", "burst (0.6×, heavy tenant 5×)",
		"0% ✗ · – ms ✗", "first 2 s 0% ✗", "shed never ✗ · recovery never ✗", "light 0.0% ✗",
		"| A | 0/4 |", "| E | 3/4 |",
		"### ghz beside our load generator", "ghz v0.120.0",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(report, "NaN") || strings.Contains(report, "## Sweep") {
		t.Error("the report shows NaN, or the scenarios' sections without their runs")
	}

	// Beside the scenarios, after them; and the same from the JSON.
	res := &Results{Config: Config{Quick: true, Cost: 2 * time.Millisecond, Deadline: 500 * time.Millisecond, SLO: slo}, Capacity: 400, Fits: map[string]Fit{}, Matrix: m}
	sc := scenarios(true)[0]
	res.Scenarios = []Scenario{sc}
	res.Runs = []Run{analyse(synthRaw(sc, 400, func(time.Duration, int) (outcome, time.Duration) { return outOK, 10 * time.Millisecond }), sc, "E", serverReady{}, 400, slo)}
	report, dir := renderReport(t, res)
	if i, j := strings.Index(report, "## Sweep"), strings.Index(report, "## Scenario matrix"); i < 0 || j < i {
		t.Errorf("the matrix section at %d, the sweep at %d: want both, the matrix after", j, i)
	}
	path := filepath.Join(dir, "results.json")
	if err := writeResults(res, path); err != nil {
		t.Fatal(err)
	}
	back, err := readResults(path)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := renderReport(t, back); again != report {
		t.Error("the report rendered from the JSON differs")
	}
}
