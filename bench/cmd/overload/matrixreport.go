package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Targets of the scenario matrix, for every variant.
const (
	matrixGoodput = 0.95 // goodput within the SLO, of the cell's capacity
	matrixFirst   = 0.90 // the same over a cold cell's first coldWindow
	// matrixP99X: the admitted p99 may reach this many times the unloaded
	// p99 where that is above the SLO.
	matrixP99X    = 5
	matrixShed    = 0.5 // s, from a step up until shedding starts
	matrixRecover = 2.0 // s, from a step down until calls succeed again
	matrixLight   = targetLight
	// generatorShort: a run whose load generator sent less than this share
	// of the offered load was short of CPU; its figures are for the load
	// it sent.
	generatorShort = 0.95
)

// verdict tells which targets a cell's run missed.
type verdict struct {
	Goodput, First, P99, Shed, Recover, Light bool
}

func (v verdict) met() bool { return v == verdict{} }

// judge returns the targets r, a run of cell c of capacity capy, missed.
// The targets that do not apply to c (First but in a cold cell, Shed and
// Recover but in a step, Light but in a burst by our load generator) are
// never missed.
func judge(r CellRun, c Cell, capy CellCapacity, slo time.Duration) verdict {
	var v verdict
	v.Goodput = r.Judged.Goodput < matrixGoodput*capy.Capacity
	v.P99 = r.Judged.P99 < 0 || r.Judged.P99 > capy.p99Limit(slo)
	if c.Cold && r.First != nil {
		v.First = r.First.Goodput < matrixFirst*capy.Capacity
	}
	if c.Shape == shapeStep {
		v.Shed = r.ShedStartS < 0 || r.ShedStartS > matrixShed
		v.Recover = r.RecoverS < 0 || r.RecoverS > matrixRecover
	}
	if c.Shape == shapeBurst && r.Driver == driverOwn {
		v.Light = r.Judged.LightSuccess < matrixLight
	}
	return v
}

// short reports whether r's load generator sent too little of the load.
func (r CellRun) short() bool { return r.Judged.Sent < generatorShort*r.Offered }

func (m *MatrixResults) cell(name string) (Cell, bool) {
	i := slices.IndexFunc(m.Cells, func(c Cell) bool { return c.Name == name })
	if i < 0 {
		return Cell{}, false
	}
	return m.Cells[i], true
}

func (m *MatrixResults) capacity(key string) (CellCapacity, bool) {
	i := slices.IndexFunc(m.Capacities, func(c CellCapacity) bool { return c.Key == key })
	if i < 0 {
		return CellCapacity{}, false
	}
	return m.Capacities[i], true
}

func (m *MatrixResults) run(cell, variant, driver string) (CellRun, bool) {
	i := slices.IndexFunc(m.Runs, func(r CellRun) bool { return r.Cell == cell && r.Variant == variant && r.Driver == driver })
	if i < 0 {
		return CellRun{}, false
	}
	return m.Runs[i], true
}

// variants returns the variants of the runs, in report order.
func (m *MatrixResults) variants() []string {
	var vs []string
	for _, v := range allVariants {
		if slices.ContainsFunc(m.Runs, func(r CellRun) bool { return r.Variant == v }) {
			vs = append(vs, v)
		}
	}
	return vs
}

// miss marks a figure that misses its target.
func miss(missed bool) string {
	if missed {
		return " ✗"
	}
	return ""
}

// entry is a run's entry of the matrix table: goodput as a share of the
// capacity, the admitted p99, then what the cell adds, each marked where
// it misses its target.
func entry(r CellRun, c Cell, capy CellCapacity, slo time.Duration) string {
	v := judge(r, c, capy, slo)
	s := fmt.Sprintf("%.0f%%%s · %s ms%s", 100*r.Judged.Goodput/capy.Capacity, miss(v.Goodput), num(r.Judged.P99, 0), miss(v.P99))
	if r.First != nil {
		s += fmt.Sprintf(" · first %s %.0f%%%s", seconds(coldWindow), 100*r.First.Goodput/capy.Capacity, miss(v.First))
	}
	if c.Shape == shapeStep {
		s += " · shed " + secs(r.ShedStartS) + miss(v.Shed) + " · recovery " + secs(r.RecoverS) + miss(v.Recover)
	}
	if c.Shape == shapeBurst && r.Driver == driverOwn {
		s += " · light " + pct(r.Judged.LightSuccess) + miss(v.Light)
	}
	if r.short() {
		s += " †"
	}
	return s
}

// seconds writes d in seconds: "2 s", "0.5 s".
func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s" }

