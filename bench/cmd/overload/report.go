package main

import (
	"bytes"
	_ "embed"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/template"
	"time"
)

// The report, BENCHMARKS.md, is report.md.tmpl executed over a page: the
// prose is the template's, written by hand, and every table is a method of
// page below, computed from the results' summary.

//go:embed report.md.tmpl
var reportTemplate string

// Targets of variant E, the new default; the headline judges every
// variant by them.
const (
	targetGoodput   = 0.95 // of the measured capacity, at every overloaded sweep point
	targetReversals = 2.0  // per minute, at steady load
	targetShed      = 1.0  // seconds
	targetRecover   = 5.0  // seconds
	targetLight     = 0.99 // light tenants' success in the burst
	targetHeavy     = 0.95 // of the heavy tenant's max-min fair share in the burst
	targetRejCost   = 0.01 // a rejection's CPU over a served request's
	// The retry storm, with throttled clients: the attempts on the wire,
	// × the measured capacity, and the calls served OK, as a share of the
	// variant's at the same load without retries.
	targetStormWire = 1.5
	targetStormOK   = 0.90
)

// targetVariant is the variant the targets are for.
const targetVariant = "E"

// overloadLoads are the sweep's points at which goodput must hold.
var overloadLoads = []float64{1.5, 2, 3, 4}

// p4Commit is the commit of platinummonkey/go-concurrency-limits that P4
// was built from, out of tree (see unavailableVariants).
const p4Commit = "6a45bdf1f283e871a8ba9d0876ff5493eceaec26"

// peers are the other libraries' variants.
var peers = []string{"P1", "P2", "P3", "P4"}

// renderAll writes the report, rendered from res's summary, to mdPath, and
// draws into chartDir the charts that res's seconds give: raw results
// redraw them all, a summary none.
func renderAll(res *Results, mdPath, chartDir string) error {
	if err := writeCharts(res, chartDir); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(mdPath), chartDir)
	if err != nil {
		rel = chartDir
	}
	b, err := res.report(filepath.ToSlash(rel))
	if err != nil {
		return err
	}
	if dir := filepath.Dir(mdPath); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile(mdPath, b, 0o644)
}

// report renders the report from res's summary; chartDir is the charts'
// directory relative to the report.
func (res *Results) report(chartDir string) ([]byte, error) {
	sum, err := res.summary()
	if err != nil {
		return nil, err
	}
	t, err := template.New("report").Option("missingkey=error").Parse(reportTemplate)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, page{sum, chartDir}); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// page is what the template renders: the summary, and where the charts
// are.
type page struct {
	*Results
	chartDir string
}

// Chart returns the path of the chart called name, relative to the report.
func (p page) Chart(name string) string { return p.Path(chartFile(name)) }

// Path returns the path of a file beside the charts, relative to the
// report.
func (p page) Path(file string) string { return p.chartDir + "/" + file }

// Minutes is how long the scenarios took.
func (res *Results) Minutes() string { return fmt.Sprintf("%.0f min", res.Elapsed/60) }

// mdTable returns a markdown table of rows under head; align has a letter
// per column, l or r.
func mdTable(align string, head []string, rows [][]string) string {
	var b strings.Builder
	line := func(cells []string) { b.WriteString("| " + strings.Join(cells, " | ") + " |\n") }
	if len(head) == 0 || strings.Join(head, "") == "" {
		b.WriteString("|" + strings.Repeat(" |", len(align)) + "\n")
	} else {
		line(head)
	}
	for _, a := range align {
		b.WriteString(map[rune]string{'l': "|---", 'r': "|---:"}[a])
	}
	b.WriteString("|\n")
	for _, r := range rows {
		line(r)
	}
	return b.String()
}

