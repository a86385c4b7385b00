package main

import (
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	fgplot "github.com/floodgate-go/floodgate/internal/plot"
	"github.com/floodgate-go/floodgate/throttle"
)

// notesFile, when it exists next to the charts, is appended to the report:
// the discussion of a run that the numbers alone do not give.
const notesFile = "overload-notes.md"

// Targets of variant E, the new default.
const (
	targetGoodput   = 0.95 // of the measured capacity, at every overloaded sweep point
	targetReversals = 2.0  // per minute, at steady load
	targetShed      = 1.0  // seconds
	targetRecover   = 5.0  // seconds
	targetLight     = 0.99 // light tenants' success in the burst
	targetHeavy     = 0.95 // of the heavy tenant's max-min fair share in the burst
	targetRejCost   = 0.01 // a rejection's CPU over a served request's
	// The retry storm, with throttled clients: the attempts on the wire,
	// × the measured capacity, and the calls served OK, as a share of E's
	// at the same load without retries.
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

func (res *Results) run(scenario, variant string) *Run {
	for i := range res.Runs {
		if res.Runs[i].Scenario == scenario && res.Runs[i].Variant == variant {
			return &res.Runs[i]
		}
	}
	return nil
}

func (r *Run) window(name string) *Window {
	if r == nil {
		return nil
	}
	for i := range r.Windows {
		if r.Windows[i].Name == name {
			return &r.Windows[i]
		}
	}
	return nil
}

func (res *Results) variants() []string {
	var vs []string
	for _, v := range allVariants {
		in := slices.ContainsFunc(res.Runs, func(r Run) bool { return r.Variant == v }) ||
			slices.ContainsFunc(res.RejCosts, func(rc RejCost) bool { return rc.Variant == v })
		if in {
			vs = append(vs, v)
		}
	}
	return vs
}

func (res *Results) hasScenario(name string) bool {
	return slices.ContainsFunc(res.Runs, func(r Run) bool { return r.Scenario == name })
}

// scenario returns the scenario called name, nil when the run has none.
func (res *Results) scenario(name string) *Scenario {
	for i := range res.Scenarios {
		if res.Scenarios[i].Name == name {
			return &res.Scenarios[i]
		}
	}
	return nil
}

// changeAt returns the capacity change's time and cost factor, from its
// scenario: the first segment that multiplies the cost.
func (sc *Scenario) changeAt() (time.Duration, float64, bool) {
	if sc == nil {
		return 0, 0, false
	}
	for i, s := range sc.Segments {
		if s.CostX > 1 {
			return sc.segmentStart(i), s.CostX, true
		}
	}
	return 0, 0, false
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

// renderAll writes the report and the charts.
func renderAll(res *Results, mdPath, chartDir string) error {
	charts, err := writeCharts(res, chartDir)
	if err != nil {
		return err
	}
	rel := func(p string) string {
		r, err := filepath.Rel(filepath.Dir(mdPath), p)
		if err != nil {
			return p
		}
		return filepath.ToSlash(r)
	}
	var b strings.Builder
	res.markdown(&b, charts, rel)
	if notes, err := os.ReadFile(filepath.Join(chartDir, notesFile)); err == nil {
		b.WriteString("\n")
		b.Write(notes)
	}
	return os.WriteFile(mdPath, []byte(b.String()), 0o644)
}

func (res *Results) markdown(b *strings.Builder, charts map[string]string, rel func(string) string) {
	f := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	cap := res.Capacity
	vs := res.variants()
	if len(res.Runs) == 0 && len(res.RejCosts) == 0 && res.Matrix != nil {
		f("# Overload experiment\n\n")
		f("The scenario matrix of floodgate's overload experiment alone: real gRPC over loopback TCP against the inventory service (`proto/inventory/v1`), under open-loop Poisson load from %d tenants. Source: `bench/cmd/overload`.\n\n", numTenants)
		res.Matrix.markdown(b)
		return
	}

	f("# Overload experiment\n\n")
	f("floodgate's headline result: how the admission-control variants below keep a gRPC server's goodput under overload. ")
	f("Real gRPC over loopback TCP against the inventory service (`proto/inventory/v1`) whose `Allocate` burns %v of CPU (the calibrated SHA-256 loop of `internal/burn`), ", res.Config.Cost)
	f("under open-loop Poisson load from %d tenants (tenant-0 sends half of the traffic, the other nine share the rest equally), ", numTenants)
	f("a %v deadline on every call and no retries, and a `grpc.health.v1` probe once a second. ", res.Config.Deadline)
	f("Goodput is calls per second that ended OK within the SLO of %v. ", res.Config.SLO)
	f("Source: `bench/cmd/overload`; raw results: `bench/results/overload.json`.\n\n")
	if res.Config.Quick {
		f("**This is a `-quick` run: too short for its figures to mean anything.**\n\n")
	}
	f("```sh\n%s\n```\n\n", res.Command)
	f("Re-render this file and the charts from the JSON without running: `cd bench && go run ./cmd/overload -render results/overload.json`.\n\n")

	f("## Run\n\n")
	f("| | |\n|---|---|\n")
	f("| date | %s |\n", res.Date)
	f("| duration | %.1f min |\n", res.Elapsed/60)
	f("| machine | %d CPUs, %s, %s, %s, kernel %s |\n", res.Machine.CPUs, res.Machine.Model, res.Machine.Go, res.Machine.OS, res.Machine.Kernel)
	f("| load average | %s at the start, %s at the end |\n", res.Machine.LoadAvg, res.Machine.LoadEnd)
	iso := res.Isolation
	if iso != nil && iso.Taskset != "" {
		f("| pinning | applied: server on CPU %d, load generator on CPU %d (`taskset`) |\n", iso.ServerCPU, iso.LoadCPU)
	} else {
		f("| pinning | not applied: server and load generator share the CPUs |\n")
	}
	if iso != nil && iso.Quota > 0 {
		f("| cgroup | applied: the server runs in its own cgroup v1 (`cpu` and `cpuacct`), CFS quota %.2f CPU (%d µs per %d µs), cpu.shares %d |\n", iso.Quota, int(iso.Quota*float64(iso.PeriodUs)), iso.PeriodUs, iso.Shares)
	} else {
		f("| cgroup | not applied: no CPU quota |\n")
	}
	if iso != nil && iso.LoadCgroup != "" {
		f("| load generator | in its own cgroup v1 (`cpu`), cpu.shares %d, no quota |\n", iso.Shares)
	}
	if iso != nil && len(iso.Notes) > 0 {
		f("| notes | %s |\n", strings.Join(iso.Notes, "; "))
	}
	f("| CPU limit the gate detected | **%.2f CPU** (sampler `%s`; server GOMAXPROCS %d, affinity %d CPU) |\n", res.Server.Budget, res.Server.Source, res.Server.GOMAXPROCS, res.Server.Affinity)
	f("| burn loop | %d ns per SHA-256 iteration, calibrated once by the load generator and shared by every server |\n", res.PerIterNs)
	f("| measured capacity | **%.0f calls/s** |\n\n", cap)

	f("%s", capacityMethod(res.CapSteps, res.Config.Quick))
	f("Every offered load below is a multiple of it.\n\n")
	if len(res.CapSteps) > 0 {
		f("<details><summary>capacity steps</summary>\n\n| offered/s | goodput/s | p99 ms | pass |\n|---:|---:|---:|---|\n")
		for _, s := range res.CapSteps {
			f("| %.0f | %.0f | %s | %v |\n", s.Rate, s.Window.Goodput, num(s.Window.P99, 1), s.Pass)
		}
		f("\n</details>\n\n")
	}

	f("## Variants\n\n| | admission control |\n|---|---|\n")
	for _, v := range vs {
		f("| %s | %s |\n", v, variantNames[v])
	}
	f("\nB, C, D and E use floodgate's middleware as a user would (`middleware.New` over a `keyed` store, a static tenant table, API keys in `x-api-key`; C and D add `middleware.WithGate` as `examples/multitenant` does, with the tap handle at its default: while the gate sheds, it rejects callers still inside a retry delay before their request is read). ")
	f("E adds `middleware.WithOverload(ctrl)` instead, with `ctrl` from `overload.New(overload.WithGuard(gate))` and the controller's default law: a call its tenant's quota admits then takes one of the controller's slots while its handler runs, waits briefly for one, or is shed with UNAVAILABLE (the middleware's overload code) and a retry delay; while the controller's queue is full, the tap handle turns away callers over their share before their request is read. The gate (cpugate's defaults) is only the controller's guard: its CPU readings go into the controller's snapshots, its scale into nothing. ")
	f("Quotas (calls/s): the heavy tenant %.1f × its share of capacity (%.0f/s); each light tenant %.0f × its share (%.0f/s), so that even at Fixed's factor (0.2) a light tenant's quota covers its traffic at 0.8× capacity, in the spirit of `testdata/multitenant/tenants.yaml`'s steady tenants; every bucket holds %.1f s of its rate. ",
		heavyHeadroom, quota(heavyTenant, cap), lightHeadroom, quota(1, cap), burstSeconds)
	f("P1's limiter is `rate.NewLimiter(capacity, capacity/10)` behind `ratelimit.UnaryServerInterceptor`; P2 is `load.NewAdaptiveShedder()` with go-zero's defaults (CPU threshold 90%%, 5 s window) wrapped as zrpc's shedding interceptor does. ")
	if slices.Contains(vs, "P3") {
		f("P3 is aegis' `bbr.NewLimiter()` with its defaults (a 10 s window of 100 buckets, CPU threshold 800‰) wrapped as kratos v2's `ratelimit.Server` middleware wraps it: `Allow()`, the handler, then `done(DoneInfo{Err: err})`. kratos rejects with its `ErrLimitExceed` (HTTP 429, reason `RATELIMIT`), which its errors turn into RESOURCE_EXHAUSTED on gRPC, as here. BBR drops a call only while its CPU reading (a moving average updated every 500 ms with decay 0.95) is at or above 80%% and its in-flight count exceeds its estimate of the maximum (the highest pass rate of a bucket × the lowest mean latency of a bucket), and for a second after such a drop. ")
	}
	if slices.Contains(vs, "P2") || slices.Contains(vs, "P3") {
		f("On cgroup v1 both go-zero (P2) and aegis (P3) read the root cgroup: go-zero reads `/sys/fs/cgroup/cpuacct` and `/sys/fs/cgroup/cpu` at their roots whatever the process's cgroup path, and aegis takes any cgroup path other than `/` for a container's and reads the hierarchy's root as well. ")
		if iso != nil && iso.Quota > 0 {
			f("Here, with the server in a cgroup of its own, both measure the whole machine (%d CPUs) rather than the server against its %.2f-CPU quota; in a container with its own cgroup namespace they would read their own cgroup, which this experiment does not show. ", res.Machine.CPUs, iso.Quota)
		} else {
			f("This run put the server in no cgroup, so they read the machine, as the server's sampler does. ")
		}
		f("Both readings are moving averages that start at 0 in a fresh process, go-zero's updated every 250 ms and aegis' every 500 ms, both with decay 0.95: they reach 63%% of a steady CPU use after about 5 s and 10 s. Every scenario starts a fresh server, so in the shorter scenarios they read less than the CPU in use, aegis' most. ")
	}
	if slices.Contains(vs, "P4") {
		f("P4 is platinummonkey/go-concurrency-limits, wired as its README and gRPC example wire it: `limit.NewDefaultGradient2Limit` (initial limit 20, minimum 20, maximum 200, queue size 4, smoothing 0.2) in a `limiter.NewDefaultLimiter` with the package's default windows (1 s, at least 100 samples, round trips under 100 µs ignored) and a `SimpleStrategy`, behind `grpc.UnaryServerInterceptor(grpc.WithLimiter(...))` with its default classifiers: a call over the limit is rejected with RESOURCE_EXHAUSTED, a handler error counts as a drop. It was built out of tree, from a copy of this bench that registers it (`outOfTree` in `cmd/overload/main.go`) beside a checkout of the module (commit `%s`), because %s. ", p4Commit, unavailableVariants["P4"].Why)
	}
	for _, v := range slices.Sorted(maps.Keys(unavailableVariants)) {
		if u := unavailableVariants[v]; !slices.Contains(vs, v) {
			f("%s, %s, is not in this experiment: %s. ", v, u.What, u.Why)
		}
	}
	f("Every variant exempts the health service (the middleware by default, the peers through go-grpc-middleware's `selector`). ")
	f("Rejections are the calls that end RESOURCE_EXHAUSTED or UNAVAILABLE. ")
	f("A and B run the same gate for its CPU reading only. One fresh server process per scenario and variant; the scenarios run one after another, each against every variant in turn, so that drifting background load spreads over all variants.\n\n")

	res.targets(b)

	if r := res.run("sweep", "A"); r != nil || res.hasScenario("sweep") {
		f("## Sweep\n\n")
		f("Each load held %s; figures from the last %s of each (the first seconds are the transition).\n\n", "7 s", "5 s")
		if c, ok := charts["sweep"]; ok {
			f("![goodput against offered load](%s)\n\n", rel(c))
		}
		loads := res.sweepLoads()
		// table writes one row per variant and one column per load.
		table := func(title string, cell func(w *Window) string) {
			f("%s\n\n| variant |", title)
			for _, l := range loads {
				f(" %s |", loadName(l))
			}
			f("\n|---|")
			for range loads {
				f("---:|")
			}
			f("\n")
			for _, v := range vs {
				r := res.run("sweep", v)
				f("| %s |", v)
				for _, l := range loads {
					if w := r.window(loadName(l)); w != nil {
						f(" %s |", cell(w))
					} else {
						f(" – |")
					}
				}
				f("\n")
			}
		}
		table("Goodput, calls/s (% of the measured capacity):", func(w *Window) string {
			return fmt.Sprintf("%.0f (%.0f%%)", w.Goodput, 100*w.Goodput/cap)
		})
		f("\n")
		table("Accepted latency p50 / p99 / p99.9, ms:", func(w *Window) string {
			return num(w.P50, 1) + " / " + num(w.P99, 0) + " / " + num(w.P999, 0)
		})
		f("\n")
		table("Rejections and deadlines per second, and the server's CPU use (CPUs):", func(w *Window) string {
			return fmt.Sprintf("%.0f rej, %.0f late, %s CPU", w.Rejected, w.Deadline, num(nonzero(w.ServerCPU), 2))
		})
		f("\n")
	}

	if res.hasScenario("step") {
		f("## Step 0.7× → 3× → 0.7×\n\n")
		if c, ok := charts["step"]; ok {
			f("![step timeline](%s)\n\n", rel(c))
		}
		f("| variant | goodput/s, whole run | at 3× | p99 at 3×, ms | deadline exceeded/s at 3× | time to shed | time to recover | reversals/min | health probes |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, v := range vs {
			r := res.run("step", v)
			if r == nil {
				continue
			}
			all, hi := r.window("all"), r.window("high")
			f("| %s | %.0f | %.0f | %s | %.1f | %s | %s | %.1f | %d/%d |\n", v, all.Goodput, hi.Goodput, num(hi.P99, 0), hi.Deadline, secs(r.ShedS), secs(r.RecoverS), r.Reversals, all.HealthOK, all.HealthSent)
		}
		f("\nTime to shed: from the step up to the first second in which, in every quarter second, no call exceeded its deadline and the accepted p99 was within the SLO. Time to recover: from the step down to the first two seconds in which, in every quarter second, at least 99%% of calls succeeded within the SLO. %s\n\n", reversalsDef)
	}

	if res.hasScenario("capchange") {
		f("## Capacity change at 1.2× load\n\n")
		f("The offered load stays at 1.2× the measured capacity; at 10 s the server's request cost doubles (a signal to the server), halving its capacity.\n\n")
		if c, ok := charts["capchange"]; ok {
			f("![capacity-change timeline](%s)\n\n", rel(c))
		}
		sc := res.scenario("capchange")
		at, costX, _ := sc.changeAt()
		newCap := res.Capacity / max(costX, 1)
		settle := time.Duration(0)
		if sc != nil {
			settle = sc.Settle
		}
		f("| variant | goodput/s, whole run | before (2–10 s) | change (10–18 s) | converged (18–30 s) | from %v after the change, %% of the new capacity | time to %.0f%% of the new capacity | p99 converged, ms | deadline exceeded/s converged | reversals/min | health probes |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", settle, 100*capTarget)
		for _, v := range vs {
			r := res.run("capchange", v)
			if r == nil {
				continue
			}
			all, be, ch, co := r.window("all"), r.window("before"), r.window("change"), r.window("converged")
			settled := "–"
			if w := r.window(settledWindow); w != nil {
				settled = fmt.Sprintf("%.0f (%.0f%%)", w.Goodput, 100*w.Goodput/newCap)
			}
			f("| %s | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %.1f | %.1f | %d/%d |\n", v, all.Goodput, be.Goodput, ch.Goodput, co.Goodput, settled, secs(r.CapS), num(co.P99, 0), co.Deadline, r.Reversals, all.HealthOK, all.HealthSent)
		}
		f("\nThe new capacity is the measured capacity over the cost factor: %.0f calls/s. Time to %.0f%% of it: from the change (at %v) to the first of %d whole seconds in a row whose goodput each reached %.0f%% of it.\n\n", newCap, 100*capTarget, at, capSustain, 100*capTarget)
	}

	if res.hasScenario("burst") {
		f("## Tenant burst\n\n")
		f("0.6× capacity throughout; from 5 s to 15 s the heavy tenant sends 5× its rate (1.5× capacity on its own).\n\n")
		if c, ok := charts["burst"]; ok {
			f("![tenant-burst timeline](%s)\n\n", rel(c))
		}
		f("| variant | light tenants' success in the burst | light tenants' p99, ms | heavy tenant's success | heavy tenant's goodput/s (%% of its fair share) | Jain's index, success ratios | Jain's index, shares of fair share | goodput/s in the burst | p99 in the burst, ms | health probes |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, v := range vs {
			r := res.run("burst", v)
			if r == nil {
				continue
			}
			w, all := r.window("burst"), r.window("all")
			f("| %s | %s | %s | %s | %s | %s | %s | %.0f | %s | %d/%d |\n", v, pct(w.LightSuccess), num(w.LightP99, 0), pct(w.HeavySuccess), heavyFairShare(w, res.Capacity), num(w.Jain, 3), num(w.FairJain, 3), w.Goodput, num(w.P99, 0), all.HealthOK, all.HealthSent)
		}
		f("\nSuccess: calls OK within the SLO over calls sent. The first Jain's index is over the ten tenants' success ratios. The second is over each tenant's goodput as a share of its max-min fair share of the measured capacity given what it sent (every tenant that asks for less than an equal split of what is left gets all it asks; the others split the rest equally), capped at 1: 1 when every tenant got at least its fair share. In the burst the light tenants' fair share is all they send and the heavy tenant's the rest of the capacity.\n\n")
	}

	if res.hasScenario(neighbourIdle) || res.hasScenario(neighbourOverload) {
		res.neighbourSection(b, charts, rel)
	}

	if res.hasScenario(retryStorm) {
		res.retryStormSection(b, charts, rel)
	}

	f("## Cost of a rejection\n\n")
	res.rejCostSection(b)
	f("### Estimates from the other scenarios\n\n")
	f("The server's CPU time per second is fitted by least squares over every second of a variant's runs (all scenarios, the first second of each left out): CPU = a × handlers entered + b × rejections + c. ")
	f("Rejection latency is the client-side latency of rejected calls in the sweep's 4× window.\n\n")
	f("| variant | seconds fitted | CPU per served call (a) | CPU per rejection (b) | b / a | idle CPU (c) | rejection latency p50 / p99 at 4×, ms |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, v := range vs {
		ft, ok := res.Fits[v]
		if !ok {
			continue
		}
		rl := "–"
		if w := res.run("sweep", v).window(loadName(4)); w != nil && w.RejP50 >= 0 {
			rl = num(w.RejP50, 2) + " / " + num(w.RejP99, 2)
		}
		if ft.Ratio < 0 && ft.PerServedMs == 0 {
			f("| %s | %d | – | – | – | – | %s |\n", v, ft.N, rl)
			continue
		}
		f("| %s | %d | %.3f ms | %.1f µs | %s | %.3f CPU | %s |\n", v, ft.N, ft.PerServedMs, ft.PerRejectedUs, pct(ft.Ratio), ft.IdleCPU, rl)
	}
	f("\nThe regression is at the mercy of the machine's other work, second by second. A steadier estimate from the sweep alone: a = server CPU per handler entered at 0.5× (where nothing is rejected; it includes the server's fixed costs, spread over its calls), then b = (CPU − a × handlers) / rejections at 4×:\n\n")
	f("| variant | CPU per served call | CPU per rejection | ratio |\n|---|---:|---:|---:|\n")
	for _, v := range vs {
		if rc, ok := res.rejectionCost(v); ok {
			f("| %s | %.3f ms | %.1f µs | %s |\n", v, rc.PerServedMs, rc.PerRejectedUs, pct(rc.Ratio))
		} else {
			f("| %s | – | – | – |\n", v)
		}
	}
	f("\nA variant that rejects nothing or little here (A, B, and the CPU-driven peers while their reading stays low) has its b absent or noise.\n\n")

	f("## Health probes, all scenarios\n\n| variant | probes OK |\n|---|---:|\n")
	for _, v := range vs {
		ok, n := res.health(v)
		f("| %s | %d/%d (%s) |\n", v, ok, n, pct(ratio(ok, n)))
	}
	f("\n")
	if res.Matrix != nil {
		res.Matrix.markdown(b)
	}
}

func (res *Results) health(v string) (ok, n int) {
	for _, r := range res.Runs {
		if r.Variant == v {
			w := r.window("all")
			ok += w.HealthOK
			n += w.HealthSent
		}
	}
	return ok, n
}

func (res *Results) sweepLoads() []float64 {
	for _, sc := range res.Scenarios {
		if sc.Name == "sweep" {
			var ls []float64
			for _, s := range sc.Segments {
				if s.Measure {
					ls = append(ls, s.Load)
				}
			}
			return ls
		}
	}
	return nil
}

// reversalsDef says what the reversals columns count.
const reversalsDef = "Reversals: for C and D, changes of direction of the gate's scale, each counted; for E, changes of direction of the controller's admission rate (what sheds calls when they queue before the controller, as in this CPU-bound server), or of its concurrency limit while no rate is set, read every 250 ms, each counted once the value has moved back from its last peak (or trough) by a quarter of it, so that the ripple of a few percent at every control interval is not a reversal but a swing an operator would see on a dashboard is; a rate set or lifted is not a reversal; none for the variants without either."

// heavyFairShare returns the heavy tenant's goodput and its share of its
// max-min fair share, for the burst table.
func heavyFairShare(w *Window, capacity float64) string {
	if len(w.TenantSent) != numTenants {
		return "–"
	}
	fair := maxMinFair(capacity, w.TenantSent)[heavyTenant]
	if fair <= 0 {
		return fmt.Sprintf("%.0f", w.TenantGood[heavyTenant])
	}
	return fmt.Sprintf("%.0f (%.0f%%)", w.TenantGood[heavyTenant], 100*w.TenantGood[heavyTenant]/fair)
}

// steadyWindows are the windows of constant offered load and cost, by
// scenario, over which reversals are counted against their target; nil
// takes every measured window of the scenario.
var steadyWindows = map[string][]string{
	"sweep":           nil,
	"capchange":       {"converged"},
	neighbourIdle:     {"idle"},
	neighbourOverload: {"overload"},
}

// targets writes the targets of the new default, E, met or missed and by
// how much.
func (res *Results) targets(b *strings.Builder) {
	f := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	const v = targetVariant
	if !slices.ContainsFunc(res.Runs, func(r Run) bool { return r.Variant == v }) {
		return
	}
	f("## Targets for E, the new default\n\n| target | measured | |\n|---|---|---|\n")
	// row writes a target's row; a target missed is missed by "by" (a
	// margin) or, when that starts with ": ", for the reason that follows.
	row := func(target, measured string, met bool, by string) {
		verdict := "met"
		switch {
		case !met && by == "":
			verdict = "**missed**"
		case !met && strings.HasPrefix(by, ": "):
			verdict = "**missed**" + by
		case !met:
			verdict = "**missed** by " + by
		}
		f("| %s | %s | %s |\n", target, measured, verdict)
	}
	slo := float64(res.Config.SLO) / float64(time.Millisecond)
	p99ok := func(p float64) bool { return p >= 0 && p <= slo }
	p99by := func(p float64) string {
		if p < 0 {
			return "no call accepted"
		}
		return fmt.Sprintf("p99 %.1f ms over", p-slo)
	}

	// Goodput and latency under overload.
	if sweep := res.run("sweep", v); sweep != nil {
		for _, l := range overloadLoads {
			w := sweep.window(loadName(l))
			if w == nil {
				continue
			}
			got := w.Goodput / res.Capacity
			var by []string
			if got < targetGoodput {
				by = append(by, fmt.Sprintf("%.1f points", 100*(targetGoodput-got)))
			}
			if !p99ok(w.P99) {
				by = append(by, p99by(w.P99))
			}
			row(fmt.Sprintf("goodput at %s ≥ %.0f%% of the measured capacity, accepted p99 within the SLO (%v)", loadName(l), 100*targetGoodput, res.Config.SLO),
				fmt.Sprintf("%.0f/s = %.1f%% of %.0f/s; p99 %s ms", w.Goodput, 100*got, res.Capacity, num(w.P99, 1)),
				len(by) == 0, strings.Join(by, "; "))
		}
	}

	// The capacity change.
	if r := res.run("capchange", v); r != nil {
		sc := res.scenario("capchange")
		_, costX, ok := sc.changeAt()
		if w := r.window(settledWindow); ok && w != nil {
			newCap := res.Capacity / costX
			got := w.Goodput / newCap
			row(fmt.Sprintf("after the request cost doubles, goodput ≥ %.0f%% of the new capacity (%.0f/s) within %v of the change", 100*capTarget, newCap, sc.Settle),
				fmt.Sprintf("%.0f/s = %.1f%% from %v after the change to the end; %.0f%% first held for %d s in a row %s after the change", w.Goodput, 100*got, sc.Settle, 100*capTarget, capSustain, secs(r.CapS)),
				got >= capTarget, fmt.Sprintf("%.1f points", 100*(capTarget-got)))
		}
	}

	// Shedding and recovery.
	if r := res.run("step", v); r != nil {
		row(fmt.Sprintf("time to shed ≤ %.0f s", targetShed), secs(r.ShedS), r.ShedS >= 0 && r.ShedS <= targetShed, func() string {
			if r.ShedS < 0 {
				return ": it never shed cleanly while at 3×"
			}
			return fmt.Sprintf("%.2f s", r.ShedS-targetShed)
		}())
		row(fmt.Sprintf("recovery ≤ %.0f s", targetRecover), secs(r.RecoverS), r.RecoverS >= 0 && r.RecoverS <= targetRecover, func() string {
			if r.RecoverS < 0 {
				return ": it did not recover after the step down"
			}
			return fmt.Sprintf("%.2f s", r.RecoverS-targetRecover)
		}())
	}

	// Reversals at steady load.
	n, secsSteady, worst, worstRate := 0, 0.0, "", -1.0
	for _, r := range res.Runs {
		names, ok := steadyWindows[r.Scenario]
		if r.Variant != v || !ok {
			continue
		}
		for _, w := range r.Windows {
			if w.Name == "all" || w.Name == settledWindow || (names != nil && !slices.Contains(names, w.Name)) || w.To <= w.From {
				continue
			}
			n += w.Reversals
			secsSteady += w.To - w.From
			if rate := float64(w.Reversals) / ((w.To - w.From) / 60); rate > worstRate {
				worstRate, worst = rate, fmt.Sprintf("%s %s: %d in %.0f s", r.Scenario, w.Name, w.Reversals, w.To-w.From)
			}
		}
	}
	if secsSteady > 0 {
		rate := float64(n) / (secsSteady / 60)
		row(fmt.Sprintf("≤ %.0f reversals of the admission rate or concurrency limit per minute at steady load", targetReversals),
			fmt.Sprintf("%d in %.0f s of steady load = %.1f/min%s", n, secsSteady, rate, func() string {
				if n == 0 {
					return ""
				}
				return " (most: " + worst + ")"
			}()),
			rate <= targetReversals, fmt.Sprintf("%.1f/min", rate-targetReversals))
	}

	// The tenant burst.
	if r := res.run("burst", v); r != nil {
		w := r.window("burst")
		var by []string
		if w.LightSuccess < targetLight {
			by = append(by, fmt.Sprintf("%.2f points", 100*(targetLight-w.LightSuccess)))
		}
		if !p99ok(w.LightP99) {
			by = append(by, p99by(w.LightP99))
		}
		row(fmt.Sprintf("tenant burst: light tenants ≥ %.0f%% success, their p99 within the SLO", 100*targetLight),
			fmt.Sprintf("%s; p99 %s ms", pct(w.LightSuccess), num(w.LightP99, 1)), len(by) == 0, strings.Join(by, "; "))
		if len(w.TenantSent) == numTenants {
			fair := maxMinFair(res.Capacity, w.TenantSent)[heavyTenant]
			got := -1.0
			if fair > 0 {
				got = w.TenantGood[heavyTenant] / fair
			}
			row(fmt.Sprintf("tenant burst: the heavy tenant gets the rest of the capacity (≥ %.0f%% of its max-min fair share)", 100*targetHeavy),
				fmt.Sprintf("%.0f/s of its fair share %.0f/s: %s; Jain's index over the shares of fair share %s (over the success ratios %s)", w.TenantGood[heavyTenant], fair, pct(got), num(w.FairJain, 3), num(w.Jain, 3)),
				got >= targetHeavy, fmt.Sprintf("%.1f points", 100*(targetHeavy-got)))
		}
	}

	// The neighbour.
	if r := res.run(neighbourIdle, v); r != nil {
		all := r.window("all")
		total := 0
		for _, s := range r.Seconds {
			total += s.Sent
		}
		row("idle server + neighbour: 0 calls shed",
			fmt.Sprintf("%d of %d calls rejected, %d past their deadline; goodput %.0f/s, p99 %s ms", all.Rejections, total, all.Deadlines, all.Goodput, num(all.P99, 1)),
			all.Rejections == 0, fmt.Sprintf("%d calls", all.Rejections))
	}

	// The retry storm.
	if r := res.run(retryStorm, v); r.window(clientThrottled) != nil {
		w := r.window(clientThrottled)
		wire := w.Wire / res.Capacity
		m := fmt.Sprintf("throttled: on the wire %.2f× capacity (naive: %s; no retries: %s); served OK %.0f/s = %.2f× capacity",
			wire, stormWire(r.window(clientNaive), res.Capacity), stormWire(r.window(stormBaseline), res.Capacity), w.OKRate, w.OKRate/res.Capacity)
		var by []string
		if wire > targetStormWire {
			by = append(by, fmt.Sprintf("%.2f× capacity on the wire", wire-targetStormWire))
		}
		target := fmt.Sprintf("retry storm at %s: with throttled clients, ≤ %.1f× capacity on the wire, and calls served OK ≥ %.0f%% of E's at %s without retries (the sweep's: the shedding controller's level)", loadName(stormLoad), targetStormWire, 100*targetStormOK, loadName(stormLoad))
		ref, from := res.stormReference(v)
		if ref == nil || ref.OKRate <= 0 {
			f("| %s | %s; nothing served OK without retries to compare with | **undetermined** |\n", target, m)
		} else {
			m += fmt.Sprintf(", %s of the %.0f/s without retries (%s; goodput there %.0f/s)", pct(w.OKRate/ref.OKRate), ref.OKRate, from, ref.Goodput)
			if w.OKRate < targetStormOK*ref.OKRate {
				by = append(by, fmt.Sprintf("%.1f points served OK", 100*(targetStormOK-w.OKRate/ref.OKRate)))
			}
			row(target, m, len(by) == 0, strings.Join(by, "; "))
		}
	}

	// Health probes, scenario by scenario.
	var missed []string
	okAll, nAll := 0, 0
	for _, r := range res.Runs {
		if r.Variant != v {
			continue
		}
		w := r.window("all")
		okAll += w.HealthOK
		nAll += w.HealthSent
		if w.HealthOK < w.HealthSent {
			missed = append(missed, fmt.Sprintf("%s %d/%d", r.Scenario, w.HealthOK, w.HealthSent))
		}
	}
	m := fmt.Sprintf("%d/%d", okAll, nAll)
	if len(missed) > 0 {
		m += " (" + strings.Join(missed, ", ") + ")"
	}
	row("health probes 100% in every scenario", m, len(missed) == 0, fmt.Sprintf("%d of %d probes", nAll-okAll, nAll))

	res.rejCostTarget(b, v)

	// Ahead of every peer.
	var ps []string
	for _, p := range peers {
		if slices.ContainsFunc(res.Runs, func(r Run) bool { return r.Variant == p }) {
			ps = append(ps, p)
		}
	}
	if len(ps) > 0 {
		ahead := func(label string, goodput func(r *Run) (float64, bool)) {
			e := res.run(labelScenario(label), v)
			eg, ok := goodput(e)
			if !ok {
				return
			}
			var parts []string
			beat := true
			for _, p := range ps {
				pg, ok := goodput(res.run(labelScenario(label), p))
				if !ok {
					continue
				}
				lead := "–"
				if pg > 0 {
					lead = fmt.Sprintf("%+.0f%%", 100*(eg-pg)/pg)
				}
				parts = append(parts, fmt.Sprintf("%s %.0f (E %s)", p, pg, lead))
				if eg <= pg {
					beat = false
				}
			}
			if len(parts) == 0 {
				return
			}
			row(fmt.Sprintf("E ahead of %s on goodput: %s", strings.Join(ps, ", "), label),
				fmt.Sprintf("E %.0f/s; %s", eg, strings.Join(parts, ", ")), beat, "")
		}
		window := func(name string) func(r *Run) (float64, bool) {
			return func(r *Run) (float64, bool) {
				w := r.window(name)
				if w == nil {
					return 0, false
				}
				return w.Goodput, true
			}
		}
		for _, l := range overloadLoads {
			ahead("sweep "+loadName(l), window(loadName(l)))
		}
		for _, sc := range []string{"step", "capchange", "burst"} {
			ahead(sc+", whole run", window("all"))
		}
		ahead(neighbourOverload+", at 2×", window("overload"))
	}
	if u := slices.DeleteFunc(slices.Collect(maps.Keys(unavailableVariants)), func(v string) bool { return slices.Contains(res.variants(), v) }); len(u) > 0 {
		slices.Sort(u)
		f("\n%s could not be built (see Variants) and is compared with nothing. ", strings.Join(u, ", "))
	} else {
		f("\n")
	}
	f("Goodput targets are against the measured capacity (%.0f calls/s), not against E's own peak. %s Where a target is missed, the discussion below says why.\n\n", res.Capacity, reversalsDef)
}

// labelScenario returns the scenario of a label "scenario ..." or
// "sweep 2×".
func labelScenario(label string) string {
	name, _, _ := strings.Cut(label, " ")
	return strings.TrimSuffix(name, ",")
}

// neighbourSection writes the neighbour scenarios' tables.
func (res *Results) neighbourSection(b *strings.Builder, charts map[string]string, rel func(string) string) {
	f := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	vs := res.variants()
	f("## CPU-burning neighbour\n\n")
	var ns *NeighbourStat
	for _, r := range res.Runs {
		if r.Neighbour != nil {
			ns = r.Neighbour
			break
		}
	}
	f("A separate process, this program re-executed as `overload neighbour`, spins %s goroutines, each on a thread of its own, for the whole scenario: it starts before the server and is killed when the scenario ends (it would stop by itself %v after the scenario's end, and dies with the load generator). ",
		func() string {
			if ns == nil {
				return "a few"
			}
			return fmt.Sprint(ns.Workers)
		}(), neighbourSlack)
	switch {
	case ns != nil && ns.Pinned != "":
		f("It is pinned to the server's CPU (%s, `taskset`)", ns.Pinned)
	default:
		f("It is not pinned (pinning did not apply), so it competes with the server for whichever CPU it gets")
	}
	if ns != nil && ns.Cgroup != "" {
		f(" and runs in the root cpu cgroup, where the host's other work runs: outside the server's cgroup, whose quota and CPU accounting do not see it. ")
		f("The server's cgroup has cpu.shares %d against the neighbour threads' 1024 each, so when both want the CPU the server still gets most of it, up to its quota: the neighbour mostly takes what the server leaves, and delays the server's goroutines when it runs. ", cgroupShares)
	} else {
		f(", in no cgroup of the server's. ")
	}
	f("The tables give the CPU each got: the server's from its own accounting, the neighbour's as its average over its life.\n\n")
	if res.hasScenario(neighbourIdle) {
		sc := res.scenario(neighbourIdle)
		f("### Idle server beside the neighbour\n\n")
		if sc != nil && len(sc.Segments) > 0 {
			f("%.1f× capacity for %v; the target is that nothing is shed.\n\n", sc.Segments[0].Load, sc.Duration())
		}
		if c, ok := charts[neighbourIdle]; ok {
			f("![idle server beside the neighbour](%s)\n\n", rel(c))
		}
		f("| variant | calls rejected | deadline exceeded | goodput/s | p99, ms | server CPU | neighbour CPU | health probes |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, v := range vs {
			r := res.run(neighbourIdle, v)
			if r == nil {
				continue
			}
			all := r.window("all")
			sent := 0
			for _, s := range r.Seconds {
				sent += s.Sent
			}
			f("| %s | %d of %d | %d | %.0f | %s | %s | %s | %d/%d |\n", v, all.Rejections, sent, all.Deadlines, all.Goodput, num(all.P99, 1), num(nonzero(all.ServerCPU), 2), neighbourCPU(r), all.HealthOK, all.HealthSent)
		}
		f("\nFigures over the whole run.\n\n")
	}
	if res.hasScenario(neighbourOverload) {
		sc := res.scenario(neighbourOverload)
		f("### Overload beside the neighbour\n\n")
		if sc != nil && len(sc.Segments) > 1 {
			s := sc.Segments[1]
			f("%v at %.1f× capacity, then %v at %.0f×; figures from %v into the overload to its end, compared with the same variant's goodput at %.0f× in the sweep, without the neighbour.\n\n", sc.Segments[0].Dur, sc.Segments[0].Load, s.Dur, s.Load, s.Skip, s.Load)
		}
		if c, ok := charts[neighbourOverload]; ok {
			f("![overload beside the neighbour](%s)\n\n", rel(c))
		}
		f("| variant | goodput/s | sweep's 2×, goodput/s | ratio | p99, ms | rejected/s | deadline exceeded/s | server CPU | neighbour CPU | health probes |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, v := range vs {
			r := res.run(neighbourOverload, v)
			if r == nil {
				continue
			}
			w, all := r.window("overload"), r.window("all")
			if w == nil {
				continue
			}
			ref, ratioS := "–", "–"
			if sw := res.run("sweep", v).window(loadName(w.Load)); sw != nil {
				ref = fmt.Sprintf("%.0f", sw.Goodput)
				if sw.Goodput > 0 {
					ratioS = fmt.Sprintf("%.2f", w.Goodput/sw.Goodput)
				}
			}
			f("| %s | %.0f | %s | %s | %s | %.0f | %.0f | %s | %s | %d/%d |\n", v, w.Goodput, ref, ratioS, num(w.P99, 0), w.Rejected, w.Deadline, num(nonzero(w.ServerCPU), 2), neighbourCPU(r), all.HealthOK, all.HealthSent)
		}
		f("\n")
	}
}

// stormReference returns variant v's window at the retry storm's load
// without retries, and where it comes from: the sweep's window at that
// load when the run has one, else the retry storm's own segment without
// retries; nil when the run has neither.
func (res *Results) stormReference(v string) (*Window, string) {
	if w := res.run("sweep", v).window(loadName(stormLoad)); w != nil {
		return w, "the sweep's " + loadName(stormLoad)
	}
	if w := res.run(retryStorm, v).window(stormBaseline); w != nil {
		return w, "the retry storm's own segment without retries, for want of a sweep at " + loadName(stormLoad)
	}
	return nil, ""
}

// stormWire returns a retry-storm window's load on the wire, × capacity.
func stormWire(w *Window, capacity float64) string {
	if w == nil {
		return "–"
	}
	return fmt.Sprintf("%.2f×", w.Wire/capacity)
}

// retryStormSection writes the retry storm's table.
func (res *Results) retryStormSection(b *strings.Builder, charts map[string]string, rel func(string) string) {
	f := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	vs := res.variants()
	cap := res.Capacity
	f("## Retry storm\n\n")
	f("%s capacity of calls throughout, counted as in the other scenarios (one per arrival, however many attempts it takes), from the same ten tenants, against one fresh server per variant, in three segments: ", loadName(stormLoad))
	sc := res.scenario(retryStorm)
	var parts, skips []string
	if sc != nil {
		for _, s := range sc.Segments {
			what := ""
			switch s.Client {
			case clientOnce:
				what = "each call is sent once, as in every other scenario"
			case clientNaive:
				what = fmt.Sprintf("the application retries every UNAVAILABLE or RESOURCE_EXHAUSTED after a backoff drawn from %v–%v, up to %d attempts in all, while the call's %v deadline leaves room for the backoff, and ignores the rejection's RetryInfo: what most clients do", naiveBackoffMin, naiveBackoffMax, naiveAttempts, res.Config.Deadline)
			case clientThrottled:
				what = fmt.Sprintf("no application retries; each tenant's calls go through a connection of its own with the interceptors of `throttle.New(throttle.WithRetries(%d))`, one throttle per tenant as ten separate clients would have: the adaptive throttle drops a call on the client with probability max(0, (requests − %g·accepts)/(requests + 1)) and fails it with `throttle.ErrThrottled`, and rejected calls are retried within the retry budget after the delay in the server's RetryInfo", naiveAttempts, throttle.DefaultK)
			}
			parts = append(parts, fmt.Sprintf("**%s** (%v: %s)", s.Name, s.Dur, what))
			skips = append(skips, s.Skip.String())
		}
	}
	f("%s. The segments' figures start %s into them, leaving the transitions out.\n\n", strings.Join(parts, "; "), strings.Join(skips, ", "))
	f("On the wire: the attempts that went on the network, counted by a client interceptor chained after the throttle's, so that the calls the throttle dropped are not counted: the load the server saw. ")
	f("Served OK: calls that ended OK within their deadline, each once however many attempts it took: what the server's work gave the clients. Goodput, as elsewhere, counts those of them that ended within the SLO, from their first attempt to the end of their last, so a call served on a retry, after the wait the server asked for, is served OK but mostly not goodput. ")
	f("The accepted p99 is over the calls that ended OK, their retries and waits included, and over the attempts the server answered OK. ")
	f("With K = %g, the adaptive throttle settles where a client sends about K times what the server accepts of it: a server that accepts about its capacity sees about %g× its capacity on the wire from throttled clients.\n\n", throttle.DefaultK, throttle.DefaultK)
	if c, ok := charts[retryStorm]; ok {
		f("![retry-storm timeline](%s)\n\n", rel(c))
	}
	f("| variant | clients | offered, × capacity | on the wire, × capacity | rejected on the wire/s | dropped on the client/s | served OK/s (× capacity) | served OK vs. no retries | goodput/s | accepted p99, ms: calls / attempts | deadline exceeded/s | health probes |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, v := range vs {
		r := res.run(retryStorm, v)
		if r == nil || sc == nil {
			continue
		}
		base, all := r.window(stormBaseline), r.window("all")
		for _, s := range sc.Segments {
			w := r.window(s.Name)
			if w == nil {
				continue
			}
			vsBase := "–"
			if base != nil && base.OKRate > 0 {
				vsBase = pct(w.OKRate / base.OKRate)
			}
			health := ""
			if all != nil && s.Client == clientOnce {
				health = fmt.Sprintf("%d/%d", all.HealthOK, all.HealthSent)
			}
			f("| %s | %s | %.2f× | %.2f× | %.0f | %.0f | %.0f (%.2f×) | %s | %.0f | %s / %s | %.1f | %s |\n", v, clientLabel(s.Client, res.Config.ThrottleK), w.Sent/cap, w.Wire/cap, w.WireRejected, w.Dropped, w.OKRate, w.OKRate/cap, vsBase, w.Goodput, num(w.P99, 0), num(w.WireP99, 0), w.Deadline, health)
		}
	}
	f("\nHealth probes over the whole run, on the first row of each variant. ")
	if ref, from := res.stormReference(targetVariant); ref != nil {
		f("The target's reference, E's calls served OK at %s without retries: %.0f/s (%s).", loadName(stormLoad), ref.OKRate, from)
	}
	f("\n\n")
}

// neighbourCPU returns the CPU a run's neighbour used, for the tables.
func neighbourCPU(r *Run) string {
	if r.Neighbour == nil {
		return "–"
	}
	return fmt.Sprintf("%.2f", r.Neighbour.CPU)
}

// writeCharts draws the charts and returns their paths by name.
func writeCharts(res *Results, dir string) (map[string]string, error) {
	out := map[string]string{}
	const width, row = 22 * vg.Centimeter, 8 * vg.Centimeter
	vs := res.variants()
	color := func(v string) int { return slices.Index(allVariants, v) % len(fgplot.Palette) }

	if loads := res.sweepLoads(); len(loads) > 0 {
		var good, p99 []fgplot.Series
		for _, v := range vs {
			r := res.run("sweep", v)
			if r == nil {
				continue
			}
			var g, l plotter.XYs
			for _, ld := range loads {
				if w := r.window(loadName(ld)); w != nil {
					g = append(g, plotter.XY{X: ld, Y: w.Goodput})
					y := w.P99
					if y < 0 {
						y = math.NaN()
					}
					l = append(l, plotter.XY{X: ld, Y: y})
				}
			}
			s := fgplot.Series{Name: v + ": " + variantNames[v], Color: fgplot.Palette[color(v)], XYs: g}
			good = append(good, s)
			s.XYs = l
			p99 = append(p99, s)
		}
		ideal := fgplot.Series{Name: "capacity", Color: fgplot.Black, Dash: fgplot.Dashed, XYs: plotter.XYs{{X: loads[0], Y: res.Capacity}, {X: loads[len(loads)-1], Y: res.Capacity}}}
		a := fgplot.Panel("Goodput against offered load", "goodput (calls/s OK within the SLO)", append(good, ideal))
		a.Y.Min = 0
		a.X.Label.Text = "offered load (× measured capacity)"
		c := fgplot.Panel("", "accepted p99 (ms, log)", p99)
		logY(c)
		c.X.Label.Text = "offered load (× measured capacity)"
		path := filepath.Join(dir, "overload-sweep.png")
		if err := fgplot.WritePNG(path, width, row*1.2, a, c); err != nil {
			return nil, err
		}
		out["sweep"] = path
	}
	for _, sc := range []struct{ name, title string }{
		{"step", "Step 0.7× → 3× → 0.7×"},
		{"capchange", "Capacity change at 1.2× (cost doubles at 10 s)"},
		{"burst", "Tenant burst (heavy tenant 5× from 5 s to 15 s)"},
		{neighbourIdle, "Idle server (0.5×) beside a CPU-burning neighbour"},
		{neighbourOverload, "Overload (2×) beside a CPU-burning neighbour"},
		{retryStorm, "Retry storm at 3×: no retries, naive retries, throttled"},
	} {
		if !res.hasScenario(sc.name) {
			continue
		}
		var good, scale, lat, light, limit, wire []fgplot.Series
		var offered plotter.XYs
		for _, v := range vs {
			r := res.run(sc.name, v)
			if r == nil {
				continue
			}
			var g, l, lt, wx plotter.XYs
			for _, s := range r.Seconds {
				x := float64(s.T) + 0.5
				g = append(g, plotter.XY{X: x, Y: float64(s.Good)})
				wx = append(wx, plotter.XY{X: x, Y: float64(s.Wire)})
				y := s.P99
				if y < 0 {
					y = math.NaN()
				}
				l = append(l, plotter.XY{X: x, Y: y})
				lt = append(lt, plotter.XY{X: x, Y: 100 * float64(s.LightGood) / math.Max(float64(s.LightSent), 1)})
				if len(offered) < len(r.Seconds) && v == vs[0] {
					offered = append(offered, plotter.XY{X: x, Y: s.Offered})
				}
			}
			col := fgplot.Palette[color(v)]
			good = append(good, fgplot.Series{Name: v, Color: col, XYs: g})
			lat = append(lat, fgplot.Series{Name: v, Color: col, XYs: l})
			light = append(light, fgplot.Series{Name: v, Color: col, XYs: lt})
			if r.Wire {
				wire = append(wire, fgplot.Series{Name: v, Color: col, XYs: wx})
			}
			if v == "C" || v == "D" {
				var sx plotter.XYs
				for _, p := range r.Gate {
					sx = append(sx, plotter.XY{X: p.T, Y: 100 * p.Scale})
				}
				scale = append(scale, fgplot.Series{Name: v + " gate scale", Color: col, XYs: sx})
				var rx plotter.XYs
				for _, p := range r.Gate {
					rx = append(rx, plotter.XY{X: p.T, Y: 100 * p.Reading})
				}
				scale = append(scale, fgplot.Series{Name: v + " CPU reading", Color: col, Dash: fgplot.Dashed, XYs: rx})
			}
			if v == targetVariant {
				var lx, ix plotter.XYs
				for _, p := range r.Gate {
					if p.Limit > 0 {
						lx = append(lx, plotter.XY{X: p.T, Y: p.Limit})
						ix = append(ix, plotter.XY{X: p.T, Y: float64(p.Inflight + p.Queued)})
					}
				}
				if len(lx) > 0 {
					limit = append(limit, fgplot.Series{Name: v + " concurrency limit", Color: col, XYs: lx},
						fgplot.Series{Name: v + " calls in flight and waiting", Color: col, Dash: fgplot.Dashed, XYs: ix})
				}
			}
		}
		good = append(good, fgplot.Series{Name: "offered", Color: fgplot.Black, Dash: fgplot.Dashed, XYs: offered})
		panels := []*plot.Plot{fgplot.TimePanel(sc.title, "goodput (calls/s)", good)}
		panels[0].Y.Min = 0
		// The offered line dwarfs goodput at 3×; keep goodput readable.
		panels[0].Y.Max = math.Min(panels[0].Y.Max, 2.2*res.Capacity)
		if sc.name == "burst" {
			p := fgplot.TimePanel("", "light tenants' success (%)", light)
			p.Y.Min, p.Y.Max = 0, 135
			panels = append(panels, p)
		}
		if len(wire) > 0 {
			// The offered calls again, for scale: the wire carries their
			// attempts.
			p := fgplot.TimePanel("", "attempts on the wire (/s)", append(wire, good[len(good)-1]))
			p.Y.Min = 0
			panels = append(panels, p)
		}
		if len(scale) > 0 {
			p := fgplot.TimePanel("", "gate scale and CPU reading (%)", scale)
			p.Y.Min, p.Y.Max = 0, 150
			panels = append(panels, p)
		}
		if len(limit) > 0 {
			p := fgplot.TimePanel("", "concurrency limit and calls", limit)
			p.Y.Min = 0
			panels = append(panels, p)
		}
		lp := fgplot.TimePanel("", "accepted p99 (ms, log)", lat)
		logY(lp)
		panels = append(panels, lp)
		end := 0.0
		for _, s := range res.Scenarios {
			if s.Name == sc.name {
				end = s.Duration().Seconds()
			}
		}
		for _, p := range panels {
			p.X.Max = math.Max(end, 1)
		}
		panels[len(panels)-1].X.Label.Text = "time (s)"
		path := filepath.Join(dir, "overload-"+sc.name+".png")
		if err := fgplot.WritePNG(path, width, row, panels...); err != nil {
			return nil, err
		}
		out[sc.name] = path
	}
	return out, nil
}

// logY puts a latency panel on a log scale from 1 ms; a panel with no
// latency to show (every call failed) gets 1–1000 ms rather than an
// infinite range, which the log scale cannot draw.
func logY(p *plot.Plot) {
	if math.IsInf(p.Y.Min, 0) || math.IsInf(p.Y.Max, 0) || math.IsNaN(p.Y.Min) || math.IsNaN(p.Y.Max) || p.Y.Max <= 0 {
		p.Y.Min, p.Y.Max = 1, 200
	}
	fgplot.LogY(p, 1)
}

func nonzero(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// perSecond averages the server's CPU (CPUs), handlers entered and
// rejections per second over the run's whole seconds within [from, to).
func (r *Run) perSecond(from, to float64) (cpu, handled, rejected float64, ok bool) {
	n := 0
	for _, s := range r.Seconds {
		if float64(s.T) < from || float64(s.T+1) > to || s.CPU <= 0 {
			continue
		}
		cpu += s.CPU
		handled += s.Handled
		rejected += float64(s.Rejected)
		n++
	}
	if n == 0 {
		return 0, 0, 0, false
	}
	return cpu / float64(n), handled / float64(n), rejected / float64(n), true
}

// rejectionCost estimates a rejection's CPU from the sweep: the CPU per
// handler at 0.5× (no rejections), and what is left of the CPU at 4× once
// the handlers have been paid for, per rejection.
func (res *Results) rejectionCost(v string) (Fit, bool) {
	r := res.run("sweep", v)
	lo, hi := r.window(loadName(0.5)), r.window(loadName(4))
	if lo == nil || hi == nil {
		return Fit{}, false
	}
	c0, h0, _, ok0 := r.perSecond(lo.From, lo.To)
	c1, h1, rej1, ok1 := r.perSecond(hi.From, hi.To)
	if !ok0 || !ok1 || h0 <= 0 || rej1 < 1 {
		return Fit{}, false
	}
	a := c0 / h0
	b := (c1 - a*h1) / rej1
	return Fit{PerServedMs: a * 1e3, PerRejectedUs: b * 1e6, Ratio: b / a}, true
}

// rejCostTarget writes variant v's rejection-cost target row: from the
// direct measurement when the run has one, else from the sweep estimate; a
// negative or undefined figure is never a target met.
func (res *Results) rejCostTarget(b *strings.Builder, v string) {
	const target = "a rejection costs ≤ 1% of a served request"
	f := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	verdict := func(ratio float64) string {
		if ratio <= targetRejCost {
			return "met"
		}
		return fmt.Sprintf("**missed** by %.2f points", 100*(ratio-targetRejCost))
	}
	if rc, err := res.rejCostFor(v); err == nil {
		m := fmt.Sprintf("%.1f µs vs %.1f µs: %s (direct measurement, %d rejections)", rc.PerRejectedUs, rc.PerServedUs, pct(rc.Ratio), rc.phase("reject").Rej)
		if rc.FloorUs > 0 && rc.PerServedUs > 0 {
			m += fmt.Sprintf("; a health check, which no admission control touches, costs %.1f µs (%s)", rc.FloorUs, pct(rc.FloorUs/rc.PerServedUs))
		}
		if !rc.Valid() {
			why := "the measurement gives no non-negative ratio"
			if rc.Saturated {
				why = "the server saturated during the measurement"
			}
			f("| %s | %s | **undetermined** (%s) |\n", target, m, why)
			return
		}
		f("| %s | %s | %s |\n", target, m, verdict(rc.Ratio))
		return
	}
	rc, ok := res.rejectionCost(v)
	if !ok {
		f("| %s | not measured | **undetermined** |\n", target)
		return
	}
	m := fmt.Sprintf("%.1f µs vs %.3f ms: %s (sweep estimate, no direct measurement in this run; regression: %s)", rc.PerRejectedUs, rc.PerServedMs, pct(rc.Ratio), pct(res.Fits[v].Ratio))
	if rc.Ratio < 0 || rc.PerRejectedUs < 0 || math.IsNaN(rc.Ratio) {
		f("| %s | %s | **undetermined** (a negative estimate is noise) |\n", target, m)
		return
	}
	f("| %s | %s | %s |\n", target, m, verdict(rc.Ratio))
}

// rejCostSection writes the direct measurement of the rejection cost.
func (res *Results) rejCostSection(b *strings.Builder) {
	f := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	if len(res.RejCosts) == 0 {
		f("This run has no direct measurement (the `%s` scenario); only the estimates below.\n\n", rejcostName)
		return
	}
	idle, served, reject := rejcostDurations(res.Config.Quick)
	f("Measured directly by the `%s` scenario: one fresh server per variant that rejects (%s; A, P2 and P3 reject nothing of this load: P2 and P3 shed on a CPU reading, and would serve it), ", rejcostName, strings.Join(rejcostVariants, ", "))
	f("after a short warm-up of both paths, four phases separated by quiet pauses, with no stats polled and no health probes sent during them: ")
	f("**idle** (%v, nothing sent: the server's idle CPU); **served** (%v at %.1f× capacity from the ten tenants, which every variant serves: CPU per served call = (CPU − idle CPU × duration) / handlers entered); ", idle, served, rejcostServedLoad)
	f("**reject** (%v at %.0f× capacity, at most %.0f calls/s, from one extra caller: B, C, D and E give it a quota of 1/s with a burst of 1, so the middleware's interceptor rejects nearly all of its calls; P1's global limiter serves up to the capacity of them and rejects the rest): ", reject, rejcostRejectLoad, rejcostMaxRate)
	f("CPU per rejection = (CPU − idle CPU × duration − handlers entered × CPU per served call) / rejections; ")
	f("and **floor** (%v of `grpc.health.v1` checks at the reject phase's rate, exempt from every variant's admission control: what the server spends on a call that does no work, in gRPC and the runtime, for comparison: a rejection's cost above it is what admission control adds, and it may come in under it, since a rejection answers with a status and no message). ", reject)
	f("The CPU is the server's own (%s), read at each phase's ends, so the machine's other work enters it only through caches and frequency.\n\n", res.RejCosts[0].CPUSource)
	f("| variant | CPU per served call | CPU per rejection | ratio | target ≤ 1%% | floor: CPU per health check | rejection above the floor | rejection latency p50 / p99, ms |\n|---|---:|---:|---:|---|---:|---:|---:|\n")
	for _, rc := range res.RejCosts {
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
		f("| %s | %.1f µs | %.1f µs | %s | %s | %s | %s | %s |\n", rc.Variant, rc.PerServedUs, rc.PerRejectedUs, pct(rc.Ratio), verdict, floor, above, lat)
	}
	f("\nThe inputs, for checking (CPU in CPU-seconds; handlers entered and completed are the server's counters, the rest the client's):\n\n")
	f("| variant | phase | offered/s | duration s | server CPU s | sent | OK | rejected | other | handlers entered / completed | gate scale at the end |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, rc := range res.RejCosts {
		for _, ph := range rc.Phases {
			st := fmt.Sprintf("%.2f", ph.Scale)
			if ph.State != "" {
				st += " " + ph.State
			}
			f("| %s | %s | %.0f | %.3f | %.4f | %d | %d | %d | %d | %d / %d | %s |\n", rc.Variant, ph.Name, ph.Rate, ph.Secs, ph.CPUSec, ph.Sent, ph.OK, ph.Rej, ph.Other, ph.Handle, ph.Served, st)
		}
	}
	f("\nIdle CPU: ")
	var parts []string
	for _, rc := range res.RejCosts {
		parts = append(parts, fmt.Sprintf("%s %.4f CPU", rc.Variant, rc.IdleCPU))
	}
	f("%s. ", strings.Join(parts, ", "))
	f("Share of the reject phase's net CPU taken by the subtracted handlers: ")
	parts = parts[:0]
	for _, rc := range res.RejCosts {
		parts = append(parts, fmt.Sprintf("%s %s", rc.Variant, pct(rc.ServedShare)))
	}
	f("%s; where it is large, the rejection figure inherits the served-call figure's error multiplied by the handlers per rejection, and is correspondingly less precise. ", strings.Join(parts, ", "))
	f("Where more than 1%% of the reject phase's calls exceeded their deadline or failed, the server ran out of CPU: its handlers were cut short by their callers' deadlines, so subtracting them at the served phase's cost is wrong, and the figure is undetermined. ")
	f("P1's global limiter serves the capacity of any load above it, so its reject phase saturates the server by construction: its rejection cost cannot be separated from its served calls' this way.\n\n")
	shed := false
	for _, rc := range res.RejCosts {
		shed = shed || rc.TapShed
	}
	f("These are the interceptor's rejections: the reject phase leaves the server's CPU low, so C's and D's gates do not shed during it")
	if shed {
		f(" (except where the table shows a gate scale below 1, where some rejections came from the tap handle)")
	}
	f(", and the tap handle, which turns callers away only while the gate sheds, is not exercised. ")
	f("Making the gate shed needs the CPU high, which would bury the rejections' CPU under the served calls'; the tap handle's rejection cost is not measured here. ")
	f("It runs before the request is read, so it should cost no more than the interceptor's, but that is an expectation, not a figure.\n\n")
}

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
	f(". ")
	return b.String()
}
