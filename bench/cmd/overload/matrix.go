package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/floodgate-go/floodgate/internal/burn"
	inventoryv1 "github.com/floodgate-go/floodgate/proto/inventory/v1"
)

// The scenario matrix (-matrix full or -matrix quick) asks where each
// variant stops working: it moves one axis at a time away from a centre
// cell (a 2 ms handler, a warm server on its own CPU, 2× and 4× the
// capacity) and adds the corners that are known to be hard. The axes:
//
//   - the handler: CPU cost from 0.2 ms to 20 ms, or a blocking handler
//     that holds one of eight pooled connections for 10 ms while asleep
//     (capacity about 800 calls/s whatever the CPU);
//   - the start: load from the moment the server listens (cold) or after
//     it has been idle for a second (warm);
//   - the placement: the server on its own CPU, sharing both CPUs with the
//     load generator, or pinned to one CPU inside a cgroup whose quota
//     allows two (a CPU budget its sampler misreads);
//   - the offered load: steady from 1.2× to 10× the capacity, a step
//     0.5× → 3× → 0.5×, and a tenant burst.
//
// Every (handler, placement) gets its own capacity, measured once per run
// against a server without admission control. Every cell runs against
// every variant, one fresh server each; a few cells are also driven by
// ghz, an external load generator, so that our own client's figures have
// a second opinion.

// Placements of the server, relative to the load generator.
const (
	// placeOwn: the server pinned to CPU 0 in a cgroup with a quota of one
	// CPU and GOMAXPROCS=1; the load generator on CPU 1.
	placeOwn = "own"
	// placeShared: neither pinned, no quota; the server's GOMAXPROCS is
	// its default. Both processes compete for both CPUs.
	placeShared = "shared"
	// placeMisread: the server pinned to CPU 0 with GOMAXPROCS=1, in a
	// cgroup whose quota allows two CPUs: the budget a sampler reads from
	// the cgroup is twice what the server can use.
	placeMisread = "misread"
)

// Shapes of a cell's offered load.
const (
	shapeSteady = "steady"
	shapeStep   = "step"
	shapeBurst  = "burst"
)

// The blocking handler: a pool of blockPool connections, each call holding
// one for blockHold while asleep.
const (
	blockPool = 8
	blockHold = 10 * time.Millisecond
)

// A cell's timing. A steady cell offers its load for cellDur and is judged
// from cellSkip on; a cold one also over its first coldWindow. A warm
// server is idle for warmIdle between its start and the load.
const (
	cellDur    = 12 * time.Second
	cellSkip   = 3 * time.Second
	coldWindow = 2 * time.Second
	warmIdle   = time.Second
	// The step: stepLow × capacity, then the cell's load, then stepLow
	// again.
	stepLow = 0.5
	// The burst: burstBase × capacity throughout, the heavy tenant burstX
	// times its rate in the middle.
	burstBase = 0.6
	burstX    = 5
)

// A Cell is one point of the matrix.
type Cell struct {
	Name string `json:"name"`
	// Axis is what the cell varies from the centre: "centre", "handler",
	// "start", "placement", "load" or "corner".
	Axis string `json:"axis"`
	// Cost is the handler's CPU time per call; 0 with Blocking.
	Cost time.Duration `json:"cost,omitempty"`
	// Blocking is the blocking handler (blockPool, blockHold).
	Blocking bool `json:"blocking,omitempty"`
	// Cold starts the load as soon as the server listens.
	Cold      bool   `json:"cold,omitempty"`
	Placement string `json:"placement"`
	Shape     string `json:"shape"`
	// Load is the offered load, × the capacity: a steady cell's, a step's
	// high, a burst's base.
	Load float64 `json:"load"`
	// Ghz also drives the cell with ghz.
	Ghz bool `json:"ghz,omitempty"`
}

// handler names the cell's handler: "2ms", "0.5ms", "block".
func (c Cell) handler() string {
	if c.Blocking {
		return "block"
	}
	return strconv.FormatFloat(float64(c.Cost)/float64(time.Millisecond), 'f', -1, 64) + "ms"
}