func num(v float64, prec int) string {
	if v < 0 || math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

func pct(v float64) string {
	if v < 0 || math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

func secs(v float64) string {
	if v < 0 {
		return "never"
	}
	return fmt.Sprintf("%.2f s", v)
}

func nonzero(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// Unavailable returns the peers this build cannot run and the results do
// not hold, each with why, as sentences.
func (res *Results) Unavailable() string {
	var s []string
	for _, v := range slices.Sorted(maps.Keys(unavailableVariants)) {
		if u := unavailableVariants[v]; !res.Has(v) {
			s = append(s, fmt.Sprintf("%s, %s, is not in this experiment: %s.", v, u.What, u.Why))
		}
	}
	return strings.Join(s, " ")
}

// P4Commit is the commit P4 is built from.
func (page) P4Commit() string { return p4Commit }

// P4Why says why P4 is built out of tree.
func (page) P4Why() string { return unavailableVariants["P4"].Why }

// Headline is the report's first table: a row per target of the scenarios
// and per cell of the matrix, an entry per variant among E, the peers and
// A, each figure marked ✗ where it misses the row's target.
func (p page) Headline() string {
	var vs []string
	for _, v := range append([]string{targetVariant}, append(peers, "A")...) {
		if p.Has(v) || p.Matrix != nil && slices.Contains(p.Matrix.variants(), v) {
			vs = append(vs, v)
		}
	}
	head := append([]string{"scenario", "target"}, vs...)
	var rows [][]string
	// row adds a row unless E has no entry in it.
	row := func(name, target string, entry func(v string) string) {
		cells := []string{name, target}
		for _, v := range vs {
			cells = append(cells, entry(v))
		}
		if cells[2] != "" {
			for i, c := range cells {
				if c == "" {
					cells[i] = "–"
				}
			}
			rows = append(rows, cells)
		}
	}
	slo := float64(p.Config.SLO) / float64(time.Millisecond)
	sloMs := fmt.Sprintf("%.0f ms", slo)
	p99 := func(v float64) string {
		return num(v, 0) + " ms" + miss(v < 0 || v > slo)
	}
	for _, l := range overloadLoads {
		row("sweep, "+loadName(l), fmt.Sprintf("goodput ≥ %.0f%%, p99 ≤ %s", 100*targetGoodput, sloMs), func(v string) string {
			w := p.run("sweep", v).window(loadName(l))
			if w == nil {
				return ""
			}
			g := w.Goodput / p.Capacity
			return pct(g) + miss(g < targetGoodput) + " · " + p99(w.P99)
		})
	}
	row("step "+loadName(0.7)+" → 3× → "+loadName(0.7), fmt.Sprintf("shed ≤ %.0f s, recovery ≤ %.0f s", targetShed, targetRecover), func(v string) string {
		r := p.run("step", v)
		if r == nil {
			return ""
		}
		return "shed " + secs(r.ShedS) + miss(r.ShedS < 0 || r.ShedS > targetShed) + " · recovery " + secs(r.RecoverS) + miss(r.RecoverS < 0 || r.RecoverS > targetRecover)
	})
	if sc := p.scenario("capchange"); sc != nil {
		row("capacity change at 1.2× (the cost doubles)", fmt.Sprintf("≥ %.0f%% of the new capacity from %v after", 100*capTarget, sc.Settle), func(v string) string {
			w := p.run("capchange", v).window(settledWindow)
			if w == nil {
				return ""
			}
			g := w.Goodput / p.NewCapacity()
			return pct(g) + miss(g < capTarget)
		})
	}
	row("tenant burst: light tenants", fmt.Sprintf("≥ %.0f%% success, p99 ≤ %s", 100*targetLight, sloMs), func(v string) string {
		w := p.run("burst", v).window("burst")
		if w == nil {
			return ""
		}
		return pct(w.LightSuccess) + miss(w.LightSuccess < targetLight) + " · " + p99(w.LightP99)
	})
	row("tenant burst: the heavy tenant", fmt.Sprintf("≥ %.0f%% of its max-min fair share", 100*targetHeavy), func(v string) string {
		w := p.run("burst", v).window("burst")
		if w == nil {
			return ""
		}
		good, fair := heavyFair(w, p.Capacity)
		if fair <= 0 {
			return ""
		}
		return pct(good/fair) + miss(good/fair < targetHeavy)
	})
	row("idle server beside a CPU-burning neighbour", "no call rejected", func(v string) string {
		r := p.run(neighbourIdle, v)
		if r == nil {
			return ""
		}
		return fmt.Sprintf("%d of %d%s", r.window("all").Rejections, r.Calls, miss(r.window("all").Rejections > 0))
	})
	row("overload at 2× beside the neighbour", "none: goodput · p99", func(v string) string {
		w := p.run(neighbourOverload, v).window("overload")
		if w == nil {
			return ""
		}
		return pct(w.Goodput/p.Capacity) + " · " + num(w.P99, 0) + " ms"
	})
	row(fmt.Sprintf("retry storm at %s, throttled clients", loadName(stormLoad)), fmt.Sprintf("≤ %.1f× the capacity on the wire; served OK ≥ %.0f%% of its own at %s without retries", targetStormWire, 100*targetStormOK, loadName(stormLoad)), func(v string) string {
		w := p.run(retryStorm, v).window(clientThrottled)
		if w == nil {
			return ""
		}
		ref, _ := p.stormReference(v)
		low := ref == nil || w.OKRate < targetStormOK*ref.OKRate
		return fmt.Sprintf("on the wire %.2f×%s · served OK %.2f×%s", w.Wire/p.Capacity, miss(w.Wire/p.Capacity > targetStormWire), w.OKRate/p.Capacity, miss(low))
	})
	row("cost of a rejection", fmt.Sprintf("≤ %.0f%% of a served call's CPU", 100*targetRejCost), func(v string) string {
		rc, err := p.rejCostFor(v)
		switch {
		case err != nil:
			return ""
		case rc.Saturated:
			return "undetermined: the server saturated"
		case !rc.Valid():
			return "undetermined"
		}
		return pct(rc.Ratio) + miss(rc.Ratio > targetRejCost)
	})
	row("reversals at steady load", fmt.Sprintf("≤ %.0f a minute", targetReversals), func(v string) string {
		n, s := p.reversals(v)
		if s <= 0 || v != targetVariant {
			return ""
		}
		rate := float64(n) / (s / 60)
		return fmt.Sprintf("%.1f%s (%d in %.0f s)", rate, miss(rate > targetReversals), n, s)
	})
	row("health probes, every scenario", "all answered", func(v string) string {
		ok, n := p.health(v)
		if n == 0 {
			return ""
		}
		return fmt.Sprintf("%d/%d%s", ok, n, miss(ok < n))
	})
	if ahead, n := p.ahead(); n > 0 {
		row("goodput, E against each peer", "E ahead in every scenario", func(v string) string {
			if v != targetVariant {
				return ""
			}
			return fmt.Sprintf("ahead in %d of %d%s", ahead, n, miss(ahead < n))
		})
	}
	if m := p.Matrix; m != nil {
		rows = append(rows, append([]string{"**scenario matrix**", "each cell's capacity"}, make([]string, len(vs))...))
		for _, c := range m.Cells {
			capy, ok := m.capacity(c.key())
			if !ok {
				continue
			}
			goal := fmt.Sprintf("goodput ≥ %.0f%% of %.0f/s, p99 ≤ %.0f ms", 100*matrixGoodput, capy.Capacity, capy.p99Limit(m.SLO))
			switch {
			case c.Cold:
				goal += fmt.Sprintf(", first %s ≥ %.0f%%", seconds(coldWindow), 100*matrixFirst)
			case c.Shape == shapeStep:
				goal += fmt.Sprintf(", shed ≤ %.1f s, recovery ≤ %.0f s", matrixShed, matrixRecover)
			case c.Shape == shapeBurst:
				goal += fmt.Sprintf(", light tenants ≥ %.0f%%", 100*matrixLight)
			}
			cells := []string{cellLabel(c), goal}
			for _, v := range vs {
				e := "–"
				if r, ok := m.run(c.Name, v, driverOwn); ok {
					e = entry(r, c, capy, m.SLO)
				}
				cells = append(cells, e)
			}
			rows = append(rows, cells)
		}
	}
	return mdTable("ll"+strings.Repeat("l", len(vs)), head, rows)
}

// RunTable says where and how the scenarios ran.
func (p page) RunTable() string {
	m, iso := p.Machine, p.Isolation
	rows := [][]string{
		{"date", p.Date},
		{"duration", fmt.Sprintf("%.1f min", p.Elapsed/60)},
		{"machine", fmt.Sprintf("%d CPUs, %s, %s, %s, kernel %s", m.CPUs, m.Model, m.Go, m.OS, m.Kernel)},
		{"load average", fmt.Sprintf("%s at the start, %s at the end", m.LoadAvg, m.LoadEnd)},
	}
	if iso != nil && iso.Taskset != "" {
		rows = append(rows, []string{"pinning", fmt.Sprintf("applied: server on CPU %d, load generator on CPU %d (`taskset`)", iso.ServerCPU, iso.LoadCPU)})
	} else {
		rows = append(rows, []string{"pinning", "not applied: server and load generator share the CPUs"})
	}
	if iso != nil && iso.Quota > 0 {
		rows = append(rows, []string{"cgroup", fmt.Sprintf("applied: the server runs in its own cgroup v1 (`cpu` and `cpuacct`), CFS quota %.2f CPU (%d µs per %d µs), cpu.shares %d", iso.Quota, int(iso.Quota*float64(iso.PeriodUs)), iso.PeriodUs, iso.Shares)})
	} else {
		rows = append(rows, []string{"cgroup", "not applied: no CPU quota"})
	}
	if iso != nil && iso.LoadCgroup != "" {
		rows = append(rows, []string{"load generator", fmt.Sprintf("in its own cgroup v1 (`cpu`), cpu.shares %d, no quota", iso.Shares)})
	}
	if iso != nil && len(iso.Notes) > 0 {
		rows = append(rows, []string{"notes", strings.Join(iso.Notes, "; ")})
	}
	rows = append(rows,
		[]string{"CPU limit the gate detected", fmt.Sprintf("**%.2f CPU** (sampler `%s`; server GOMAXPROCS %d, affinity %d CPU)", p.Server.Budget, p.Server.Source, p.Server.GOMAXPROCS, p.Server.Affinity)},
		[]string{"burn loop", fmt.Sprintf("%d ns per SHA-256 iteration, calibrated once by the load generator and shared by every server", p.PerIterNs)},
		[]string{"measured capacity", fmt.Sprintf("**%.0f calls/s**", p.Capacity)})
	return mdTable("ll", nil, rows)
}

// CapacitySteps is the capacity measurement's table.
func (p page) CapacitySteps() string {
	var rows [][]string
	for _, s := range p.CapSteps {
		rows = append(rows, []string{fmt.Sprintf("%.0f", s.Rate), fmt.Sprintf("%.0f", s.Window.Goodput), num(s.Window.P99, 1), fmt.Sprint(s.Pass)})
	}
	return mdTable("rrrl", []string{"offered/s", "goodput/s", "p99 ms", "pass"}, rows)
}

// CapacityMethod describes how the capacity was measured.
func (p page) CapacityMethod() string { return capacityMethod(p.CapSteps, p.Config.Quick) }

// capacityMethod describes how the capacity was measured, from the steps
// taken (a run's results may come from an earlier version of
// measureCapacity, with other step lengths).
func capacityMethod(steps []CapacityStep, quick bool) string {
	var b strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	factor := "×1.5"
	if !quick {
		factor = "×1.08"
	}
	f("The capacity is measured first, against variant A: open-loop load in steps of %s", factor)
	if len(steps) > 0 {
		w := steps[0].Window
		f(", each %.3g s long and judged on its last %.3g s", w.To, w.To-w.From)
	}
	f(", a step passing while the accepted calls' p99 is within the SLO and at least 97%% of calls succeed within it. ")
	var repeated, refined bool
	for i := 1; i < len(steps); i++ {
		prev, s := steps[i-1], steps[i]
		repeated = repeated || !prev.Pass && s.Rate == prev.Rate
		refined = refined || !prev.Pass && s.Rate > prev.Rate*0.7 && s.Rate < prev.Rate
	}
	if repeated {
		f("A step that fails after one that passed is repeated once before it counts. ")
	}
	if refined {
		f("Once one has failed, up to two more steps halve the interval between the last pass and the failure. ")
	}
	f("The capacity is the highest goodput of a passing step, at most that step's offered load")
	if len(steps) > 0 && steps[0].Window.To >= 5 {
		f(": a rate the server sustains, since 3%% over it queues about 0.15 s of work within a step, beyond the SLO")
	}
	f(".")
	return b.String()
}

// Variants is the table of the variants run.
func (p page) Variants() string {
	var rows [][]string
	for _, v := range p.variants() {
		rows = append(rows, []string{v, variantNames[v]})
	}
	return mdTable("ll", []string{"", "admission control"}, rows)
}

// byVariantAndLoad returns a table of a row per variant and a column per
// load of the sweep.
func (p page) byVariantAndLoad(cell func(w *Window) string) string {
	loads := p.sweepLoads()
	head := []string{"variant"}
	for _, l := range loads {
		head = append(head, loadName(l))
	}
	var rows [][]string
	for _, v := range p.variants() {
		r := p.run("sweep", v)
		cells := []string{v}
		for _, l := range loads {
			if w := r.window(loadName(l)); w != nil {
				cells = append(cells, cell(w))
			} else {
				cells = append(cells, "–")
			}
		}
		rows = append(rows, cells)
	}
	return mdTable("l"+strings.Repeat("r", len(loads)), head, rows)
}

// SweepGoodput is the sweep's goodput by variant and load.
func (p page) SweepGoodput() string {
	return p.byVariantAndLoad(func(w *Window) string {
		return fmt.Sprintf("%.0f (%.0f%%)", w.Goodput, 100*w.Goodput/p.Capacity)
	})
}

// SweepLatency is the sweep's accepted latency by variant and load.
func (p page) SweepLatency() string {
	return p.byVariantAndLoad(func(w *Window) string {
		return num(w.P50, 1) + " / " + num(w.P99, 0) + " / " + num(w.P999, 0)
	})
}

// SweepRejections is the sweep's rejections, deadlines and CPU by variant
// and load.
func (p page) SweepRejections() string {
	return p.byVariantAndLoad(func(w *Window) string {
		return fmt.Sprintf("%.0f rej, %.0f late, %s CPU", w.Rejected, w.Deadline, num(nonzero(w.ServerCPU), 2))
	})
}

// StepTable is the step's table.
func (p page) StepTable() string {
	var rows [][]string
	for _, v := range p.variants() {
		r := p.run("step", v)
		if r == nil {
			continue
		}
		all, hi := r.window("all"), r.window("high")
		rows = append(rows, []string{v, fmt.Sprintf("%.0f", all.Goodput), fmt.Sprintf("%.0f", hi.Goodput), num(hi.P99, 0), fmt.Sprintf("%.1f", hi.Deadline),
			secs(r.ShedS), secs(r.RecoverS), fmt.Sprintf("%.1f", r.Reversals), fmt.Sprintf("%d/%d", all.HealthOK, all.HealthSent)})
	}
	return mdTable("lrrrrrrrr", []string{"variant", "goodput/s, whole run", "at 3×", "p99 at 3×, ms", "deadline exceeded/s at 3×", "time to shed", "time to recover", "reversals/min", "health probes"}, rows)
}

// CapchangeTable is the capacity change's table.
func (p page) CapchangeTable() string {
	settle := time.Duration(0)
	if sc := p.scenario("capchange"); sc != nil {
		settle = sc.Settle
	}
	var rows [][]string
	for _, v := range p.variants() {
		r := p.run("capchange", v)
		if r == nil {
			continue
		}
		all, be, ch, co := r.window("all"), r.window("before"), r.window("change"), r.window("converged")
		settled := "–"
		if w := r.window(settledWindow); w != nil {
			settled = fmt.Sprintf("%.0f (%.0f%%)", w.Goodput, 100*w.Goodput/p.NewCapacity())
		}
		rows = append(rows, []string{v, fmt.Sprintf("%.0f", all.Goodput), fmt.Sprintf("%.0f", be.Goodput), fmt.Sprintf("%.0f", ch.Goodput), fmt.Sprintf("%.0f", co.Goodput),
			settled, secs(r.CapS), num(co.P99, 0), fmt.Sprintf("%.1f", co.Deadline), fmt.Sprintf("%.1f", r.Reversals), fmt.Sprintf("%d/%d", all.HealthOK, all.HealthSent)})
	}
	return mdTable("lrrrrrrrrrr", []string{"variant", "goodput/s, whole run", "before (2–10 s)", "change (10–18 s)", "converged (18–30 s)",
		fmt.Sprintf("from %v after the change, %% of the new capacity", settle), fmt.Sprintf("time to %.0f%% of the new capacity", 100*capTarget),
		"p99 converged, ms", "deadline exceeded/s converged", "reversals/min", "health probes"}, rows)
}

// CapchangeAt describes when the capacity change's capacity is reached.
func (p page) CapchangeAt() string {
	at, _, _ := p.scenario("capchange").changeAt()
	return fmt.Sprintf("from the change (at %v) to the first of %d whole seconds in a row whose goodput each reached %.0f%% of it", at, capSustain, 100*capTarget)
}

// BurstTable is the tenant burst's table.
func (p page) BurstTable() string {
	var rows [][]string
	for _, v := range p.variants() {
		r := p.run("burst", v)
		if r == nil {
			continue
		}
		w, all := r.window("burst"), r.window("all")
		heavy := "–"
		if good, fair := heavyFair(w, p.Capacity); fair > 0 {
			heavy = fmt.Sprintf("%.0f (%.0f%%)", good, 100*good/fair)
		} else if len(w.TenantGood) == numTenants {
			heavy = fmt.Sprintf("%.0f", good)
		}
		rows = append(rows, []string{v, pct(w.LightSuccess), num(w.LightP99, 0), pct(w.HeavySuccess), heavy, num(w.Jain, 3), num(w.FairJain, 3),
			fmt.Sprintf("%.0f", w.Goodput), num(w.P99, 0), fmt.Sprintf("%d/%d", all.HealthOK, all.HealthSent)})
	}
	return mdTable("lrrrrrrrrr", []string{"variant", "light tenants' success in the burst", "light tenants' p99, ms", "heavy tenant's success",
		"heavy tenant's goodput/s (% of its fair share)", "Jain's index, success ratios", "Jain's index, shares of fair share", "goodput/s in the burst", "p99 in the burst, ms", "health probes"}, rows)
}

// NeighbourIdleTable is the idle server's table beside the neighbour.
func (p page) NeighbourIdleTable() string {
	var rows [][]string
	for _, v := range p.variants() {
		r := p.run(neighbourIdle, v)
		if r == nil {
			continue
		}
		all := r.window("all")
		rows = append(rows, []string{v, fmt.Sprintf("%d of %d", all.Rejections, r.Calls), fmt.Sprint(all.Deadlines), fmt.Sprintf("%.0f", all.Goodput), num(all.P99, 1),
			num(nonzero(all.ServerCPU), 2), neighbourCPU(r), fmt.Sprintf("%d/%d", all.HealthOK, all.HealthSent)})
	}
	return mdTable("lrrrrrrr", []string{"variant", "calls rejected", "deadline exceeded", "goodput/s", "p99, ms", "server CPU", "neighbour CPU", "health probes"}, rows)
}

// NeighbourOverloadTable is the overloaded server's table beside the
// neighbour.
func (p page) NeighbourOverloadTable() string {
	var rows [][]string
	for _, v := range p.variants() {
		r := p.run(neighbourOverload, v)
		w, all := r.window("overload"), r.window("all")
		if w == nil {
			continue
		}
		ref, ratio := "–", "–"
		if sw := p.run("sweep", v).window(loadName(w.Load)); sw != nil {
			ref = fmt.Sprintf("%.0f", sw.Goodput)
			if sw.Goodput > 0 {
				ratio = fmt.Sprintf("%.2f", w.Goodput/sw.Goodput)
			}
		}
		rows = append(rows, []string{v, fmt.Sprintf("%.0f", w.Goodput), ref, ratio, num(w.P99, 0), fmt.Sprintf("%.0f", w.Rejected), fmt.Sprintf("%.0f", w.Deadline),
			num(nonzero(w.ServerCPU), 2), neighbourCPU(r), fmt.Sprintf("%d/%d", all.HealthOK, all.HealthSent)})
	}
	return mdTable("lrrrrrrrrr", []string{"variant", "goodput/s", "sweep's 2×, goodput/s", "ratio", "p99, ms", "rejected/s", "deadline exceeded/s", "server CPU", "neighbour CPU", "health probes"}, rows)
}

// neighbourCPU returns the CPU a run's neighbour used, for the tables.
func neighbourCPU(r *Run) string {
	if r.Neighbour == nil {
		return "–"
	}
	return fmt.Sprintf("%.2f", r.Neighbour.CPU)
}

// StormTable is the retry storm's table.
func (p page) StormTable() string {
	sc := p.scenario(retryStorm)
	var rows [][]string
	for _, v := range p.variants() {
		r := p.run(retryStorm, v)
		if r == nil || sc == nil {
			continue
		}
		base, all := r.window(stormBaseline), r.window("all")
		for _, s := range sc.Segments {
			w := r.window(s.Name)
			if w == nil {
				continue
			}
			vsBase, health := "–", ""
			if base != nil && base.OKRate > 0 {
				vsBase = pct(w.OKRate / base.OKRate)
			}
			if all != nil && s.Client == clientOnce {
				health = fmt.Sprintf("%d/%d", all.HealthOK, all.HealthSent)
			}
			c := p.Capacity
			rows = append(rows, []string{v, clientLabel(s.Client, p.Config.ThrottleK), fmt.Sprintf("%.2f×", w.Sent/c), fmt.Sprintf("%.2f×", w.Wire/c),
				fmt.Sprintf("%.0f", w.WireRejected), fmt.Sprintf("%.0f", w.Dropped), fmt.Sprintf("%.0f (%.2f×)", w.OKRate, w.OKRate/c), vsBase,
				fmt.Sprintf("%.0f", w.Goodput), num(w.P99, 0) + " / " + num(w.WireP99, 0), fmt.Sprintf("%.1f", w.Deadline), health})
		}
	}
	return mdTable("llrrrrrrrrrr", []string{"variant", "clients", "offered, × capacity", "on the wire, × capacity", "rejected on the wire/s", "dropped on the client/s",
		"served OK/s (× capacity)", "served OK vs. no retries", "goodput/s", "accepted p99, ms: calls / attempts", "deadline exceeded/s", "health probes"}, rows)
}

// StormSegments describes the retry storm's segments.
func (p page) StormSegments() string {
	sc := p.scenario(retryStorm)
	if sc == nil {
		return ""
	}
	var parts, skips []string
	for _, s := range sc.Segments {
		parts = append(parts, fmt.Sprintf("**%s** (%v)", s.Name, s.Dur))
		skips = append(skips, s.Skip.String())
	}
	return fmt.Sprintf("%s; the figures start %s into them, leaving the transitions out", strings.Join(parts, ", "), strings.Join(skips, ", "))
}

// RejCostTable is the direct measurement of a rejection's cost.
func (p page) RejCostTable() string {
	var rows [][]string
	for _, rc := range p.RejCosts {
		rj := rc.phase("reject")
		verdict := "undetermined"
		switch {
		case rc.Saturated:
			verdict = "undetermined: the server saturated"
		case rc.Valid() && rc.Ratio <= targetRejCost:
			verdict = "met"
		case rc.Valid():
			verdict = "**missed**"
		}
		lat := "–"
		if rj != nil && rj.RejP50 >= 0 {
			lat = num(rj.RejP50, 2) + " / " + num(rj.RejP99, 2)
		}
		floor, above := "–", "–"
		if rc.FloorUs > 0 {
			floor, above = fmt.Sprintf("%.1f µs", rc.FloorUs), fmt.Sprintf("%+.1f µs", rc.PerRejectedUs-rc.FloorUs)
		}
		rows = append(rows, []string{rc.Variant, fmt.Sprintf("%.1f µs", rc.PerServedUs), fmt.Sprintf("%.1f µs", rc.PerRejectedUs), pct(rc.Ratio), verdict, floor, above, lat,
			fmt.Sprintf("%.4f CPU", rc.IdleCPU), pct(rc.ServedShare)})
	}
	return mdTable("lrrrlrrrrr", []string{"variant", "CPU per served call", "CPU per rejection", "ratio", "target ≤ 1%", "floor: CPU per health check", "rejection above the floor",
		"rejection latency p50 / p99, ms", "idle CPU", "handlers' share of the reject phase's CPU"}, rows)
}

// RejCostInputs is the rejection cost's inputs, phase by phase.
func (p page) RejCostInputs() string {
	var rows [][]string
	for _, rc := range p.RejCosts {
		for _, ph := range rc.Phases {
			st := fmt.Sprintf("%.2f", ph.Scale)
			if ph.State != "" {
				st += " " + ph.State
			}
			rows = append(rows, []string{rc.Variant, ph.Name, fmt.Sprintf("%.0f", ph.Rate), fmt.Sprintf("%.3f", ph.Secs), fmt.Sprintf("%.4f", ph.CPUSec),
				fmt.Sprint(ph.Sent), fmt.Sprint(ph.OK), fmt.Sprint(ph.Rej), fmt.Sprint(ph.Other), fmt.Sprintf("%d / %d", ph.Handle, ph.Served), st})
		}
	}
	return mdTable("llrrrrrrrrr", []string{"variant", "phase", "offered/s", "duration s", "server CPU s", "sent", "OK", "rejected", "other", "handlers entered / completed", "gate scale at the end"}, rows)
}

// RejCostCPUSource is where the rejection cost's CPU readings come from.
func (res *Results) RejCostCPUSource() string {
	if len(res.RejCosts) == 0 {
		return ""
	}
	return res.RejCosts[0].CPUSource
}

// TapShed reports whether a gate shed during a reject phase.
func (res *Results) TapShed() bool {
	return slices.ContainsFunc(res.RejCosts, func(rc RejCost) bool { return rc.TapShed })
}

// RejCostVariants are the variants the rejection cost is measured for.
func (page) RejCostVariants() string { return strings.Join(rejcostVariants, ", ") }

// FitTable is the regression of the server's CPU over every second.
func (p page) FitTable() string {
	var rows [][]string
	for _, v := range p.variants() {
		ft, ok := p.Fits[v]
		if !ok {
			continue
		}
		rl := "–"
		if w := p.run("sweep", v).window(loadName(4)); w != nil && w.RejP50 >= 0 {
			rl = num(w.RejP50, 2) + " / " + num(w.RejP99, 2)
		}
		if ft.Ratio < 0 && ft.PerServedMs == 0 {
			rows = append(rows, []string{v, fmt.Sprint(ft.N), "–", "–", "–", "–", rl})
			continue
		}
		rows = append(rows, []string{v, fmt.Sprint(ft.N), fmt.Sprintf("%.3f ms", ft.PerServedMs), fmt.Sprintf("%.1f µs", ft.PerRejectedUs), pct(ft.Ratio), fmt.Sprintf("%.3f CPU", ft.IdleCPU), rl})
	}
	return mdTable("lrrrrrr", []string{"variant", "seconds fitted", "CPU per served call (a)", "CPU per rejection (b)", "b / a", "idle CPU (c)", "rejection latency p50 / p99 at 4×, ms"}, rows)
}

// SweepCostTable is the sweep's estimate of a rejection's cost.
func (p page) SweepCostTable() string {
	var rows [][]string
	for _, v := range p.variants() {
		if rc, ok := p.SweepCosts[v]; ok {
			rows = append(rows, []string{v, fmt.Sprintf("%.3f ms", rc.PerServedMs), fmt.Sprintf("%.1f µs", rc.PerRejectedUs), pct(rc.Ratio)})
		} else {
			rows = append(rows, []string{v, "–", "–", "–"})
		}
	}
	return mdTable("lrrr", []string{"variant", "CPU per served call", "CPU per rejection", "ratio"}, rows)
}

// HealthTable is every variant's health probes over every scenario.
func (p page) HealthTable() string {
	var rows [][]string
	for _, v := range p.variants() {
		ok, n := p.health(v)
		rows = append(rows, []string{v, fmt.Sprintf("%d/%d (%s)", ok, n, pct(ratio(ok, n)))})
	}
	return mdTable("lr", []string{"variant", "probes OK"}, rows)
}
