// Command overload is floodgate's overload experiment: real gRPC over
// loopback TCP against the example inventory service with a CPU-bound
// handler, under open-loop Poisson load from ten tenants, comparing
// admission-control variants side by side:
//
//	A   no admission control
//	B   per-tenant buckets (floodgate's middleware, no CPU gate)
//	C   buckets with the Fixed gate
//	D   buckets with the Adaptive gate
//	E   buckets with the overload controller (package overload), the
//	    default
//	P1  go-grpc-middleware's ratelimit with one global x/time/rate limiter
//	    at the measured capacity
//	P2  go-zero's adaptive shedder (core/load) as a unary interceptor
//	P3  go-kratos/aegis' BBR limiter, wrapped as kratos' ratelimit
//	    middleware wraps it
//	P4  platinummonkey/go-concurrency-limits' default Gradient2 limit
//	    behind its gRPC server interceptor: the module proxy refuses that
//	    module, so P4 runs only from a copy of the bench that registers it
//	    (outOfTree), and reports rendered from such a run show it
//
// Run it from the bench module, as root for the cgroup:
//
//	cd bench && go run ./cmd/overload
//
// It measures the capacity first, then runs every scenario (a sweep of the
// offered load, a step, a capacity change, a tenant burst, an idle and an
// overloaded server beside a CPU-burning neighbour, and a retry storm from
// clients that retry naively, then through package throttle) against every
// variant, one fresh server process per pair (the rejection-cost scenario,
// rejcost, only against the variants that reject: B, C, D, E and P1), and
// writes the results' summary as JSON (-out) and the raw results, every
// second of every run, in raw/ beside it, then BENCHMARKS.md (-md),
// rendered from the summary with report.md.tmpl, and the charts (-charts),
// drawn from the raw results. -render re-renders the report from saved
// results: the committed summary reproduces the committed report.
// -quick runs a tiny version. -scenarios runs only some scenarios, and
// -variants only some variants, for example
//
//	go run ./cmd/overload -scenarios rejcost -capacity 380 -out /tmp/x.json -md /tmp/x.md -charts /tmp/x
//	go run ./cmd/overload -quick -capacity 330 -variants A,E,P3 -scenarios neighbour-idle,neighbour-overload
//
// -matrix full runs the scenario matrix instead (see matrix.go): cells
// that move one axis at a time (the handler's cost, a cold or warm start,
// the server's placement, the offered load) away from a centre cell, each
// against A, E and the peers, with a capacity measured per handler and
// placement; -matrix quick runs two of its cells, -cells some of them.
// Its results replace the matrix of the results at -out and keep the
// rest, and the report renders them beside the scenarios':
//
//	go run ./cmd/overload -matrix full
//	go run ./cmd/overload -matrix quick -variants A,E,P1
//
// The server is this program re-executed ("overload server ..."), and so is
// the neighbour ("overload neighbour ..."). Where the machine allows, the
// load generator pins itself to CPU 1 and the server, and the neighbour, to
// CPU 0 with taskset, and the server runs in its own cgroup (v1 cpu and
// cpuacct) with a CPU quota, the neighbour outside it; what applied is in
// the report.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
)

// Config is one experiment's settings.
type Config struct {
	Quick    bool          `json:"quick"`
	Cost     time.Duration `json:"cost"`
	Deadline time.Duration `json:"deadline"`
	SLO      time.Duration `json:"slo"`
	Quota    float64       `json:"quota"`
	Pin      bool          `json:"pin"`
	Cgroup   bool          `json:"cgroup"`
	Variants []string      `json:"variants"`
	// Scenarios are the scenarios run, by name; empty is all of them.
	Scenarios []string `json:"scenarios,omitempty"`
	Seed      uint64   `json:"seed"`
	// NeighbourWorkers is the neighbour scenarios' number of spinning
	// threads.
	NeighbourWorkers int `json:"neighbour_workers,omitempty"`
	// Capacity, when positive, skips the measurement.
	Capacity float64 `json:"capacity_given,omitempty"`
	// ThrottleK is the retry storm's throttled clients' K (throttle.WithK);
	// 0 is the throttle's default.
	ThrottleK float64 `json:"throttle_k,omitempty"`
	// Exe is the command that starts a server: this program by default.
	Exe []string `json:"-"`
	// Log receives progress lines; nil discards them.
	Log func(format string, args ...any) `json:"-"`
}