// key names the cell's (handler, placement), whose capacity it shares.
func (c Cell) key() string { return c.handler() + "/" + c.Placement }

// name returns the cell's name: handler, start, placement and load.
func (c Cell) name() string {
	start := "warm"
	if c.Cold {
		start = "cold"
	}
	load := strconv.FormatFloat(c.Load, 'f', -1, 64) + "x"
	if c.Shape != shapeSteady {
		load = c.Shape
	}
	return strings.Join([]string{c.handler(), start, c.Placement, load}, "-")
}

// scenario returns the cell's load as a scenario.
func (c Cell) scenario() Scenario {
	sc := Scenario{Name: c.Name, Title: c.Name}
	switch c.Shape {
	case shapeStep:
		sc.Segments = []Segment{
			{Name: "before", Dur: 3 * time.Second, Load: stepLow, Skip: time.Second, Measure: true},
			{Name: "high", Dur: 5 * time.Second, Load: c.Load, Skip: time.Second, Measure: true},
			{Name: "after", Dur: 5 * time.Second, Load: stepLow, Measure: true},
		}
	case shapeBurst:
		sc.Segments = []Segment{
			{Name: "before", Dur: 3 * time.Second, Load: c.Load, Skip: time.Second, Measure: true},
			{Name: "burst", Dur: 7 * time.Second, Load: c.Load, HeavyX: burstX, Skip: time.Second, Measure: true},
			{Name: "after", Dur: 2 * time.Second, Load: c.Load, Measure: true},
		}
	default:
		sc.Segments = []Segment{{Name: "steady", Dur: cellDur, Load: c.Load, Skip: cellSkip, Measure: true}}
	}
	return sc
}

// judged names the window of the cell's scenario that the targets judge.
func (c Cell) judged() string {
	switch c.Shape {
	case shapeStep:
		return "high"
	case shapeBurst:
		return "burst"
	}
	return "steady"
}

// matrixNames are the matrices -matrix runs.
var matrixNames = []string{"quick", "full"}

// matrixCells returns the cells of the matrix called name.
func matrixCells(name string) ([]Cell, error) {
	type opt func(*Cell)
	cold := func(c *Cell) { c.Cold = true }
	withGhz := func(c *Cell) { c.Ghz = true }
	place := func(p string) opt { return func(c *Cell) { c.Placement = p } }
	step := func(c *Cell) { c.Shape, c.Load = shapeStep, 3 }
	burst := func(c *Cell) { c.Shape, c.Load = shapeBurst, burstBase }
	cell := func(axis string, costMs, load float64, opts ...opt) Cell {
		c := Cell{Axis: axis, Cost: time.Duration(costMs * float64(time.Millisecond)), Placement: placeOwn, Shape: shapeSteady, Load: load}
		if costMs == 0 {
			c.Blocking = true
		}
		for _, o := range opts {
			o(&c)
		}
		c.Name = c.name()
		return c
	}
	var cells []Cell
	switch name {
	case "quick":
		// The centre at its harder load, with ghz beside it, and the
		// corner of a cold server that misreads its budget.
		cells = []Cell{
			cell("centre", 2, 4, withGhz),
			cell("corner", 2, 4, cold, place(placeMisread)),
		}
	case "full":
		cells = []Cell{
			cell("centre", 2, 2, withGhz),
			cell("centre", 2, 4, withGhz),
			// The handler; 0 is the blocking one. The cheapest handler
			// stays at 2×: at 4× the load generator cannot keep up.
			cell("handler", 0.2, 2),
			cell("handler", 0.5, 2),
			cell("handler", 0.5, 4, withGhz),
			cell("handler", 10, 2, withGhz),
			cell("handler", 10, 4),
			cell("handler", 20, 2),
			cell("handler", 20, 4),
			cell("handler", 0, 1.8),
			cell("handler", 0, 4),
			cell("start", 2, 2, cold),
			cell("start", 2, 4, cold),
			cell("placement", 2, 2, place(placeShared)),
			cell("placement", 2, 4, place(placeShared)),
			cell("placement", 2, 2, place(placeMisread)),
			cell("placement", 2, 4, place(placeMisread)),
			cell("load", 2, 1.2),
			cell("load", 2, 6),
			cell("load", 2, 10),
			cell("load", 2, 0, step),
			cell("load", 2, 0, burst),
			cell("corner", 0.5, 4, cold, place(placeMisread)),
			cell("corner", 2, 4, cold, place(placeMisread)),
		}
	default:
		return nil, fmt.Errorf("unknown matrix %q (known: %s)", name, strings.Join(matrixNames, ", "))
	}
	return cells, nil
}

