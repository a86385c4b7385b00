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

// Minutes is how long the matrix took.
func (m *MatrixResults) Minutes() string { return fmt.Sprintf("%.0f min", m.Elapsed/60) }

// RunTable says where and how the matrix ran.
func (m *MatrixResults) RunTable() string {
	rows := [][]string{
		{"matrix", fmt.Sprintf("%s: %d cells, variants %s", m.Name, len(m.Cells), strings.Join(m.Variants, ", "))},
		{"date", m.Date},
		{"duration", fmt.Sprintf("%.1f min", m.Elapsed/60)},
		{"machine", fmt.Sprintf("%d CPUs, %s, %s", m.Machine.CPUs, m.Machine.Model, m.Machine.Go)},
		{"load average", fmt.Sprintf("%s at the start, %s at the end", m.Machine.LoadAvg, m.Machine.LoadEnd)},
	}
	if iso := m.Isolation; iso != nil {
		applied := "pinning " + map[bool]string{true: "applied", false: "not applied"}[iso.Taskset != ""] + ", cgroup " + map[bool]string{true: "applied", false: "not applied"}[iso.CgroupCPU != ""]
		if len(iso.Notes) > 0 {
			applied += " (" + strings.Join(iso.Notes, "; ") + ")"
		}
		rows = append(rows, []string{"isolation", applied})
	}
	if m.Ghz != "" {
		rows = append(rows, []string{"ghz", m.Ghz})
	} else if m.GhzNote != "" {
		rows = append(rows, []string{"ghz", "no ghz runs: " + m.GhzNote})
	}
	return mdTable("ll", nil, rows)
}

// CapacityTable is the capacity of each handler and placement.
func (m *MatrixResults) CapacityTable() string {
	var rows [][]string
	for _, c := range m.Capacities {
		note := ""
		if c.Note != "" {
			note = " (" + c.Note + ")"
		}
		rows = append(rows, []string{c.Key, fmt.Sprintf("%d, %d, %.2f (%s)", c.Server.GOMAXPROCS, c.Server.Affinity, c.Server.Budget, c.Server.Source),
			fmt.Sprintf("%.2f / %.2f", c.UnloadedP50, c.UnloadedP99), fmt.Sprintf("%.0f", c.p99Limit(m.SLO)), fmt.Sprintf("%.0f", c.Ceiling), fmt.Sprintf("%.0f%s", c.Capacity, note)})
	}
	return mdTable("llrrrr", []string{"handler / placement", "server: GOMAXPROCS, CPUs allowed, CPU budget read", "unloaded p50 / p99, ms", "p99 limit, ms", "ceiling, calls/s", "capacity, calls/s"}, rows)
}

// Counts is, per variant, the cells that met every target and the targets
// missed.
func (m *MatrixResults) Counts() string {
	var rows [][]string
	for _, v := range m.variants() {
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
		rows = append(rows, []string{v, fmt.Sprintf("%d/%d", met, n), fmt.Sprint(g), fmt.Sprint(p), fmt.Sprint(fi), fmt.Sprint(sh), fmt.Sprint(rc), fmt.Sprint(li)})
	}
	return mdTable("lrrrrrrr", []string{"variant", "cells meeting every target", "goodput missed", "p99 missed", fmt.Sprintf("first %s missed", seconds(coldWindow)), "shed missed", "recovery missed", "light tenants missed"}, rows)
}

// HasGhzCells reports whether some cells are also driven by ghz.
func (m *MatrixResults) HasGhzCells() bool {
	return slices.ContainsFunc(m.Cells, func(c Cell) bool { return c.Ghz })
}

// GhzTable puts the ghz runs beside our load generator's.
func (m *MatrixResults) GhzTable() string {
	var rows [][]string
	vs := m.variants()
	for _, c := range m.Cells {
		capy, ok := m.capacity(c.key())
		if !c.Ghz || !ok {
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
			rows = append(rows, []string{cellLabel(c), v, fmt.Sprintf("%.0f", c.Load*capy.Capacity), side(own, ok1), side(gz, ok2)})
		}
	}
	return mdTable("llrll", []string{"cell", "variant", "offered/s", "ours: sent/s, goodput · p99", "ghz: sent/s, goodput · p99"}, rows)
}

// Table is the matrix table: a row per cell, a column per variant.
func (m *MatrixResults) Table() string {
	vs := m.variants()
	var rows [][]string
	for _, c := range m.Cells {
		capy, ok := m.capacity(c.key())
		if !ok {
			continue
		}
		cells := []string{cellLabel(c), c.Axis, fmt.Sprintf("%.0f", capy.Capacity)}
		for _, v := range vs {
			e := "–"
			if r, ok := m.run(c.Name, v, driverOwn); ok {
				e = entry(r, c, capy, m.SLO)
			}
			cells = append(cells, e)
		}
		rows = append(rows, cells)
	}
	return mdTable("llr"+strings.Repeat("l", len(vs)), append([]string{"cell", "axis", "capacity, calls/s"}, vs...), rows)
}