// CapacityStep is one step of the capacity measurement.
type CapacityStep struct {
	Rate   float64 `json:"rate"`
	Window Window  `json:"window"`
	Pass   bool    `json:"pass"`
}

// Results is everything a run produced; the report renders from it alone.
type Results struct {
	Date      string         `json:"date"`
	Command   string         `json:"command"`
	Elapsed   float64        `json:"elapsed_s"`
	Config    Config         `json:"config"`
	Machine   Machine        `json:"machine"`
	Isolation *Isolation     `json:"isolation"`
	Server    serverReady    `json:"server"` // as the first server saw itself
	Capacity  float64        `json:"capacity"`
	PerIterNs int64          `json:"per_iter_ns"` // the burn loop's calibration, shared by every server
	CapSteps  []CapacityStep `json:"capacity_steps"`
	Scenarios []Scenario     `json:"scenarios"`
	Runs      []Run          `json:"runs"`
	Fits      map[string]Fit `json:"cpu_fits"`
	// SweepCosts are the sweep's estimate of a rejection's CPU by variant
	// (rejectionCost), which the summary computes from the sweep's
	// seconds.
	SweepCosts map[string]Fit `json:"sweep_cpu_fits,omitempty"`
	// RejCosts are the rejection-cost scenario's measurements, one per
	// variant that rejects.
	RejCosts []RejCost `json:"rejection_costs,omitempty"`
	// Matrix is the latest scenario matrix's results (-matrix), which a
	// run of the scenarios keeps and a matrix run replaces: each kind of
	// run rewrites only its own part of the results.
	Matrix *MatrixResults `json:"matrix,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs    int    `json:"cpus"`
	Model   string `json:"model"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	LoadAvg string `json:"loadavg_start"`
	LoadEnd string `json:"loadavg_end"`
	Kernel  string `json:"kernel"`
}