// chooseCells returns the cells of cells named in list (comma-separated),
// or all of them when list is empty.
func chooseCells(cells []Cell, list string) ([]Cell, error) {
	if list == "" {
		return cells, nil
	}
	var out []Cell
	for _, n := range strings.Split(list, ",") {
		i := slices.IndexFunc(cells, func(c Cell) bool { return c.Name == n })
		if i < 0 {
			var names []string
			for _, c := range cells {
				names = append(names, c.Name)
			}
			return nil, fmt.Errorf("unknown cell %q (known: %s)", n, strings.Join(names, ", "))
		}
		out = append(out, cells[i])
	}
	return out, nil
}

// matrixVariants are the variants a matrix runs unless told otherwise:
// no admission control, the overload controller and the peers.
var matrixVariants = []string{"A", "E", "P1", "P2", "P3", "P4"}

// The capacity measurement of a (handler, placement), against a fresh
// server without admission control:
//
//  1. unloaded: one call in flight at a time for capUnloaded; the p99 of
//     its calls after the first quarter, which warms the server up, is
//     the unloaded p99;
//  2. closed loop: capInFlight calls in flight (twice the pool for the
//     blocking handler) for capClosed, judged after its first second: the
//     most the server completes, its ceiling;
//  3. open loop: Poisson steps at capFractions of the ceiling, from the
//     top, each capStep long and judged after its first capStepSkip, until
//     one passes as a step of measureCapacity passes (accepted p99 within
//     the SLO, 97% of calls within it); one more step halves the interval
//     between that one and the failure above it.
//
// The capacity is the best passing step's goodput, at most its rate: the
// existing method's figure, from steps placed by the ceiling rather than
// climbed to from below.
const (
	capUnloaded = 2 * time.Second
	capClosed   = 3 * time.Second
	capInFlight = 8
	capStep     = 4 * time.Second
	capStepSkip = time.Second
	// capPause lets a failed step's server finish the handlers it still
	// runs: every call has ended by the time the step does, each at its
	// deadline at the latest, and handlers stop at their caller's.
	capPause = 300 * time.Millisecond
)

// capFractions reach down to a quarter of the ceiling: a handler of
// 20 ms, whose calls share the CPU with GOMAXPROCS=1 (the runtime's
// preemption makes the server a processor-sharing queue), kept its p99
// within a 100 ms SLO only below half of its ceiling.
var capFractions = []float64{0.97, 0.9, 0.8, 0.65, 0.5, 0.35, 0.25}

// serverOverhead bounds a server's start, its drain after the load (at
// most the deadline) and its stop: runs of 13 s of load took 13.0 to
// 13.5 s.
const serverOverhead = time.Second

// capacityBudget bounds the capacity measurement of one (handler,
// placement): at most every fraction and the refining step, each
// followed by a pause.
func capacityBudget() time.Duration {
	steps := time.Duration(len(capFractions) + 1)
	return serverOverhead + capUnloaded + capClosed + steps*(capStep+capPause)
}

// runBudget bounds one run of cell against one variant by the driver.
func runBudget(c Cell, driver string) time.Duration {
	d := serverOverhead + c.scenario().Duration()
	if !c.Cold || driver == driverGhz {
		d += warmIdle
	}
	return d
}

