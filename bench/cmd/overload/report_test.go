package main

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// synthRaw makes a run's raw record without a server: every tenant sends
// at its rate, each call ends by outcome(call start, tenant), with polls of
// a concurrency limiter every 250 ms. Where the scenario's clients retry,
// every call is one attempt on the wire at its start, but a rejected call
// of a naive segment is naiveAttempts, and every other rejected call of a
// throttled segment was dropped on the client.
func synthRaw(sc Scenario, capacity float64, outcome func(at time.Duration, tenant int) (outcome, time.Duration)) *rawRun {
	raw := &rawRun{Wire: sc.retries()}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range numTenants {
		for t := time.Duration(0); t < sc.Duration(); {
			seg := sc.segmentAt(t)
			r := sc.Segments[seg].rate(i, capacity)
			t += time.Duration(rng.ExpFloat64() / r * float64(time.Second))
			if t >= sc.Duration() {
				break
			}
			out, lat := outcome(t, i)
			c := callRec{At: t, Lat: lat, Tenant: uint8(i), Out: out}
			tries := 1
			if raw.Wire && out == outRejected {
				switch sc.Segments[sc.segmentAt(t)].Client {
				case clientNaive:
					tries = naiveAttempts
				case clientThrottled:
					c.Dropped = raw.Sent[i]%2 == 0
					if c.Dropped {
						tries = 0
					}
				}
			}
			for range tries {
				if raw.Wire {
					raw.Attempts = append(raw.Attempts, attemptRec{At: t, Lat: lat, Out: out})
				}
			}
			raw.Calls = append(raw.Calls, c)
			raw.Sent[i]++
		}
	}
	for t := time.Duration(0); t < sc.Duration(); t += 250 * time.Millisecond {
		raw.Polls = append(raw.Polls, pollRec{At: t, serverStats: serverStats{Scale: 1, State: "open", Limit: 8 + float64(t/time.Second%2), CPUNs: int64(t) / 2}})
		raw.Probes = append(raw.Probes, probeRec{At: t, OK: true})
	}
	return raw
}

// TestReportSections renders a report from synthetic runs of every
// scenario and checks that the sections and targets of E are there,
// without NaN.
func TestReportSections(t *testing.T) {
	const capacity = 300.0
	slo := 100 * time.Millisecond
	res := &Results{
		Config:    Config{Quick: true, Cost: 2 * time.Millisecond, Deadline: 500 * time.Millisecond, SLO: slo},
		Isolation: &Isolation{Taskset: "/usr/bin/taskset", Quota: 0.9, PeriodUs: 50000, Shares: cgroupShares, LoadCgroup: "x"},
		Capacity:  capacity,
		Fits:      map[string]Fit{},
	}
	res.Scenarios = scenarios(true)
	for _, sc := range res.Scenarios {
		for _, v := range []string{"E", "P3"} {
			outcome := func(at time.Duration, tenant int) (outcome, time.Duration) {
				// E serves everything fast but rejects some of the heavy
				// tenant; P3 lets everything wait.
				if v == "P3" {
					return outDeadline, 500 * time.Millisecond
				}
				if tenant == heavyTenant && at%(3*time.Millisecond) == 0 {
					return outRejected, time.Millisecond
				}
				// In the retry storm, half of the heavy tenant's calls.
				if sc.Name == retryStorm && tenant == heavyTenant && at/time.Microsecond%2 == 0 {
					return outRejected, time.Millisecond
				}
				return outOK, 10 * time.Millisecond
			}
			run := analyse(synthRaw(sc, capacity, outcome), sc, v, serverReady{}, capacity, slo)
			if sc.Neighbour {
				run.Neighbour = &NeighbourStat{Workers: 4, Pinned: "0", Cgroup: rootCPUCgroup, Secs: 3, CPU: 0.5, Killed: true}
			}
			res.Runs = append(res.Runs, run)
		}
	}
	if r := res.run("capchange", "E"); r.window(settledWindow) == nil {
		t.Error("capchange/E: no settled window")
	}
	if r := res.run("burst", "E"); r.window("burst").FairJain <= 0 || r.window("burst").FairJain > 1 {
		t.Errorf("burst/E: fair-share Jain %v", r.window("burst").FairJain)
	}
	// The wire counts each attempt: a naive rejected call thrice, a
	// dropped call not at all.
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6 }
	storm := res.run(retryStorm, "E")
	if w := storm.window(stormBaseline); !near(w.Wire, w.Sent) || w.Dropped != 0 {
		t.Errorf("%s/E %s: on the wire %v/s, dropped %v/s, for %v/s sent; want as many on the wire, none dropped", retryStorm, w.Name, w.Wire, w.Dropped, w.Sent)
	}
	if w := storm.window(clientNaive); w.Rejected == 0 || !near(w.Wire, w.Sent+(naiveAttempts-1)*w.Rejected) || !near(w.WireRejected, naiveAttempts*w.Rejected) {
		t.Errorf("%s/E %s: on the wire %v/s (rejected %v/s) for %v/s sent and %v/s rejected", retryStorm, w.Name, w.Wire, w.WireRejected, w.Sent, w.Rejected)
	}
	if w := storm.window(clientThrottled); w.Dropped == 0 || !near(w.Wire, w.Sent-w.Dropped) {
		t.Errorf("%s/E %s: on the wire %v/s, dropped %v/s, for %v/s sent", retryStorm, w.Name, w.Wire, w.Dropped, w.Sent)
	}
	if r := res.run(retryStorm, "P3"); !r.Wire || r.window(clientNaive).Wire == 0 {
		t.Errorf("%s/P3: wire %v, naive window %+v", retryStorm, r.Wire, r.window(clientNaive))
	}

	report, dir := renderReport(t, res)
	for _, want := range []string{
		"| scenario | target | E | P3 |",
		"| sweep, 2× | goodput ≥ 95%, p99 ≤ 100 ms |",
		"| capacity change at 1.2× (the cost doubles) | ≥ 90% of the new capacity",
		"| reversals at steady load | ≤ 2 a minute |",
		"| tenant burst: the heavy tenant | ≥ 95% of its max-min fair share |",
		"| idle server beside a CPU-burning neighbour | no call rejected | 0 of",
		"| health probes, every scenario |",
		"| goodput, E against each peer | E ahead in every scenario | ahead in",
		"## CPU-burning neighbour",
		"![idle server beside the neighbour]",
		"![overload beside the neighbour]",
		"Jain's index, shares of fair share",
		"aegis takes any cgroup path other than `/`",
		"P4, platinummonkey/go-concurrency-limits",
		"## Retry storm",
		"| E | throttled: `throttle.New(throttle.WithRetries(3))` |",
		"| retry storm at 3×, throttled clients | ≤ 1.5× the capacity on the wire",
		"for want of a sweep at 3×",
	} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(report, "NaN") {
		t.Error("the report shows NaN")
	}
	for _, name := range []string{"overload-neighbour-idle.png", "overload-neighbour-overload.png", "overload-capchange.png", "overload-retry-storm.png"} {
		b, err := os.ReadFile(filepath.Join(dir, "charts", name))
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Errorf("chart %s: %v", name, err)
		}
	}
}