func machine() Machine {
	m := Machine{CPUs: onlineCPUs(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, LoadAvg: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.Model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// allVariants are the variants in report order.
var allVariants = []string{"A", "B", "C", "D", "E", "P1", "P2", "P3", "P4"}

var variantNames = map[string]string{
	"A":  "no admission control",
	"B":  "per-tenant buckets",
	"C":  "buckets + Fixed gate",
	"D":  "buckets + Adaptive gate",
	"E":  "buckets + overload controller (the new default)",
	"P1": "go-grpc-middleware ratelimit, global x/time/rate at capacity",
	"P2": "go-zero adaptive shedder (core/load)",
	"P3": "go-kratos/aegis BBR limiter, as kratos' ratelimit middleware",
	"P4": "go-concurrency-limits Gradient2 limit, its gRPC server interceptor (built out of tree)",
}

// unavailableVariants are peers the experiment compares but this module
// cannot build: what each would be, and why it is not. Such a variant
// runs only from a copy of the bench that registers it in outOfTree;
// a report rendered from results that hold it describes it as measured.
var unavailableVariants = map[string]struct{ What, Why string }{
	"P4": {
		What: "platinummonkey/go-concurrency-limits, a Gradient2 limit behind its gRPC server interceptor",
		Why:  "the Go module proxy refuses that module (403, \"This module version is not available\", for its version list, for v1.0.1 and for a commit), so the bench module cannot depend on it",
	},
}

// outOfTree holds the variants a copy of the bench builds beside a peer
// this module cannot depend on (see unavailableVariants): a file of that
// copy registers the variant's server from an init function.
var outOfTree = map[string]func(capacity float64) (variant, error){}

// chooseVariants returns the variants of -variants (a comma-separated
// list), or by default every variant this build can run (A and E with
// -quick); a variant unknown or not runnable here is an error.
func chooseVariants(list string, quick bool) ([]string, error) {
	switch {
	case list == "" && quick:
		return []string{"A", targetVariant}, nil
	case list == "":
		return slices.DeleteFunc(slices.Clone(allVariants), func(v string) bool { return !runnable(v) }), nil
	}
	vs := strings.Split(list, ",")
	for _, v := range vs {
		if u, ok := unavailableVariants[v]; ok && !runnable(v) {
			return nil, fmt.Errorf("variant %s (%s) is not available: %s", v, u.What, u.Why)
		}
		if !slices.Contains(allVariants, v) {
			return nil, fmt.Errorf("unknown variant %q (known: %s)", v, strings.Join(allVariants, ", "))
		}
	}
	return vs, nil
}

// runnable reports whether this build can start variant v's server.
func runnable(v string) bool {
	_, unavailable := unavailableVariants[v]
	_, registered := outOfTree[v]
	return !unavailable || registered
}

// sweepLoads are the sweep's offered loads, × capacity.
var sweepLoads = []float64{0.5, 1, 1.5, 2, 3, 4}

// Names of the scenarios that the analysis and the report single out.
const (
	neighbourIdle     = "neighbour-idle"
	neighbourOverload = "neighbour-overload"
)

// quickScenarios are the scenarios a quick run runs unless told otherwise.
var quickScenarios = []string{"sweep", "step", rejcostName}

// scenarios returns the scenarios of a full or quick run.
func scenarios(quick bool) []Scenario {
	sec := func(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
	if quick {
		sweep := Scenario{Name: "sweep", Title: "Sweep", Segments: []Segment{{Name: "warm-up", Dur: sec(0.3), Load: 0.5}}}
		for _, l := range []float64{0.5, 2} {
			sweep.Segments = append(sweep.Segments, Segment{Name: loadName(l), Dur: sec(1), Load: l, Skip: sec(0.3), Measure: true})
		}
		return []Scenario{sweep, {Name: "step", Title: "Step", Segments: []Segment{
			{Name: "before", Dur: sec(0.7), Load: 0.7, Measure: true},
			{Name: "high", Dur: sec(1), Load: 3, Measure: true},
			{Name: "after", Dur: sec(1), Load: 0.7, Measure: true},
		}}, {Name: "capchange", Title: "Capacity change", Settle: sec(0.5), Segments: []Segment{
			{Name: "before", Dur: sec(1), Load: 1.2, Skip: sec(0.2), Measure: true},
			{Name: "change", Dur: sec(1), Load: 1.2, CostX: 2, Measure: true},
			{Name: "converged", Dur: sec(1), Load: 1.2, CostX: 2, Measure: true},
		}}, {Name: "burst", Title: "Tenant burst", Segments: []Segment{
			{Name: "before", Dur: sec(0.5), Load: 0.6, Measure: true},
			{Name: "burst", Dur: sec(1.5), Load: 0.6, HeavyX: 5, Measure: true},
			{Name: "after", Dur: sec(0.5), Load: 0.6, Measure: true},
		}}, {Name: neighbourIdle, Title: "Neighbour, idle server", Neighbour: true, Segments: []Segment{
			{Name: "idle", Dur: sec(2), Load: 0.5, Skip: sec(0.3), Measure: true},
		}}, {Name: neighbourOverload, Title: "Neighbour, overload", Neighbour: true, Segments: []Segment{
			{Name: "warm-up", Dur: sec(0.3), Load: 0.5},
			{Name: "overload", Dur: sec(1.7), Load: 2, Skip: sec(0.5), Measure: true},
		}}, {Name: retryStorm, Title: "Retry storm", Segments: []Segment{
			{Name: stormBaseline, Dur: sec(0.8), Load: stormLoad, Skip: sec(0.3), Measure: true},
			{Name: clientNaive, Dur: sec(1), Load: stormLoad, Skip: sec(0.3), Measure: true, Client: clientNaive},
			{Name: clientThrottled, Dur: sec(1.2), Load: stormLoad, Skip: sec(0.5), Measure: true, Client: clientThrottled},
		}}}
	}
	sweep := Scenario{Name: "sweep", Title: "Sweep of the offered load", Segments: []Segment{{Name: "warm-up", Dur: sec(3), Load: 0.5}}}
	for _, l := range sweepLoads {
		sweep.Segments = append(sweep.Segments, Segment{Name: loadName(l), Dur: sec(7), Load: l, Skip: sec(2), Measure: true})
	}
	return []Scenario{
		sweep,
		{Name: "step", Title: "Step 0.7× → 3× → 0.7×", Segments: []Segment{
			{Name: "before", Dur: sec(10), Load: 0.7, Skip: sec(2), Measure: true},
			{Name: "high", Dur: sec(15), Load: 3, Measure: true},
			{Name: "after", Dur: sec(15), Load: 0.7, Measure: true},
		}},
		{Name: "capchange", Title: "Capacity change at 1.2× (request cost doubles at 10 s)", Settle: sec(5), Segments: []Segment{
			{Name: "before", Dur: sec(10), Load: 1.2, Skip: sec(2), Measure: true},
			{Name: "change", Dur: sec(8), Load: 1.2, CostX: 2, Measure: true},
			{Name: "converged", Dur: sec(12), Load: 1.2, CostX: 2, Measure: true},
		}},
		{Name: "burst", Title: "Tenant burst at 0.6× (the heavy tenant goes 5× for 10 s)", Segments: []Segment{
			{Name: "before", Dur: sec(5), Load: 0.6, Skip: sec(1), Measure: true},
			{Name: "burst", Dur: sec(10), Load: 0.6, HeavyX: 5, Measure: true},
			{Name: "after", Dur: sec(5), Load: 0.6, Measure: true},
		}},
		// A neighbour burns CPU on the server's CPU, outside its cgroup,
		// for the whole scenario: at half the capacity nothing should be
		// shed; at twice it, goodput should stay near the sweep's 2×.
		{Name: neighbourIdle, Title: "Idle server (0.5×) beside a CPU-burning neighbour", Neighbour: true, Segments: []Segment{
			{Name: "idle", Dur: sec(16), Load: 0.5, Skip: sec(2), Measure: true},
		}},
		{Name: neighbourOverload, Title: "Overload (2×) beside a CPU-burning neighbour", Neighbour: true, Segments: []Segment{
			{Name: "warm-up", Dur: sec(2), Load: 0.5},
			{Name: "overload", Dur: sec(16), Load: 2, Skip: sec(4), Measure: true},
		}},
		// 3× from clients that retry, first naively, then through package
		// throttle; short, since it runs against every variant: the first
		// segment, without retries, takes the server into shedding.
		{Name: retryStorm, Title: "Retry storm at 3×: no retries, naive retries, throttled", Segments: []Segment{
			{Name: stormBaseline, Dur: sec(2), Load: stormLoad, Skip: sec(1), Measure: true},
			{Name: clientNaive, Dur: sec(2), Load: stormLoad, Skip: sec(0.5), Measure: true, Client: clientNaive},
			{Name: clientThrottled, Dur: sec(3), Load: stormLoad, Skip: sec(1), Measure: true, Client: clientThrottled},
		}},
	}
}

// scenarioNames returns the names of the scenarios of a full or quick run,
// besides rejcost.
func scenarioNames(quick bool) []string {
	var ns []string
	for _, sc := range scenarios(quick) {
		ns = append(ns, sc.Name)
	}
	return ns
}

// wants reports whether the run includes the scenario called name: those
// asked for, else every one (a quick run: quickScenarios).
func (cfg Config) wants(name string) bool {
	switch {
	case len(cfg.Scenarios) > 0:
		return slices.Contains(cfg.Scenarios, name)
	case cfg.Quick:
		return slices.Contains(quickScenarios, name)
	}
	return true
}

// subcommand returns the hidden subcommand args name, if any: "server" (a
// server of the experiment) or "neighbour" (a CPU-burning neighbour).
func subcommand(args []string) (string, func([]string) error, bool) {
	if len(args) < 2 {
		return "", nil, false
	}
	switch args[1] {
	case "server":
		return args[1], serverMain, true
	case "neighbour":
		return args[1], neighbourMain, true
	}
	return "", nil, false
}

func loadName(l float64) string { return strconv.FormatFloat(l, 'f', -1, 64) + "×" }

func main() {
	if sub, run, ok := subcommand(os.Args); ok {
		if err := run(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "overload %s: %v\n", sub, err)
			os.Exit(1)
		}
		return
	}
	// go-zero, linked in for P2, logs its CPU statistics every minute.
	logx.Disable()
	cfg := Config{}
	flag.BoolVar(&cfg.Quick, "quick", false, "run a tiny version: two variants, two short scenarios and rejcost unless -variants and -scenarios say otherwise")
	flag.DurationVar(&cfg.Cost, "cost", 2*time.Millisecond, "CPU time of one Allocate")
	flag.DurationVar(&cfg.Deadline, "deadline", 500*time.Millisecond, "deadline of every call")
	flag.DurationVar(&cfg.SLO, "slo", 100*time.Millisecond, "latency within which an OK call counts as goodput")
	flag.Float64Var(&cfg.Quota, "quota", 0.9, "the server cgroup's CPU quota in CPUs (0: no cgroup)")
	flag.BoolVar(&cfg.Pin, "pin", true, "pin the server and the load generator to different CPUs with taskset")
	flag.BoolVar(&cfg.Cgroup, "cgroup", true, "run the server in its own cgroup with a CPU quota, where writable")
	flag.Float64Var(&cfg.Capacity, "capacity", 0, "skip the capacity measurement and use this many calls/s")
	flag.Float64Var(&cfg.ThrottleK, "throttle-k", 0, "K of the retry storm's throttled clients (0: the throttle's default, 2)")
	variants := flag.String("variants", "", "comma-separated variants (default: all this build can run; A,E with -quick)")
	scens := flag.String("scenarios", "", "comma-separated scenarios: "+strings.Join(append(scenarioNames(false), rejcostName), ", ")+" (default: all, or "+strings.Join(quickScenarios, ", ")+" with -quick; the capacity is measured unless -capacity is given)")
	flag.IntVar(&cfg.NeighbourWorkers, "neighbour-workers", neighbourWorkers, "spinning threads of the neighbour scenarios' CPU-burning neighbour")
	out := flag.String("out", "results/overload.json", "the results' summary (JSON), from which the report is rendered; the raw results, from which the charts are drawn, go to raw/ beside it; with -quick, a temporary directory unless set")
	md := flag.String("md", "../BENCHMARKS.md", "the report; with -quick, a temporary directory unless set")
	charts := flag.String("charts", "../docs/benchmarks", "directory of the charts; with -quick, a temporary directory unless set")
	render := flag.String("render", "", "re-render the report from these results, a summary or raw results, without running; raw results also rewrite the summary at -out and redraw the charts")
	matrix := flag.String("matrix", "", "run the scenario matrix instead of the scenarios: "+strings.Join(matrixNames, " or ")+"; its results replace the matrix of -out's results, if any, and keep the rest")
	cellList := flag.String("cells", "", "with -matrix, comma-separated cells to run (default: all of the matrix)")
	ghzPath := flag.String("ghz", "auto", "with -matrix, the ghz binary for the cells it drives: auto (on PATH, else in GOPATH/bin), off, or a path")
	ghzProto := flag.String("ghz-proto", "../proto/inventory/v1/inventory.proto", "with -matrix, the inventory proto that ghz reads")
	flag.Parse()

	if *render != "" {
		res, err := readResults(*render)
		if err == nil && res.raw() {
			err = writeSummary(res, *out)
		}
		if err == nil {
			err = renderAll(res, *md, *charts)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "overload:", err)
			os.Exit(1)
		}
		return
	}
	if *matrix != "" {
		os.Exit(matrixMain(cfg, *matrix, *cellList, *variants, *scens, *ghzPath, *ghzProto, *out, *md, *charts))
	}
	if cfg.Quick {
		// A quick run's figures mean nothing: unless told otherwise, keep
		// them away from the committed results and report.
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		dir := filepath.Join(os.TempDir(), "floodgate-overload-quick")
		if !set["out"] {
			*out = filepath.Join(dir, "overload.json")
		}
		if !set["md"] {
			*md = filepath.Join(dir, "BENCHMARKS.md")
		}
		if !set["charts"] {
			*charts = dir
		}
	}
	if cfg.Pin {
		pinSelf(1)
	}
	var err error
	if cfg.Variants, err = chooseVariants(*variants, cfg.Quick); err != nil {
		fmt.Fprintf(os.Stderr, "overload: %v\n", err)
		os.Exit(2)
	}
	if *scens != "" {
		cfg.Scenarios = strings.Split(*scens, ",")
		known := append(scenarioNames(false), rejcostName)
		for _, s := range cfg.Scenarios {
			if !slices.Contains(known, s) {
				fmt.Fprintf(os.Stderr, "overload: unknown scenario %q (known: %s)\n", s, strings.Join(known, ", "))
				os.Exit(2)
			}
		}
	}
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Log = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := experiment(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "overload:", err)
		os.Exit(1)
	}
	res.Command = "cd bench && go run ./cmd/overload " + strings.Join(os.Args[1:], " ")
	res.Command = strings.TrimSpace(res.Command)
	if prev, err := previous(*out); err == nil {
		res.Matrix = prev.Matrix
	}
	if err := save(res, *out, *md, *charts); err != nil {
		fmt.Fprintln(os.Stderr, "overload:", err)
		os.Exit(1)
	}
	cfg.Log("wrote %s, %s, %s and the charts in %s", *out, rawPath(*out), *md, *charts)
}

// rawPath returns where the raw results of the summary at out go: raw/
// beside it.
func rawPath(out string) string { return filepath.Join(filepath.Dir(out), "raw", filepath.Base(out)) }

// previous returns the results a run adds to: the raw results of the
// summary at out, or else the summary (a clone has only the summary).
func previous(out string) (*Results, error) {
	res, err := readResults(rawPath(out))
	if errors.Is(err, os.ErrNotExist) {
		res, err = readResults(out)
	}
	return res, err
}

// save writes res's summary to out and res to rawPath(out), then the
// report to md and the charts to charts.
func save(res *Results, out, md, charts string) error {
	if err := writeSummary(res, out); err != nil {
		return err
	}
	if err := writeResults(res, rawPath(out)); err != nil {
		return err
	}
	return renderAll(res, md, charts)
}

// matrixMain runs the scenario matrix called name and returns the exit
// code: it writes the results into those at out (see previous; new
// results when there are none), renders the report and prints the matrix
// table.
func matrixMain(cfg Config, name, cellList, variants, scens, ghzSetting, ghzProto, out, md, charts string) int {
	fail := func(code int, err error) int {
		fmt.Fprintln(os.Stderr, "overload:", err)
		return code
	}
	if cfg.Quick || scens != "" {
		return fail(2, errors.New("-matrix runs cells, not the scenarios: it takes neither -quick nor -scenarios"))
	}
	cells, err := matrixCells(name)
	if err == nil {
		cells, err = chooseCells(cells, cellList)
	}
	if err != nil {
		return fail(2, err)
	}
	if variants == "" {
		cfg.Variants = slices.DeleteFunc(slices.Clone(matrixVariants), func(v string) bool { return !runnable(v) })
	} else if cfg.Variants, err = chooseVariants(variants, false); err != nil {
		return fail(2, err)
	}
	if name == "quick" {
		// As -quick: unless told otherwise, keep a quick matrix away from
		// the committed results and report.
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		dir := filepath.Join(os.TempDir(), "floodgate-overload-matrix")
		if !set["out"] {
			out = filepath.Join(dir, "overload.json")
		}
		if !set["md"] {
			md = filepath.Join(dir, "BENCHMARKS.md")
		}
		if !set["charts"] {
			charts = dir
		}
	}
	mc := matrixConfig{Name: name, Cells: cells, GhzProto: ghzProto}
	if slices.ContainsFunc(cells, func(c Cell) bool { return c.Ghz }) {
		mc.Ghz, mc.GhzNote = findGhz(ghzSetting, ghzProto)
		if mc.Ghz != "" {
			if abs, err := filepath.Abs(ghzProto); err == nil {
				mc.GhzProto = abs
			}
		}
	}
	if cfg.Pin {
		pinSelf(1)
	}
	cfg.Seed = uint64(time.Now().UnixNano())
	cfg.Log = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	m, err := runMatrix(ctx, cfg, mc)
	if err != nil {
		return fail(1, err)
	}
	m.Command = strings.TrimSpace("cd bench && go run ./cmd/overload " + strings.Join(os.Args[1:], " "))
	res, err := previous(out)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return fail(1, fmt.Errorf("the results to add the matrix to: %w", err))
		}
		res = &Results{Config: cfg, Fits: map[string]Fit{}}
	}
	res.Matrix = m
	if err := save(res, out, md, charts); err != nil {
		return fail(1, err)
	}
	cfg.Log("wrote %s, %s and %s", out, rawPath(out), md)
	fmt.Print(m.Table())
	return 0
}