// matrixBudget bounds a matrix's duration against n variants: every
// capacity measured, every cell run against every variant by our load
// generator, and by ghz where the cell has it and withGhz.
func matrixBudget(cells []Cell, n int, withGhz bool) time.Duration {
	var d time.Duration
	seen := map[string]bool{}
	for _, c := range cells {
		if !seen[c.key()] {
			seen[c.key()] = true
			d += capacityBudget()
		}
		d += time.Duration(n) * runBudget(c, driverOwn)
		if c.Ghz && withGhz {
			d += time.Duration(n) * runBudget(c, driverGhz)
		}
	}
	return d
}

// Drivers of a cell's load.
const (
	driverOwn = "own" // this program's ten Poisson tenants
	driverGhz = "ghz"
)

// MatrixResults are a matrix run's results.
type MatrixResults struct {
	Name      string     `json:"name"`
	Date      string     `json:"date"`
	Command   string     `json:"command"`
	Elapsed   float64    `json:"elapsed_s"`
	Machine   Machine    `json:"machine"`
	Isolation *Isolation `json:"isolation"`
	PerIterNs int64      `json:"per_iter_ns"`
	// SLO and Deadline are the calls' latency objective and deadline.
	SLO        time.Duration  `json:"slo"`
	Deadline   time.Duration  `json:"deadline"`
	Variants   []string       `json:"variants"`
	Cells      []Cell         `json:"cells"`
	Capacities []CellCapacity `json:"capacities"`
	Runs       []CellRun      `json:"runs"`
	// Ghz is the ghz that drove the ghz runs, GhzNote why there are none.
	Ghz     string `json:"ghz,omitempty"`
	GhzNote string `json:"ghz_note,omitempty"`
}

// CellCapacity is the capacity of a (handler, placement).
type CellCapacity struct {
	Key       string      `json:"key"`
	Placement string      `json:"placement"`
	Server    serverReady `json:"server"`
	// UnloadedP50 and UnloadedP99 are the latency of a call alone on the
	// server, ms.
	UnloadedP50 float64 `json:"unloaded_p50_ms"`
	UnloadedP99 float64 `json:"unloaded_p99_ms"`
	// Ceiling is the closed loop's rate with InFlight calls in flight,
	// calls/s.
	Ceiling  float64 `json:"ceiling"`
	InFlight int     `json:"in_flight"`
	// Capacity is what the cells' loads are multiples of, calls/s.
	Capacity float64        `json:"capacity"`
	Steps    []CapacityStep `json:"steps,omitempty"`
	// Note says what went wrong, if anything.
	Note string `json:"note,omitempty"`
}

// p99Limit is the admitted p99 a cell of this capacity may reach, ms: the
// SLO or five times the unloaded p99, whichever is larger.
func (c CellCapacity) p99Limit(slo time.Duration) float64 {
	return max(millis(slo), matrixP99X*c.UnloadedP99)
}

// CellRun is one cell against one variant, by one driver.
type CellRun struct {
	Cell    string      `json:"cell"`
	Variant string      `json:"variant"`
	Driver  string      `json:"driver"`
	Server  serverReady `json:"server,omitzero"`
	// Capacity is the cell's capacity, calls/s, and Offered the load
	// offered in the judged window, calls/s.
	Capacity float64 `json:"capacity"`
	Offered  float64 `json:"offered"`
	// Judged is the window the targets judge: a steady cell after its
	// first cellSkip, a step's high segment after its first second, the
	// burst after its first second.
	Judged Window `json:"judged"`
	// First is, in a cold cell, the window of its first coldWindow.
	First *Window `json:"first,omitempty"`
	// ShedStartS, ShedS and RecoverS are a step's times, s, from the step
	// up to the first quarter second in which at least shedStartShare of
	// calls were rejected, to the first clean second (timeToShed), and
	// from the step down to the recovery (timeToRecover); -1 when it did
	// not happen.
	ShedStartS float64 `json:"shed_start_s,omitempty"`
	ShedS      float64 `json:"shed_s,omitempty"`
	RecoverS   float64 `json:"recover_s,omitempty"`
	// Admitted and Shed are E's controller's counts at the end (Shed by
	// overload.ShedCause).
	Admitted uint64   `json:"admitted,omitempty"`
	Shed     []uint64 `json:"shed,omitempty"`
	Seconds  []Second `json:"seconds,omitempty"`
}

