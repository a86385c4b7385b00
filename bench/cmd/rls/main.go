// Command rls measures floodgate's rate-limit service for Envoy beside
// envoyproxy/ratelimit, the reference implementation, and beside a null
// server that answers OK without deciding, the transport's floor. Every
// server speaks envoy.service.ratelimit.v3.RateLimitService over loopback
// gRPC, reads the same configuration (envoyproxy/ratelimit's YAML, one
// file per domain) and is driven by the same grpc-go client, on
// go-control-plane's stubs, with the same mix of descriptors. The variants:
//
//	null              answers OK to every descriptor without deciding
//	floodgate-memory  floodgate-rls, buckets in memory
//	floodgate-redis   floodgate-rls -redis, batched, with leases
//	ratelimit         envoyproxy/ratelimit (service_cmd) on the same Redis
//
// Run it from the bench module:
//
//	cd bench && go run ./cmd/rls          # about 7 minutes; as root it pins with taskset
//	cd bench && go run ./cmd/rls -quick   # a few seconds a variant; writes to $TMPDIR/floodgate-rls-quick
//	cd bench && go run ./cmd/rls -render results/rls.json
//
// It measures, for each variant: decisions per CPU-second of the server
// and of its redis-server together, with N closed-loop callers (-callers,
// 8), as long as their p99 stays within 5 ms (else with fewer callers,
// halving until it does), in rounds that take the variants in turn; the
// latency at half of each variant's saturation, under open-loop Poisson
// arrivals; and what each admitted per descriptor over a minute against
// the configured limit, with one replica and with three behind one Redis,
// through a steady overload and across a window edge. It writes the
// results' summary as JSON (-out) and a markdown page (-md), rendered from
// the summary with report.md.tmpl; -render re-renders the page from saved
// results.
//
// It starts and stops everything itself: a redis-server on a free loopback
// port (internal/redistest), the null server (this program re-executed,
// "rls null ..."), floodgate-rls (built from the repository's rls module)
// and envoyproxy/ratelimit's service_cmd, which it installs with go install
// at a pinned version into a cache directory when it is missing. Where
// taskset and two CPUs are available, the driver pins itself to CPU 1 and
// every server, and redis-server, to CPU 0.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/floodgate-go/floodgate/bench/internal/rlsproc"
)

// Variant names, in report order.
const (
	vNull      = "null"
	vMemory    = "floodgate-memory"
	vRedis     = "floodgate-redis"
	vRatelimit = "ratelimit"
)

var allVariants = []string{vNull, vMemory, vRedis, vRatelimit}

var variantTitles = map[string]string{
	vNull:      "null server: OK without deciding (grpc-go + go-control-plane)",
	vMemory:    "floodgate-rls, in memory",
	vRedis:     "floodgate-rls, Redis with batching and leases",
	vRatelimit: "envoyproxy/ratelimit, Redis",
}

// Targets, as ratios of a variant's decisions per CPU-second to the null
// server's, and the latency within which saturation is measured.
const (
	targetMemory   = 0.85
	targetRedis    = 0.75
	targetP99      = 5 * time.Millisecond
	targetAccuracy = 0.01 // floodgate's admitted count against its allowance
)

// Config is one experiment's settings.
type Config struct {
	Quick    bool     `json:"quick"`
	Variants []string `json:"variants"`
	// Callers is the closed-loop callers the saturation starts with;
	// Conns the connections they share, per server.
	Callers int `json:"callers"`
	Conns   int `json:"conns"`
	// Rounds of the saturation measurement: each takes every variant in
	// turn, so that a drift of the machine falls on all of them, each
	// round starting one variant later.
	Rounds  int           `json:"rounds"`
	Warm    time.Duration `json:"warm"`
	Measure time.Duration `json:"measure"`
	// OpenMeasure is the open-loop measurement at half the saturation.
	OpenMeasure time.Duration `json:"open_measure"`
	// Accuracy runs the accuracy phase; Perf the saturation and latency.
	Accuracy bool `json:"accuracy"`
	Perf     bool `json:"perf"`
	Pin      bool `json:"pin"`
	// Lease is floodgate-rls's -lease in the Redis variant; 0 is off.
	Lease time.Duration `json:"lease"`
	Seed  uint64        `json:"seed"`

	// Binaries and sources, resolved at start (see binaries.go).
	Floodgate string                           `json:"-"` // floodgate-rls binary, or "" to build it
	Ratelimit string                           `json:"-"` // service_cmd, "" to find or install it, "off"
	Exe       []string                         `json:"-"` // the null server: this program by default
	Log       func(format string, args ...any) `json:"-"`
}

func (cfg *Config) logf(format string, args ...any) {
	if cfg.Log != nil {
		cfg.Log(format, args...)
	}
}