// cellLabel describes a cell for the table.
func cellLabel(c Cell) string {
	h := "blocking"
	if !c.Blocking {
		h = strings.TrimSuffix(c.handler(), "ms") + " ms"
	}
	start := "warm"
	if c.Cold {
		start = "cold"
	}
	load := loadName(c.Load)
	switch c.Shape {
	case shapeStep:
		load = fmt.Sprintf("step %s → %s → %s", loadName(stepLow), loadName(c.Load), loadName(stepLow))
	case shapeBurst:
		load = fmt.Sprintf("burst (%s, heavy tenant %d×)", loadName(c.Load), burstX)
	}
	return strings.Join([]string{h, start, c.Placement, load}, " · ")
}

// markdown writes the matrix's section of the report.
func (m *MatrixResults) markdown(b *strings.Builder) {
	f := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	vs := m.variants()
	f("## Scenario matrix\n\n")
	f("Where each variant stops working: one axis at a time away from a centre cell (a 2 ms handler, a warm server on its own CPU, 2× and 4× its capacity), and the corners known to be hard. ")
	f("Each cell runs against every variant, one fresh server each, with the experiment's ten tenants, a %v deadline and a %v SLO. ", m.Deadline, m.SLO)
	f("A warm server is idle for %s before the load; a cold one gets it as soon as it listens (the load generator dials it and sends at once). ", seconds(warmIdle))
	f("A steady cell lasts %s and is judged on its last %s; a cold one also on its first %s. ", seconds(cellDur), seconds(cellDur-cellSkip), seconds(coldWindow))
	f("The step offers %s for 3 s, then 3× for 5 s, then %s for 5 s, judged on the high segment after its first second; the burst offers %s, the heavy tenant %d× its rate for 7 s, judged after the burst's first second. ", loadName(stepLow), loadName(stepLow), loadName(burstBase), burstX)
	f("The blocking handler holds one of %d pooled connections for %v while asleep, using no CPU.\n\n", blockPool, blockHold)
	f("Placements:\n\n")
	for _, p := range []string{placeOwn, placeShared, placeMisread} {
		f("- %s\n", placementNames[p])
	}
	f("\n```sh\n%s\n```\n\n", m.Command)
	f("| | |\n|---|---|\n")
	f("| matrix | %s: %d cells, variants %s |\n", m.Name, len(m.Cells), strings.Join(m.Variants, ", "))
	f("| date | %s |\n", m.Date)
	f("| duration | %.1f min |\n", m.Elapsed/60)
	f("| machine | %d CPUs, %s, %s |\n", m.Machine.CPUs, m.Machine.Model, m.Machine.Go)
	f("| load average | %s at the start, %s at the end |\n", m.Machine.LoadAvg, m.Machine.LoadEnd)
	if iso := m.Isolation; iso != nil {
		applied := "pinning " + map[bool]string{true: "applied", false: "not applied"}[iso.Taskset != ""] + ", cgroup " + map[bool]string{true: "applied", false: "not applied"}[iso.CgroupCPU != ""]
		if len(iso.Notes) > 0 {
			applied += " (" + strings.Join(iso.Notes, "; ") + ")"
		}
		f("| isolation | %s |\n", applied)
	}
	if m.Ghz != "" {
		f("| ghz | %s |\n", m.Ghz)
	} else if m.GhzNote != "" {
		f("| ghz | no ghz runs: %s |\n", m.GhzNote)
	}
	f("\n")

	f("### Capacity of each handler and placement\n\n")
	f("Measured once per run against a server without admission control: the p99 of calls sent one at a time (unloaded), the rate with %d calls in flight (%d for the blocking handler: the ceiling), then open-loop Poisson steps from %.0f%% of the ceiling down until one keeps the accepted p99 within the SLO and 97%% of calls within it; the capacity is that step's goodput. ", capInFlight, 2*blockPool, 100*capFractions[0])
	f("The p99 limit is the larger of the SLO and %d× the unloaded p99.\n\n", matrixP99X)
	f("| handler / placement | server: GOMAXPROCS, CPUs allowed, CPU budget read | unloaded p50 / p99, ms | p99 limit, ms | ceiling, calls/s | capacity, calls/s |\n|---|---|---:|---:|---:|---:|\n")
	for _, c := range m.Capacities {
		note := ""
		if c.Note != "" {
			note = " (" + c.Note + ")"
		}
		f("| %s | %d, %d, %.2f (%s) | %.2f / %.2f | %.0f | %.0f | %.0f%s |\n", c.Key, c.Server.GOMAXPROCS, c.Server.Affinity, c.Server.Budget, c.Server.Source, c.UnloadedP50, c.UnloadedP99, c.p99Limit(m.SLO), c.Ceiling, c.Capacity, note)
	}
	f("\n")

	f("### Cells\n\n")
	m.table(b)
	f("\nEach entry: goodput within the SLO as a share of the cell's capacity · the admitted (OK) calls' p99; then, in a cold cell, goodput over its first %s; in the step, the time from the step up to the first quarter second with at least %.0f%% of calls rejected (shed) and from the step down to the first 2 s in which every quarter second had 99%% of its calls succeed within the SLO (recovery); in the burst, the light tenants' success. ", seconds(coldWindow), 100*shedStartShare)
	f("✗ marks a target missed: goodput ≥ %.0f%% of the capacity (≥ %.0f%% over a cold cell's first %s), admitted p99 ≤ the p99 limit, shedding within %.1f s, recovery within %.0f s, light tenants ≥ %.0f%% success. ", 100*matrixGoodput, 100*matrixFirst, seconds(coldWindow), matrixShed, matrixRecover, 100*matrixLight)
	f("† marks a run whose load generator sent less than %.0f%% of the offered load: it was short of CPU, and its figures are for what it sent.\n\n", 100*generatorShort)
	f("| variant | cells meeting every target | goodput missed | p99 missed | first %s missed | shed missed | recovery missed | light tenants missed |\n|---|---:|---:|---:|---:|---:|---:|---:|\n", seconds(coldWindow))
	for _, v := range vs {
		var n, met, g, fi, p, sh, rc, li int
		for _, c := range m.Cells {
			r, ok := m.run(c.Name, v, driverOwn)
			capy, ok2 := m.capacity(c.key())
			if !ok || !ok2 {
				continue
			}
			j := judge(r, c, capy, m.SLO)
			n++
			for _, x := range []struct {
				missed bool
				count  *int
			}{{j.met(), &met}, {j.Goodput, &g}, {j.First, &fi}, {j.P99, &p}, {j.Shed, &sh}, {j.Recover, &rc}, {j.Light, &li}} {
				if x.missed {
					*x.count++
				}
			}
		}
		f("| %s | %d/%d | %d | %d | %d | %d | %d | %d |\n", v, met, n, g, p, fi, sh, rc, li)
	}
	f("\n")

	if !slices.ContainsFunc(m.Cells, func(c Cell) bool { return c.Ghz }) {
		return
	}
	f("### ghz beside our load generator\n\n")
	if m.Ghz == "" {
		f("No ghz runs: %s.\n\n", m.GhzNote)
		return
	}
	f("The same cells driven by %s: `--async` at the offered rate (constant, not Poisson) for %s, %d connections, the tenants' keys drawn per call in our proportions, the same deadline; judged on calls that began from %s on, as ours, until a deadline and %s before ghz stopped (it fails the calls still in flight when it stops). Entries as above: goodput as a share of the capacity · admitted p99; sent is calls/s sent in the window.\n\n", m.Ghz, seconds(cellDur), numTenants, seconds(cellSkip), seconds(ghzCut))
	f("| cell | variant | offered/s | ours: sent/s, goodput · p99 | ghz: sent/s, goodput · p99 |\n|---|---|---:|---|---|\n")
	for _, c := range m.Cells {
		if !c.Ghz {
			continue
		}
		capy, ok := m.capacity(c.key())
		if !ok {
			continue
		}
		for _, v := range vs {
			own, ok1 := m.run(c.Name, v, driverOwn)
			gz, ok2 := m.run(c.Name, v, driverGhz)
			if !ok1 && !ok2 {
				continue
			}
			side := func(r CellRun, ok bool) string {
				if !ok {
					return "–"
				}
				return fmt.Sprintf("%.0f, %s", r.Judged.Sent, entry(r, c, capy, m.SLO))
			}
			f("| %s | %s | %.0f | %s | %s |\n", cellLabel(c), v, c.Load*capy.Capacity, side(own, ok1), side(gz, ok2))
		}
	}
	f("\n")
}

// table writes the matrix table: a row per cell, a column per variant.
func (m *MatrixResults) table(b *strings.Builder) {
	f := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	vs := m.variants()
	f("| cell | axis | capacity, calls/s |")
	for _, v := range vs {
		f(" %s |", v)
	}
	f("\n|---|---|---:|")
	for range vs {
		f("---|")
	}
	f("\n")
	for _, c := range m.Cells {
		capy, ok := m.capacity(c.key())
		if !ok {
			continue
		}
		f("| %s | %s | %.0f |", cellLabel(c), c.Axis, capy.Capacity)
		for _, v := range vs {
			if r, ok := m.run(c.Name, v, driverOwn); ok {
				f(" %s |", entry(r, c, capy, m.SLO))
			} else {
				f(" – |")
			}
		}
		f("\n")
	}
}