// shedStartShare is the share of a quarter second's calls that must be
// rejected for shedding to have started.
const shedStartShare = 0.1

// shedStart returns the time from from to the start of the first quarter
// second before to in which at least shedStartShare of calls were
// rejected; -1 when none.
func (raw *rawRun) shedStart(from, to time.Duration) float64 {
	return firstSustained(raw.buckets(from, to), 1, func(b bucketStats) bool {
		return b.sent > 0 && float64(b.rej) >= shedStartShare*float64(b.sent)
	})
}

// cellRun analyses a cell's run by our load generator.
func cellRun(raw *rawRun, c Cell, variant string, ready serverReady, capacity float64, slo time.Duration) CellRun {
	sc := c.scenario()
	run := analyse(raw, sc, variant, ready, capacity, slo)
	cr := CellRun{Cell: c.Name, Variant: variant, Driver: driverOwn, Server: ready, Capacity: capacity, Seconds: run.Seconds}
	if w := run.window(c.judged()); w != nil {
		cr.Judged = *w
	}
	if i := slices.IndexFunc(sc.Segments, func(s Segment) bool { return s.Name == c.judged() }); i >= 0 {
		for t := range numTenants {
			cr.Offered += sc.Segments[i].rate(t, capacity)
		}
	}
	if c.Cold {
		w := raw.window("first", 0, coldWindow, c.Load, slo)
		cr.First = &w
	}
	if c.Shape == shapeStep {
		up, down := sc.segmentStart(1), sc.segmentStart(2)
		cr.ShedStartS = raw.shedStart(up, down)
		cr.ShedS = raw.timeToShed(up, down, slo)
		cr.RecoverS = raw.timeToRecover(down, sc.Duration(), slo)
	}
	if n := len(raw.Polls); n > 0 {
		cr.Admitted, cr.Shed = raw.Polls[n-1].Admitted, raw.Polls[n-1].Shed
	}
	return cr
}

// matrixConfig is what a matrix run needs besides Config.
type matrixConfig struct {
	Name  string
	Cells []Cell
	// Ghz is the ghz binary, "" to skip the ghz runs, and GhzNote why;
	// GhzProto is the inventory proto ghz reads.
	Ghz, GhzNote, GhzProto string
}

// matrixRunner runs a matrix.
type matrixRunner struct {
	cfg      Config
	mc       matrixConfig
	iso      *Isolation
	perIter  time.Duration
	res      *MatrixResults
	loadCPUs string // the load generator's CPUs as last set, "" before
}