// fillDefaults sets what a run needs and cfg leaves out: a logger that
// discards, and this program as the command that starts a server.
func (cfg *Config) fillDefaults() error {
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	if len(cfg.Exe) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		cfg.Exe = []string{exe}
	}
	return nil
}

// experiment measures the capacity and runs every scenario against every
// variant. It cleans up its cgroups and server processes whatever happens.
func experiment(ctx context.Context, cfg Config) (*Results, error) {
	if err := cfg.fillDefaults(); err != nil {
		return nil, err
	}
	began := time.Now()
	res := &Results{
		Date:    began.UTC().Format("2006-01-02 15:04 MST"),
		Config:  cfg,
		Machine: machine(),
		Fits:    map[string]Fit{},
	}
	iso := detectIsolation(cfg.Pin, cfg.Cgroup, cfg.Quota)
	defer iso.removeCgroups()
	res.Isolation = iso
	cfg.Log("isolation: taskset=%q cgroup=%q quota=%v notes=%v", iso.Taskset, iso.CgroupCPU, iso.Quota, iso.Notes)

	// One calibration of the burn loop for every server.
	perIter := calibrateBurn()
	res.PerIterNs = int64(perIter)
	cfg.Log("burn loop: %v per iteration", perIter)

	sampler := "process"
	if iso.CgroupCPU != "" {
		sampler = "cgroup"
	}
	start := func(variant string, capacity float64) (*serverProc, error) {
		return startServer(ctx, iso, cfg.Exe, []string{
			"-variant", variant, "-cost", cfg.Cost.String(),
			"-capacity", strconv.FormatFloat(capacity, 'f', 2, 64), "-sampler", sampler,
			"-per-iter", perIter.String(),
		})
	}

	// Capacity.
	res.Capacity = cfg.Capacity
	if res.Capacity <= 0 {
		p, err := start("A", 0)
		if err != nil {
			return nil, fmt.Errorf("capacity server: %w", err)
		}
		res.Server = p.ready
		cfg.Log("server: %+v", p.ready)
		res.Capacity, res.CapSteps, err = measureCapacity(ctx, p, cfg)
		p.stop()
		if err != nil {
			return nil, fmt.Errorf("capacity: %w", err)
		}
	}
	cfg.Log("capacity: %.0f calls/s", res.Capacity)

	for _, sc := range scenarios(cfg.Quick) {
		if cfg.wants(sc.Name) {
			res.Scenarios = append(res.Scenarios, sc)
		}
	}
	// runOne runs scenario sc against a fresh server of variant v, with
	// the scenario's neighbour when it has one, and stops both whatever
	// happens.
	runOne := func(sc Scenario, v string) (Run, error) {
		var nb *neighbourProc
		if sc.Neighbour {
			var err error
			// The neighbour is already busy when the server starts.
			nb, err = startNeighbour(ctx, iso, cfg.Exe, max(cfg.NeighbourWorkers, 1), sc.Duration()+neighbourSlack)
			if err != nil {
				return Run{}, fmt.Errorf("neighbour: %w", err)
			}
			defer nb.stop()
		}
		p, err := start(v, res.Capacity)
		if err != nil {
			return Run{}, fmt.Errorf("server: %w", err)
		}
		defer p.stop()
		if res.Server.GRPC == "" {
			res.Server = p.ready
		}
		// Let the gate take its first readings of an idle server.
		time.Sleep(300 * time.Millisecond)
		raw, err := runScenario(ctx, p, sc, loadConfig{Capacity: res.Capacity, Deadline: cfg.Deadline, Seed: cfg.Seed, ThrottleK: cfg.ThrottleK})
		if err != nil {
			return Run{}, err
		}
		p.stop()
		run := analyse(raw, sc, v, p.ready, res.Capacity, cfg.SLO)
		if nb != nil {
			ns := nb.stop()
			run.Neighbour = &ns
		}
		return run, nil
	}
	for _, sc := range res.Scenarios {
		for _, v := range cfg.Variants {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			run, err := runOne(sc, v)
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w", sc.Name, v, err)
			}
			res.Runs = append(res.Runs, run)
			all := run.Windows[len(run.Windows)-1]
			cfg.Log("%s/%s: sent %.0f/s goodput %.0f/s rejected %.0f/s deadline %.0f/s p99 %.1f ms", sc.Name, v, all.Sent, all.Goodput, all.Rejected, all.Deadline, all.P99)
			if run.Wire {
				for _, w := range run.Windows[:len(run.Windows)-1] {
					cfg.Log("%s/%s %s: offered %.2f× on the wire %.2f× served OK %.2f× goodput %.2f× (× capacity), p99 %.1f ms", sc.Name, v, w.Name, w.Sent/res.Capacity, w.Wire/res.Capacity, w.OKRate/res.Capacity, w.Goodput/res.Capacity, w.P99)
				}
			}
		}
	}
	if cfg.wants(rejcostName) {
		for _, v := range cfg.Variants {
			if !slices.Contains(rejcostVariants, v) {
				continue
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			p, err := start(v, res.Capacity)
			if err != nil {
				return nil, fmt.Errorf("%s server for %s: %w", v, rejcostName, err)
			}
			if res.Server.GRPC == "" {
				res.Server = p.ready
			}
			time.Sleep(300 * time.Millisecond)
			rc, err := measureRejCost(ctx, p, iso, v, res.Capacity, cfg)
			p.stop()
			if err != nil {
				return nil, fmt.Errorf("%s/%s: %w", rejcostName, v, err)
			}
			res.RejCosts = append(res.RejCosts, rc)
			cfg.Log("%s/%s: idle %.3f CPU, %.0f µs per served call, %.1f µs per rejection (%d rejections, %d handlers), ratio %s",
				rejcostName, v, rc.IdleCPU, rc.PerServedUs, rc.PerRejectedUs, rc.phase("reject").Rej, rc.phase("reject").Handle, pct(rc.Ratio))
		}
	}
	for _, v := range cfg.Variants {
		var runs []Run
		for _, r := range res.Runs {
			if r.Variant == v {
				runs = append(runs, r)
			}
		}
		if len(runs) > 0 {
			res.Fits[v] = fitCPU(runs)
		}
	}
	res.Machine.LoadEnd = loadavg()
	res.Elapsed = time.Since(began).Seconds()
	return res, nil
}

