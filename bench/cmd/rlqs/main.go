// Command rlqs measures how floodgate-rls's RLQS server (rls.QuotaServer)
// divides one limit among a fleet of Envoys, against the other ways of
// serving Envoy's rate_limit_quota filter, in process and on a fake clock:
// a run of two minutes takes a few seconds, and the same run gives the
// same figures.
//
// Twenty simulated Envoys (rls/rlqstest, each on its own connection over
// bufconn) share one tenant's limit of 1000 a second; they want twice it,
// Zipf-skewed (∝ 1/rank^1.1), each sending what it is owed every 10 ms.
// They report every second, then every 5 s as Envoy does. Variants:
//
//	floodgate  rls.QuotaServer: the limit divided by demand
//	replicas   three rls.QuotaServers on one Redis (a redis-server the run starts), Envoy i on replica i mod 3
//	static     a server answering every bucket with the whole limit, as jukie/rlqs does
//	even       a server answering every bucket with limit/N
//	rls        RLS v3, rls.Service.ShouldRateLimit on every request (one call a request)
//
// Beside them, a sweep of operating points at steady demand: floodgate and
// its replicas at 5, 20 and 100 Envoys, 0.5, 1, 2 and 4 × the limit
// asked, 1 s and 5 s reports.
//
// Scenarios: steady demand; at 60 s the top and bottom Envoys swap demands
// (shift); at 60 s floodgate's server (the first replica) is closed and
// replaced (restart), or, of the replicas, the first one's streams are cut
// and it is replaced without a last round on Redis (crash).
//
// Run it from the bench module:
//
//	cd bench && go run ./cmd/rlqs          # writes results/rlqs.json and docs/benchmarks/rlqs.md
//	cd bench && go run ./cmd/rlqs -quick   # 5 Envoys, 30 s; writes to $TMPDIR/floodgate-rlqs-quick
//	cd bench && go run ./cmd/rlqs -render results/rlqs.json   # the page again, from the results
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Config is one experiment's settings.
type Config struct {
	Envoys    int       `json:"envoys"`
	Seconds   float64   `json:"seconds"`
	EventAt   float64   `json:"event_at_s"`
	Skew      float64   `json:"zipf_s"`
	Demand    float64   `json:"demand"` // the fleet's, ÷ limit
	Intervals []float64 `json:"intervals_s"`
	Variants  []string  `json:"variants"`
	Scenarios []string  `json:"scenarios"`
	Sweep     *Sweep    `json:"sweep,omitempty"`
}

// Sweep is the grid of operating points run at steady demand beside the
// experiment: every variant at every fleet size, demand and interval.
type Sweep struct {
	Envoys    []int     `json:"envoys"`
	Demands   []float64 `json:"demands"` // the fleet's, ÷ limit
	Intervals []float64 `json:"intervals_s"`
	Variants  []string  `json:"variants"`
	Seconds   float64   `json:"seconds"`
}

// fullConfig is issue 45's experiment.
func fullConfig() Config {
	return Config{Envoys: 20, Seconds: 120, EventAt: 60, Skew: 1.1, Demand: 2, Intervals: []float64{1, 5},
		Variants: []string{vFloodgate, vReplicas, vStatic, vEven, vRLS}, Scenarios: []string{sSteady, sShift, sRestart, sCrash},
		Sweep: &Sweep{Envoys: []int{5, 20, 100}, Demands: []float64{0.5, 1, 2, 4}, Intervals: []float64{1, 5},
			Variants: []string{vFloodgate, vReplicas}, Seconds: 60}}
}

// quickConfig checks the pipeline in seconds.
func quickConfig() Config {
	c := fullConfig()
	c.Envoys, c.Seconds, c.EventAt, c.Intervals, c.Sweep = 5, 30, 20, []float64{1}, nil
	return c
}

// Results is a run's record; the page renders from it alone.
type Results struct {
	Date    string    `json:"date"`
	Command string    `json:"command"`
	Elapsed float64   `json:"elapsed_s"`
	Machine string    `json:"machine"`
	Version string    `json:"version"`
	Limit   int       `json:"limit"`
	Config  Config    `json:"config"`
	Results []*Result `json:"results"`
	Sweep   []*Cell   `json:"sweep,omitempty"`
	Checks  []Check   `json:"checks"`
}

// runs lists the runs of cfg: the restart is floodgate's alone (and its
// replicas'), the crash its replicas', and RLS, with no reports, runs once.
func (cfg Config) runs() []run {
	var out []run
	for _, v := range cfg.Variants {
		for _, s := range cfg.Scenarios {
			if s == sRestart && v != vFloodgate && v != vReplicas || s == sCrash && v != vReplicas {
				continue
			}
			for j, iv := range cfg.Intervals {
				if v == vRLS && j > 0 {
					break
				}
				r := run{variant: v, scenario: s, envoys: cfg.Envoys, skew: cfg.Skew, demand: cfg.Demand,
					duration: time.Duration(cfg.Seconds * float64(time.Second)), eventAt: time.Duration(cfg.EventAt * float64(time.Second)),
					interval: time.Duration(iv * float64(time.Second))}
				if v == vRLS {
					r.interval = 0
				}
				out = append(out, r)
			}
		}
	}
	return out
}