// runMatrix runs every cell of mc against every variant of cfg, measuring
// each (handler, placement)'s capacity the first time a cell needs it. It
// cleans up its cgroups and server processes whatever happens.
func runMatrix(ctx context.Context, cfg Config, mc matrixConfig) (*MatrixResults, error) {
	if err := cfg.fillDefaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	m := &matrixRunner{cfg: cfg, mc: mc, res: &MatrixResults{
		Name: mc.Name, Date: began.UTC().Format("2006-01-02 15:04 MST"), Machine: machine(),
		SLO: cfg.SLO, Deadline: cfg.Deadline, Variants: cfg.Variants, Cells: mc.Cells, GhzNote: mc.GhzNote,
	}}
	// The quota is set for each placement before its server starts.
	m.iso = detectIsolation(cfg.Pin, cfg.Cgroup, 1)
	defer m.iso.removeCgroups()
	// As detected: removing the cgroups clears their directories.
	detected := *m.iso
	m.res.Isolation = &detected
	cfg.Log("matrix %s: %d cells × %d variants, at most %.0f min; isolation: taskset=%q cgroup=%q notes=%v",
		mc.Name, len(mc.Cells), len(cfg.Variants), matrixBudget(mc.Cells, len(cfg.Variants), mc.Ghz != "").Minutes(), m.iso.Taskset, m.iso.CgroupCPU, m.iso.Notes)
	if mc.Ghz != "" {
		m.res.Ghz = ghzVersion(mc.Ghz)
	} else if slices.ContainsFunc(mc.Cells, func(c Cell) bool { return c.Ghz }) {
		cfg.Log("matrix: no ghz runs: %s", mc.GhzNote)
	}
	m.perIter = calibrateBurn()
	m.res.PerIterNs = int64(m.perIter)

	for _, c := range mc.Cells {
		capy, err := m.capacity(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("capacity of %s: %w", c.key(), err)
		}
		drivers := []string{driverOwn}
		if c.Ghz && mc.Ghz != "" {
			drivers = append(drivers, driverGhz)
		}
		for _, d := range drivers {
			for _, v := range cfg.Variants {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				r, err := m.run(ctx, c, v, d, capy)
				if err != nil {
					return nil, fmt.Errorf("%s/%s (%s): %w", c.Name, v, d, err)
				}
				m.res.Runs = append(m.res.Runs, r)
				m.log(c, r, capy)
			}
		}
	}
	m.res.Machine.LoadEnd = loadavg()
	m.res.Elapsed = time.Since(began).Seconds()
	return m.res, nil
}

// log writes a run's progress line.
func (m *matrixRunner) log(c Cell, r CellRun, capy CellCapacity) {
	w := r.Judged
	line := fmt.Sprintf("matrix %s/%s (%s): offered %.0f/s sent %.0f/s goodput %.0f/s = %.0f%% of %.0f/s, p99 %s ms (limit %.0f), rejected %.0f/s, late %.0f/s",
		c.Name, r.Variant, r.Driver, r.Offered, w.Sent, w.Goodput, 100*w.Goodput/capy.Capacity, capy.Capacity, num(w.P99, 1), capy.p99Limit(m.cfg.SLO), w.Rejected, w.Deadline)
	if r.First != nil {
		line += fmt.Sprintf(", first %v %.0f%%", coldWindow, 100*r.First.Goodput/capy.Capacity)
	}
	if c.Shape == shapeStep {
		line += fmt.Sprintf(", shed from %s (clean %s), recovered %s", secs(r.ShedStartS), secs(r.ShedS), secs(r.RecoverS))
	}
	if c.Shape == shapeBurst {
		line += ", light tenants " + pct(w.LightSuccess)
	}
	m.cfg.Log("%s", line)
}

// calibrateBurn returns the burn loop's cost per iteration, for every
// server of a run: the fastest of a few calibrations, since one can only
// be slowed down by other work.
func calibrateBurn() time.Duration {
	perIter := time.Duration(1<<63 - 1)
	for range 5 {
		perIter = min(perIter, burn.Calibrate().PerIteration())
		time.Sleep(20 * time.Millisecond)
	}
	return perIter
}

