// Command churn measures how well a fleet of rate-limit-service replicas
// keeps one shared limit while the fleet's membership changes: replicas
// start together, scale out and in, die, roll, lose their Redis, or take
// all the load alone. It runs two variants side by side on one
// redis-server, with one configuration (a single descriptor, 200 per
// second):
//
//	floodgate  floodgate-rls -redis -lease on, built from the working tree's rls module
//	ratelimit  envoyproxy/ratelimit's service_cmd, installed with go install into a cache directory
//
// Twelve closed-loop callers, spread round-robin over the live replicas,
// ask for the descriptor back to back, far above twice the limit, and log
// the receipt time of every OK; the load starts on a whole wall-clock
// second. The scenarios (times for a full run; -quick divides them by
// three, each run rounded to whole seconds):
//
//	start          3 replicas started together, 10 s
//	scale          3, then 6 at 6 s, then 2 at 12 s (SIGTERM, newest first), 18 s
//	kill           3; at 6 s one is killed (SIGKILL) and replaced at once, 14 s
//	rolling        3; at 4, 8 and 12 s one is replaced (start new, SIGTERM old), 18 s
//	redis-restart  3; at 6 s redis-server is killed and restarted empty on its port, 14 s
//	skew           3, every caller on the first, 8 s
//
// Run it from the bench module:
//
//	cd bench && go run ./cmd/churn                   # about 3 minutes; writes results/churn.json and docs/benchmarks/churn.md
//	cd bench && go run ./cmd/churn -quick            # about a minute; writes to $TMPDIR/floodgate-churn-quick
//	cd bench && go run ./cmd/churn -variants ratelimit
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/floodgate-go/floodgate/bench/internal/rlsproc"
	"github.com/floodgate-go/floodgate/internal/redistest"
)

var variants = []string{"floodgate", "ratelimit"}

// Config is one experiment's settings.
type Config struct {
	Variants  []string `json:"variants"`
	Scenarios []string `json:"scenarios"`
	// Scale multiplies every scenario's times: 1 for a full run.
	Scale   float64 `json:"scale"`
	Callers int     `json:"callers"`
	// The binaries: "" finds or builds them (lab.go).
	Floodgate string               `json:"-"`
	Ratelimit string               `json:"-"`
	Log       func(string, ...any) `json:"-"`
}

// Results is a run's summary; the page renders from it alone.
type Results struct {
	Date     string    `json:"date"`
	Command  string    `json:"command"`
	Elapsed  float64   `json:"elapsed_s"`
	Config   Config    `json:"config"`
	Rate     int       `json:"rate"`
	Burst    int       `json:"burst"`
	Machine  string    `json:"machine"`
	Versions []string  `json:"versions"`
	Results  []*Result `json:"results"`
}

// experiment runs every scenario asked for, each variant in turn within
// it, so that a drift of the machine falls on both.
func experiment(ctx context.Context, cfg Config) (*Results, error) {
	started := time.Now()
	res := &Results{Date: started.UTC().Format(time.RFC3339), Config: cfg, Rate: rate, Burst: burst,
		Machine: fmt.Sprintf("%d CPUs, %s/%s, %s", runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())}
	var fg, rl string
	var err error
	if slices.Contains(cfg.Variants, "floodgate") {
		var v string
		if fg, v, err = floodgateBinary(ctx, cfg.Floodgate, cfg.Log); err != nil {
			return nil, err
		}
		res.Versions = append(res.Versions, "floodgate: "+v)
	}
	if slices.Contains(cfg.Variants, "ratelimit") {
		if rl, err = ratelimitBinary(ctx, cfg.Ratelimit, cfg.Log); err != nil {
			return nil, err
		}
		res.Versions = append(res.Versions, "ratelimit: "+rlsproc.RatelimitModule+"@"+rlsproc.RatelimitVersion)
	}
	l, err := newLab(fg, rl)
	if err != nil {
		return nil, err
	}
	defer l.close()
	if v, err := redistest.Do(l.redis.Addr, "INFO", "server"); err == nil {
		for _, line := range strings.Split(v, "\n") {
			if after, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				res.Versions = append(res.Versions, "redis-server: "+after)
			}
		}
	}
	for _, sc := range scenarios {
		if !slices.Contains(cfg.Scenarios, sc.Name) {
			continue
		}
		sc = sc.scaled(cfg.Scale)
		for _, v := range cfg.Variants {
			r, err := l.runScenario(ctx, v, sc, cfg.Callers)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", v, sc.Name, err)
			}
			cfg.Log("%-9s %-13s admitted %5d  max 1 s %.2f×rate  %g s %.3f×  share %.3f  steady %.3f  to 95%% %.2f s  errors %d",
				v, sc.Name, r.Admitted, float64(r.Max1s)/rate, r.Long, float64(r.MaxLong)/(rate*r.Long), r.Share, r.Steady, r.To95, r.Errors)
			res.Results = append(res.Results, r)
		}
	}
	res.Elapsed = time.Since(started).Seconds()
	return res, nil
}