// experiment runs every run of cfg, one after another.
func experiment(ctx context.Context, cfg Config, logf func(string, ...any)) (*Results, error) {
	started := time.Now()
	res := &Results{Date: started.UTC().Format(time.RFC3339), Limit: limit, Config: cfg,
		Machine: fmt.Sprintf("%d CPUs, %s/%s, %s", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())}
	for _, r := range cfg.runs() {
		t0 := time.Now()
		tr, err := simulate(ctx, r)
		if err != nil {
			return nil, fmt.Errorf("%s %s %v: %w", r.variant, r.scenario, r.interval, err)
		}
		s := summarize(r, zipf(r.envoys, r.skew, r.demand*limit), tr)
		logf("%-9s %-7s %3gs: fleet %.3f–%.3f, sliding %.3f–%.3f, back %.2f s, envoys %.2f–%.2f, %.3f RPC/request (%.1f s)",
			s.Variant, s.Scenario, s.Interval, s.FleetMin, s.FleetMax, s.SlidingMin, s.SlidingMax, s.Back, s.EnvoyMin, s.EnvoyMax, s.RPCs, time.Since(t0).Seconds())
		res.Results = append(res.Results, s)
	}
	if sw := cfg.Sweep; sw != nil {
		for _, v := range sw.Variants {
			for _, iv := range sw.Intervals {
				for _, n := range sw.Envoys {
					for _, d := range sw.Demands {
						r := run{variant: v, scenario: sSteady, envoys: n, skew: cfg.Skew, demand: d,
							duration: time.Duration(sw.Seconds * float64(time.Second)), interval: time.Duration(iv * float64(time.Second))}
						t0 := time.Now()
						tr, err := simulate(ctx, r)
						if err != nil {
							return nil, fmt.Errorf("sweep %s %d Envoys %g× %gs: %w", v, n, d, iv, err)
						}
						c := cell(summarize(r, zipf(n, r.skew, d*limit), tr))
						logf("sweep %-9s %3d Envoys %3g× %gs: admitted ÷ min(asked, limit) %.3f–%.3f (%.1f s)",
							v, n, d, iv, c.Min, c.Max, time.Since(t0).Seconds())
						res.Sweep = append(res.Sweep, c)
					}
				}
			}
		}
	}
	res.Checks = checks(res.Results, cfg.Envoys, cfg.Demand)
	if len(res.Sweep) > 0 {
		res.Checks = append(res.Checks, sweepCheck(res.Sweep))
	}
	res.Elapsed = math2(time.Since(started).Seconds())
	return res, nil
}

func math2(v float64) float64 { return float64(int(v*10+0.5)) / 10 }

func main() {
	quick := flag.Bool("quick", false, "5 Envoys, 30 s, 1 s reports: checks the pipeline")
	out := flag.String("out", "", "results file (default results/rlqs.json; $TMPDIR/floodgate-rlqs-quick/rlqs.json with -quick)")
	pagePath := flag.String("page", "", "page (default ../docs/benchmarks/rlqs.md; beside -out with -quick)")
	render := flag.String("render", "", "render the page from this results file and exit")
	flag.Parse()
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	if err := mainErr(*quick, *out, *pagePath, *render, logf); err != nil {
		fmt.Fprintln(os.Stderr, "rlqs:", err)
		os.Exit(1)
	}
}

func mainErr(quick bool, out, pagePath, render string, logf func(string, ...any)) error {
	if pagePath == "" {
		pagePath = "../docs/benchmarks/rlqs.md"
	}
	if render != "" {
		res, err := readResults(render)
		if err != nil {
			return err
		}
		return writePage(res, pagePath)
	}
	cfg, cmd := fullConfig(), "cd bench && go run ./cmd/rlqs"
	if quick {
		cfg, cmd = quickConfig(), cmd+" -quick"
		dir := filepath.Join(os.TempDir(), "floodgate-rlqs-quick")
		if out == "" {
			out = filepath.Join(dir, "rlqs.json")
		}
		if pagePath == "../docs/benchmarks/rlqs.md" {
			pagePath = filepath.Join(filepath.Dir(out), "rlqs.md")
		}
	}
	if out == "" {
		out = "results/rlqs.json"
	}
	defer stopRedis()
	res, err := experiment(context.Background(), cfg, logf)
	if err != nil {
		return err
	}
	res.Command, res.Version = cmd, version()
	for _, c := range res.Checks {
		logf("%s %s: %s", c.Mark(), c.Target, c.Value)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, append(b, '\n'), 0o644); err != nil {
		return err
	}
	logf("wrote %s", out)
	return writePage(res, pagePath)
}

func readResults(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var res Results
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &res, nil
}

// version is the working tree's commit, "+dirty" when it has changes.
func version() string {
	b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	v := strings.TrimSpace(string(b))
	if st, err := exec.Command("git", "status", "--porcelain", "--", "../rls").Output(); err == nil && len(st) > 0 {
		v += "+dirty"
	}
	return v
}