// place applies placement p for the next server: the cgroup's quota and
// the load generator's CPUs. It returns the isolation to start the server
// with and its environment.
func (m *matrixRunner) place(p string) (*Isolation, []string, error) {
	iso := *m.iso
	env := []string{"GOMAXPROCS=1"}
	quota := 1.0
	loadCPUs := strconv.Itoa(m.iso.LoadCPU)
	switch p {
	case placeOwn:
	case placeMisread:
		quota = 2
	case placeShared:
		quota, env, iso.Taskset = 0, nil, ""
		loadCPUs = fmt.Sprintf("0-%d", onlineCPUs()-1)
	default:
		return nil, nil, fmt.Errorf("unknown placement %q", p)
	}
	if iso.CgroupCPU != "" {
		if err := iso.setQuota(quota); err != nil {
			return nil, nil, fmt.Errorf("placement %s: %w", p, err)
		}
	}
	if m.iso.Taskset != "" && loadCPUs != m.loadCPUs {
		// Every thread of the load generator, as taskset -a does.
		out, err := exec.Command(m.iso.Taskset, "-a", "-p", "-c", loadCPUs, strconv.Itoa(os.Getpid())).CombinedOutput()
		if err != nil {
			return nil, nil, fmt.Errorf("placement %s: taskset: %v: %s", p, err, out)
		}
		m.loadCPUs = loadCPUs
	}
	return &iso, env, nil
}