func main() {
	cfg := Config{Log: func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
	}}
	quick := flag.Bool("quick", false, "divide every time by three (and write to a temporary directory unless -out or -md is set)")
	flag.Float64Var(&cfg.Scale, "scale", 1, "multiply every scenario's times by this")
	vs := flag.String("variants", strings.Join(variants, ","), "comma-separated variants: "+strings.Join(variants, ", "))
	var names []string
	for _, sc := range scenarios {
		names = append(names, sc.Name)
	}
	scs := flag.String("scenarios", strings.Join(names, ","), "comma-separated scenarios")
	flag.IntVar(&cfg.Callers, "callers", 12, "closed-loop callers")
	flag.StringVar(&cfg.Floodgate, "floodgate", "", "the floodgate-rls binary (default: built from the repository's rls module)")
	flag.StringVar(&cfg.Ratelimit, "ratelimit", "", "envoyproxy/ratelimit's service_cmd (default: cached, installed when missing)")
	out := flag.String("out", "results/churn.json", "the results (JSON)")
	md := flag.String("md", "../docs/benchmarks/churn.md", "the page")
	flag.Parse()
	cfg.Variants, cfg.Scenarios = strings.Split(*vs, ","), strings.Split(*scs, ",")
	if bad := unknown(cfg.Variants, variants); bad != "" {
		fail(fmt.Errorf("unknown variant %q", bad))
	}
	if bad := unknown(cfg.Scenarios, names); bad != "" {
		fail(fmt.Errorf("unknown scenario %q", bad))
	}
	if *quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		dir := filepath.Join(os.TempDir(), "floodgate-churn-quick")
		if !set["scale"] {
			cfg.Scale = 1.0 / 3
		}
		if !set["out"] {
			*out = filepath.Join(dir, "churn.json")
		}
		if !set["md"] {
			*md = filepath.Join(dir, "churn.md")
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := experiment(ctx, cfg)
	if err != nil {
		fail(err)
	}
	res.Command = strings.TrimSpace("cd bench && go run ./cmd/churn " + strings.Join(os.Args[1:], " "))
	b, err := json.MarshalIndent(res, "", "  ")
	if err == nil {
		err = errors.Join(os.MkdirAll(filepath.Dir(*out), 0o755), os.MkdirAll(filepath.Dir(*md), 0o755))
	}
	if err == nil {
		err = errors.Join(os.WriteFile(*out, append(b, '\n'), 0o644), os.WriteFile(*md, []byte(page(res)), 0o644))
	}
	if err != nil {
		fail(err)
	}
	cfg.Log("wrote %s and %s in %.0f s", *out, *md, res.Elapsed)
}

func unknown(got, known []string) string {
	for _, g := range got {
		if !slices.Contains(known, g) {
			return g
		}
	}
	return ""
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "churn:", err)
	os.Exit(1)
}