// defaults fills what a full or quick run leaves unset.
func (cfg *Config) defaults() {
	if cfg.Callers <= 0 {
		cfg.Callers = 8
	}
	if cfg.Conns <= 0 {
		cfg.Conns = min(cfg.Callers, 4)
	}
	if cfg.Quick {
		cfg.Rounds = max(cfg.Rounds, 1)
		cfg.Warm = or(cfg.Warm, 300*time.Millisecond)
		cfg.Measure = or(cfg.Measure, 1500*time.Millisecond)
		cfg.OpenMeasure = or(cfg.OpenMeasure, 1500*time.Millisecond)
	} else {
		if cfg.Rounds <= 0 {
			cfg.Rounds = 5
		}
		cfg.Warm = or(cfg.Warm, 2*time.Second)
		cfg.Measure = or(cfg.Measure, 10*time.Second)
		cfg.OpenMeasure = or(cfg.OpenMeasure, 15*time.Second)
	}
}

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Results is everything a run produced; the page renders from it alone.
type Results struct {
	Date      string     `json:"date"`
	Command   string     `json:"command"`
	Elapsed   float64    `json:"elapsed_s"`
	Config    Config     `json:"config"`
	Machine   Machine    `json:"machine"`
	Isolation Isolation  `json:"isolation"`
	Mix       MixSummary `json:"mix"`
	// Versions says what each variant ran: a commit, a module version.
	Versions map[string]string `json:"versions"`
	// Unavailable says why a variant asked for did not run.
	Unavailable map[string]string `json:"unavailable,omitempty"`
	// Env is envoyproxy/ratelimit's environment, its settings.
	Env []string `json:"ratelimit_env,omitempty"`
	// Saturation holds each round's closed-loop measurement of each
	// variant; Latency the open-loop one at half the saturation.
	Saturation []Measurement `json:"saturation"`
	Latency    []Measurement `json:"latency"`
	Accuracy   *Accuracy     `json:"accuracy,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs    int    `json:"cpus"`
	Model   string `json:"model"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	Kernel  string `json:"kernel"`
	Redis   string `json:"redis"`
	LoadAvg string `json:"loadavg_start"`
	LoadEnd string `json:"loadavg_end"`
}

// subcommand returns the hidden subcommand of args, if any: "null", the
// null server.
func subcommand(args []string) (string, func([]string) error, bool) {
	if len(args) >= 2 && args[1] == "null" {
		return args[1], nullMain, true
	}
	return "", nil, false
}

func main() {
	if sub, run, ok := subcommand(os.Args); ok {
		if err := run(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "rls %s: %v\n", sub, err)
			os.Exit(1)
		}
		return
	}
	cfg := Config{}
	flag.BoolVar(&cfg.Quick, "quick", false, "a few seconds per variant: checks the pipeline, measures nothing")
	variants := flag.String("variants", "", "comma-separated variants: "+strings.Join(allVariants, ", ")+" (default: all that can run here)")
	flag.IntVar(&cfg.Callers, "callers", 8, "closed-loop callers at saturation (halved while their p99 exceeds 5 ms)")
	flag.IntVar(&cfg.Conns, "conns", 0, "gRPC connections per server the callers share (default: min(callers, 4))")
	flag.IntVar(&cfg.Rounds, "rounds", 0, "rounds of the saturation measurement (default 5, 1 with -quick)")
	flag.DurationVar(&cfg.Measure, "measure", 0, "each closed-loop measurement (default 10s, 1.5s with -quick)")
	flag.DurationVar(&cfg.OpenMeasure, "open-measure", 0, "each open-loop measurement (default 15s, 1.5s with -quick)")
	flag.DurationVar(&cfg.Lease, "lease", time.Second, "floodgate-rls -lease in the Redis variant (0: off)")
	flag.BoolVar(&cfg.Pin, "pin", true, "pin the servers and the driver to different CPUs with taskset")
	flag.BoolVar(&cfg.Perf, "perf", true, "measure saturation and latency")
	flag.BoolVar(&cfg.Accuracy, "accuracy", true, "measure what each admits per descriptor (a minute, 1 and 3 replicas; a few seconds with -quick)")
	flag.StringVar(&cfg.Floodgate, "floodgate", "", "the floodgate-rls binary (default: built from the repository's rls module)")
	flag.StringVar(&cfg.Ratelimit, "ratelimit", "", "envoyproxy/ratelimit's service_cmd binary, or off (default: from the cache directory, installed there with go install when missing)")
	out := flag.String("out", "results/rls.json", "the results' summary (JSON); with -quick, a temporary directory unless set")
	md := flag.String("md", "../docs/benchmarks/rls.md", "the page; with -quick, a temporary directory unless set")
	render := flag.String("render", "", "re-render the page from these results without running")
	flag.Parse()

	if *render != "" {
		res, err := readResults(*render)
		if err == nil {
			err = writeReport(res, *md)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "rls:", err)
			os.Exit(1)
		}
		return
	}
	if cfg.Quick {
		set := map[string]bool{}
		flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
		dir := filepath.Join(os.TempDir(), "floodgate-rls-quick")
		if !set["out"] {
			*out = filepath.Join(dir, "rls.json")
		}
		if !set["md"] {
			*md = filepath.Join(dir, "rls.md")
		}
	}
	if cfg.Pin {
		pinSelf(driverCPU)
	}
	if *variants != "" {
		cfg.Variants = strings.Split(*variants, ",")
		for _, v := range cfg.Variants {
			if !slices.Contains(allVariants, v) {
				fmt.Fprintf(os.Stderr, "rls: unknown variant %q (known: %s)\n", v, strings.Join(allVariants, ", "))
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
		fmt.Fprintln(os.Stderr, "rls:", err)
		os.Exit(1)
	}
	res.Command = strings.TrimSpace("cd bench && go run ./cmd/rls " + strings.Join(os.Args[1:], " "))
	if err := writeResults(res, *out); err != nil {
		fmt.Fprintln(os.Stderr, "rls:", err)
		os.Exit(1)
	}
	if err := writeReport(res, *md); err != nil {
		fmt.Fprintln(os.Stderr, "rls:", err)
		os.Exit(1)
	}
	cfg.logf("wrote %s and %s", *out, *md)
}

// errSkip marks a variant that cannot run here, with the reason.
var errSkip = rlsproc.ErrUnavailable