// start starts a server of variant v for cell c, told capacity.
func (m *matrixRunner) start(ctx context.Context, c Cell, v string, capacity float64) (*serverProc, error) {
	iso, env, err := m.place(c.Placement)
	if err != nil {
		return nil, err
	}
	sampler := "process"
	if iso.CgroupCPU != "" {
		sampler = "cgroup"
	}
	args := []string{
		"-variant", v, "-cost", c.Cost.String(),
		"-capacity", strconv.FormatFloat(capacity, 'f', 2, 64), "-sampler", sampler,
		"-per-iter", m.perIter.String(),
	}
	if c.Blocking {
		args = append(args, "-block-pool", strconv.Itoa(blockPool), "-block", blockHold.String())
	}
	return startServer(ctx, iso, m.cfg.Exe, args, env...)
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// run runs cell c against a fresh server of variant v, driven by d.
func (m *matrixRunner) run(ctx context.Context, c Cell, v, d string, capy CellCapacity) (CellRun, error) {
	p, err := m.start(ctx, c, v, capy.Capacity)
	if err != nil {
		return CellRun{}, fmt.Errorf("server: %w", err)
	}
	defer p.stop()
	if !c.Cold || d == driverGhz {
		if err := sleep(ctx, warmIdle); err != nil {
			return CellRun{}, err
		}
	}
	if d == driverGhz {
		return m.runGhz(ctx, p, c, v, capy.Capacity)
	}
	raw, err := runScenario(ctx, p, c.scenario(), loadConfig{Capacity: capy.Capacity, Deadline: m.cfg.Deadline, Seed: m.cfg.Seed})
	if err != nil {
		return CellRun{}, err
	}
	p.stop()
	return cellRun(raw, c, v, p.ready, capy.Capacity, m.cfg.SLO), nil
}

// capacity returns the capacity of c's (handler, placement), measured the
// first time it is asked for.
func (m *matrixRunner) capacity(ctx context.Context, c Cell) (CellCapacity, error) {
	if i := slices.IndexFunc(m.res.Capacities, func(k CellCapacity) bool { return k.Key == c.key() }); i >= 0 {
		return m.res.Capacities[i], nil
	}
	p, err := m.start(ctx, c, "A", 0)
	if err != nil {
		return CellCapacity{}, fmt.Errorf("server: %w", err)
	}
	defer p.stop()
	capy, err := m.measure(ctx, p, c)
	if err != nil {
		return CellCapacity{}, err
	}
	m.res.Capacities = append(m.res.Capacities, capy)
	m.cfg.Log("matrix capacity %s: unloaded p50 %.2f ms p99 %.2f ms, ceiling %.0f/s (%d in flight), capacity %.0f/s %s",
		capy.Key, capy.UnloadedP50, capy.UnloadedP99, capy.Ceiling, capy.InFlight, capy.Capacity, capy.Note)
	return capy, nil
}

// measure measures the capacity of c's (handler, placement) against the
// server p, which has no admission control (see capFractions).
func (m *matrixRunner) measure(ctx context.Context, p *serverProc, c Cell) (CellCapacity, error) {
	capy := CellCapacity{Key: c.key(), Placement: c.Placement, Server: p.ready, InFlight: capInFlight}
	if c.Blocking {
		capy.InFlight = 2 * blockPool
	}
	cl, err := dial(p.ready.GRPC)
	if err != nil {
		return capy, err
	}
	// The unloaded calls warm the server up: their first quarter is left
	// out.
	_, lat := closedLoop(ctx, cl, 1, capUnloaded, capUnloaded/4, m.cfg.Deadline)
	capy.Ceiling, _ = closedLoop(ctx, cl, capy.InFlight, capClosed, time.Second, m.cfg.Deadline)
	cl.close()
	capy.UnloadedP50, capy.UnloadedP99 = ms(lat, 0.5), ms(lat, 0.99)
	if capy.Ceiling <= 0 || capy.UnloadedP99 < 0 {
		return capy, errors.New("no call completed in the closed loop")
	}
	if err := sleep(ctx, 200*time.Millisecond); err != nil {
		return capy, err
	}
	step := func(r float64) (bool, float64, error) {
		sc := Scenario{Name: "capacity", Segments: []Segment{{Name: "step", Dur: capStep, Load: r, Skip: capStepSkip, Measure: true}}}
		raw, err := runScenario(ctx, p, sc, loadConfig{Capacity: 1, Deadline: m.cfg.Deadline, Seed: m.cfg.Seed})
		if err != nil {
			return false, 0, err
		}
		w := raw.window("step", capStepSkip, capStep, r, m.cfg.SLO)
		pass := w.P99 >= 0 && w.P99 <= millis(m.cfg.SLO) && w.Goodput >= 0.97*w.Sent
		capy.Steps = append(capy.Steps, CapacityStep{Rate: r, Window: w, Pass: pass})
		m.cfg.Log("matrix capacity %s step %.0f/s: goodput %.0f/s p99 %s ms pass=%v", capy.Key, r, w.Goodput, num(w.P99, 1), pass)
		if !pass {
			if err := sleep(ctx, capPause); err != nil {
				return false, 0, err
			}
		}
		return pass, min(w.Goodput, r), nil
	}
	failed := 0.0
	for _, f := range capFractions {
		r := f * capy.Ceiling
		pass, good, err := step(r)
		if err != nil {
			return capy, err
		}
		if !pass {
			failed = r
			continue
		}
		capy.Capacity = good
		if failed > 0 {
			r2 := math.Sqrt(r * failed)
			pass, good, err := step(r2)
			if err != nil {
				return capy, err
			}
			if pass {
				capy.Capacity = max(capy.Capacity, good)
			}
		}
		return capy, nil
	}
	// Not even a quarter of the ceiling met the SLO: a handler slower than
	// the SLO allows, or a machine too busy. Its cells still run, against the
	// lowest step's rate.
	capy.Capacity = capFractions[len(capFractions)-1] * capy.Ceiling
	capy.Note = "no open-loop step met the SLO: the capacity is the lowest step's rate"
	return capy, nil
}

// closedLoop keeps n calls in flight on c for dur, each call followed at
// once by the next, and returns the rate of the calls that began after
// skip and ended OK, and their latencies, sorted.
func closedLoop(ctx context.Context, c *client, n int, dur, skip, deadline time.Duration) (float64, []time.Duration) {
	start := time.Now()
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			t := i % numTenants
			inv := inventoryv1.NewInventoryClient(c.conns[t])
			md := metadata.NewOutgoingContext(ctx, metadata.Pairs(apiKeyHeader, apiKey(t)))
			req := &inventoryv1.AllocateRequest{Sku: "sku-00001", Quantity: 1}
			for time.Since(start) < dur && ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(md, deadline)
				t0 := time.Now()
				_, err := inv.Allocate(cctx, req)
				cancel()
				if err == nil && t0.Sub(start) >= skip {
					mu.Lock()
					lat = append(lat, time.Since(t0))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	slices.Sort(lat)
	return float64(len(lat)) / (dur - skip).Seconds(), lat
}