// renderReport renders res into a temporary directory and returns the
// report's text and the directory, whose charts/ holds the charts.
func renderReport(t *testing.T, res *Results) (string, string) {
	t.Helper()
	dir := t.TempDir()
	md := filepath.Join(dir, "BENCHMARKS.md")
	if err := renderAll(res, md, filepath.Join(dir, "charts")); err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	return string(report), dir
}

// TestOutOfTreeVariant: this build cannot run P4, so it is not among the
// default variants; a report rendered from results that hold P4's runs
// (a copy of the bench that registers it) describes its wiring and
// compares E with it, instead of calling it absent.
func TestOutOfTreeVariant(t *testing.T) {
	if runnable("P4") {
		t.Skip("this copy of the bench registers P4")
	}
	if vs, err := chooseVariants("", false); err != nil || slices.Contains(vs, "P4") || !slices.Contains(vs, "E") {
		t.Errorf("default variants %v (%v): want every runnable one, without P4", vs, err)
	}
	if _, err := chooseVariants("E,P4", false); err == nil || !strings.Contains(err.Error(), "module proxy refuses") {
		t.Errorf("-variants E,P4: error %v, want P4's reason", err)
	}
	if _, err := chooseVariants("E,P9", false); err == nil {
		t.Error("-variants E,P9: no error")
	}
	const capacity = 300.0
	slo := 100 * time.Millisecond
	res := &Results{
		Config:   Config{Quick: true, Cost: 2 * time.Millisecond, Deadline: 500 * time.Millisecond, SLO: slo},
		Capacity: capacity,
		Fits:     map[string]Fit{},
	}
	sc := scenarios(true)[0]
	res.Scenarios = []Scenario{sc}
	for _, v := range []string{"E", "P4"} {
		run := analyse(synthRaw(sc, capacity, func(time.Duration, int) (outcome, time.Duration) {
			return outOK, 10 * time.Millisecond
		}), sc, v, serverReady{}, capacity, slo)
		res.Runs = append(res.Runs, run)
	}
	report, _ := renderReport(t, res)
	for _, want := range []string{"P4 is platinummonkey/go-concurrency-limits", p4Commit, "| scenario | target | E | P4 |", "| goodput, E against each peer |"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(report, "is not in this experiment") || strings.Contains(report, "could not be built") {
		t.Error("the report calls P4 absent although it holds P4's runs")
	}
}

// TestCapacityMethod: the report describes the capacity measurement from
// the steps a run took, so that results of the earlier, shorter steps are
// not described as the current method.
func TestCapacityMethod(t *testing.T) {
	step := func(rate float64, pass bool, from, to float64) CapacityStep {
		return CapacityStep{Rate: rate, Pass: pass, Window: Window{From: from, To: to}}
	}
	old := capacityMethod([]CapacityStep{step(367, true, 2.5/3, 2.5), step(397, true, 2.5/3, 2.5), step(428, false, 2.5/3, 2.5)}, false)
	now := capacityMethod([]CapacityStep{step(367, true, 2, 5), step(397, true, 2, 5), step(428, false, 2, 5), step(428, false, 2, 5), step(412, false, 2, 5), step(404, true, 2, 5)}, false)
	for _, c := range []struct {
		text      string
		want, not []string
	}{
		{old, []string{"each 2.5 s long and judged on its last 1.67 s"}, []string{"repeated", "halve", "sustains"}},
		{now, []string{"each 5 s long and judged on its last 3 s", "repeated once", "halve the interval", "sustains"}, nil},
	} {
		for _, w := range c.want {
			if !strings.Contains(c.text, w) {
				t.Errorf("%q lacks %q", c.text, w)
			}
		}
		for _, w := range c.not {
			if strings.Contains(c.text, w) {
				t.Errorf("%q says %q", c.text, w)
			}
		}
	}
}

// TestCommittedReport: the committed summary renders the committed
// BENCHMARKS.md byte for byte, so that neither changes without the other.
// After editing report.md.tmpl or the tables, re-render with
// `go run ./cmd/overload -render results/overload.json`.
func TestCommittedReport(t *testing.T) {
	res, err := readResults("../../results/overload.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := res.report("docs/benchmarks")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("../../../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(got, want) {
		return
	}
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := range max(len(g), len(w)) {
		if i >= len(g) || i >= len(w) || g[i] != w[i] {
			t.Fatalf("BENCHMARKS.md is not the rendering of results/overload.json (re-render with -render): line %d is\n%q\nwant\n%q",
				i+1, line(g, i), line(w, i))
		}
	}
}

func line(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(end of file)"
}

// TestResultsFile: a window is a row of the results file, one line of it;
// files written when windows were objects still read.
func TestResultsFile(t *testing.T) {
	w := Window{Name: "2×", From: 2, To: 7, Load: 2, Goodput: 431.5, P99: 22.4, FairJain: -1, TenantSent: []float64{1, 2.5}, HealthOK: 5, Wire: 3}
	res := &Results{Capacity: 440, Runs: []Run{{Scenario: "sweep", Variant: "E", Windows: []Window{w, {Name: "all"}}}}}
	path := filepath.Join(t.TempDir(), "r.json")
	if err := writeResults(res, path); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := `    ["2×", 2, 7, 2, 0, 431.5, 0, 0, 0, 0, 22.4, 0, 0, 0, 0, 0, 0, 0, [1, 2.5], null, -1, 0, 0, 0, 5, 0, 0, 0, 3, 0, 0, 0],`; !strings.Contains(string(b), want+"\n") {
		t.Errorf("the file lacks the window's row %s:\n%s", want, b)
	}
	back, err := readResults(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Runs[0].Windows[0]; !reflect.DeepEqual(got, w) {
		t.Errorf("read back %+v, want %+v", got, w)
	}

	old := filepath.Join(t.TempDir(), "old.json")
	if err := os.WriteFile(old, []byte(`{"runs": [{"windows": [{"name": "2×", "goodput": 431.5, "tenant_sent": [1, 2.5]}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	back, err = readResults(old)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Runs[0].Windows[0]; got.Name != "2×" || got.Goodput != 431.5 || len(got.TenantSent) != 2 {
		t.Errorf("an object window read as %+v", got)
	}

	other := filepath.Join(t.TempDir(), "other.json")
	if err := os.WriteFile(other, []byte(`{"window_columns": ["name"], "runs": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readResults(other); err == nil {
		t.Error("results of other window columns read without an error")
	}
}

// TestSummary: the summary drops the seconds, keeps what the tables take
// from them, and is its own summary.
func TestSummary(t *testing.T) {
	w := Window{Name: "all", TenantSent: []float64{1}, TenantGood: []float64{1}}
	res := &Results{Runs: []Run{
		{Scenario: "sweep", Variant: "E", Ready: serverReady{GRPC: "127.0.0.1:1"}, Seconds: []Second{{Sent: 3}, {Sent: 4}}, Gate: []GatePoint{{T: 1}}, Windows: []Window{w}},
		{Scenario: "burst", Variant: "E", Windows: []Window{w}},
	}}
	sum, err := res.summary()
	if err != nil {
		t.Fatal(err)
	}
	r := sum.Runs[0]
	if r.Calls != 7 || r.Seconds != nil || r.Gate != nil || r.Ready != (serverReady{}) || r.Windows[0].TenantSent != nil {
		t.Errorf("the sweep's summary: %+v", r)
	}
	if sum.Runs[1].Windows[0].TenantSent == nil {
		t.Error("the burst's summary lost the tenants' rates")
	}
	again, err := sum.summary()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(again, sum) {
		t.Errorf("the summary's summary differs:\n%+v\n%+v", again, sum)
	}
	if sum.raw() || !res.raw() {
		t.Errorf("raw(): summary %v, results %v", sum.raw(), res.raw())
	}
}