// measureCapacity raises an open-loop load on a server without admission
// control, step by step, while the accepted calls' p99 stays within the
// SLO and at least 97% of calls succeed within it. The capacity is the
// highest goodput of a passing step, at most the step's offered rate: a
// window can count a few percent more calls than were offered on average
// (Poisson arrivals, a backlog from the step before), and a capacity above
// the load that passed is not one.
//
// A step is long enough to tell a rate the server sustains from one whose
// backlog has only begun to grow: 3% over the capacity queues about 0.15 s
// of work in five seconds, beyond the SLO. A short step passes
// a rate the server cannot hold, and a limiter told that rate (P1) then
// misses its deadlines. After the first failing step, two steps halve the
// interval between the last pass and the failure, to a step of 2%; a
// failure is repeated once before it counts, so that one
// unlucky second (a GC, another process) does not end the measurement low.
func measureCapacity(ctx context.Context, p *serverProc, cfg Config) (float64, []CapacityStep, error) {
	stepDur, skip, factor, maxSteps, refine := 5*time.Second, 2*time.Second, 1.08, 24, 2
	if cfg.Quick {
		stepDur, skip, factor, maxSteps, refine = 600*time.Millisecond, 200*time.Millisecond, 1.5, 2, 0
	}
	budget := p.ready.Budget
	if budget <= 0 {
		budget = 1
	}
	r := 0.6 * budget / cfg.Cost.Seconds()
	if cfg.Quick {
		r = 0.15 * budget / cfg.Cost.Seconds() // a quick run may be under the race detector
	}
	var steps []CapacityStep
	step := func(r float64) (bool, float64, error) {
		sc := Scenario{Name: "capacity", Segments: []Segment{{Name: "step", Dur: stepDur, Load: r, Skip: skip, Measure: true}}}
		raw, err := runScenario(ctx, p, sc, loadConfig{Capacity: 1, Deadline: cfg.Deadline, Seed: cfg.Seed, ThrottleK: cfg.ThrottleK})
		if err != nil {
			return false, 0, err
		}
		w := raw.window("step", skip, stepDur, r, cfg.SLO)
		pass := w.P99 >= 0 && w.P99 <= float64(cfg.SLO)/float64(time.Millisecond) && w.Goodput >= 0.97*w.Sent
		steps = append(steps, CapacityStep{Rate: r, Window: w, Pass: pass})
		cfg.Log("capacity step %.0f/s: goodput %.0f/s p99 %.1f ms pass=%v", r, w.Goodput, w.P99, pass)
		// Let a failed step's backlog drain before the next.
		time.Sleep(map[bool]time.Duration{true: 200 * time.Millisecond, false: time.Second}[pass])
		return pass, min(w.Goodput, r), nil
	}
	best, passed, failed, retries, repeated := 0.0, 0.0, 0.0, 0, false
	for range maxSteps {
		pass, good, err := step(r)
		if err != nil {
			return 0, steps, err
		}
		if !pass && best == 0 && retries < 3 {
			// The start was already too much for this machine (other work
			// on it, a smaller quota): start lower.
			retries++
			r *= 0.6
			continue
		}
		if !pass && !repeated {
			repeated = true
			continue
		}
		if !pass {
			failed = r
			break
		}
		best, passed, repeated = max(best, good), r, false
		r *= factor
	}
	for range refine {
		if failed == 0 || passed == 0 {
			break
		}
		r = math.Sqrt(passed * failed)
		pass, good, err := step(r)
		if err != nil {
			return 0, steps, err
		}
		if pass {
			best, passed = max(best, good), r
		} else {
			failed = r
		}
	}
	if best == 0 && cfg.Quick && len(steps) > 0 {
		// A quick run only needs a plausible figure.
		best = max(steps[0].Window.Goodput, steps[0].Rate/4)
	}
	if best == 0 {
		return 0, steps, errors.New("not even the first step met the SLO")
	}
	return best, steps, nil
}
